"""Every shell command in the documentation runs, or says why it cannot here.

The rule (README.md and docs/*.md):

* Fenced blocks tagged ``bash``, ``sh``, ``shell`` or ``console`` hold
  commands.  In ``console`` blocks only lines starting with ``$ `` are
  commands (the rest is their output); in the others every line is, except
  blank lines and ``#`` comments.  A line ending in ``\\`` continues on the
  next one; a here-document (``<<EOF``) runs with its body.
* A command is exempt when its line carries a marker comment naming what it
  needs that a test machine does not have:
  ``# needs SQL Server`` (also written ``# (needs SQL Server)``),
  ``# needs Docker``, ``# needs network``,
  ``# needs root`` or ``# needs systemd``.
  A marker alone on the FIRST line of a block exempts the whole block.
* Commands that run the test suite itself (``.ci/run``, ``pytest``) are
  not run here: the suite is what runs this test.
* Every other command is run by this test with ``bash -o pipefail`` in a
  scratch directory that mirrors the repository's top level (so relative
  paths such as ``models/`` and ``alembic.ini`` work and nothing is written
  into the checkout), one block's commands in order in one directory, and
  must exit 0 within the time limit.  ``mailq-db``, ``alembic`` and
  ``python`` are the ones of the interpreter running pytest.

A failure names the document, the line and the command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"#\s*\(?needs (SQL Server|Docker|network|root|systemd)\b")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
TIMEOUT_SECONDS = 300
#: Commands that run the test suite itself (it is what runs this test).
SELF = re.compile(r"(^|[\s;&|])(\.ci/run|(python3? -m )?pytest)\b")


@dataclass
class Command:
    doc: str
    line: int
    text: str
    exempt: str | None  # the marker's reason, or None: must run


@dataclass
class Block:
    doc: str
    line: int
    commands: list[Command]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks_of(path: Path) -> list[Block]:
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, tag = m.group(2), m.group(3).lower()
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
            j += 1
        if tag in SHELL_TAGS:
            blocks.append(Block(rel, start + 1, _commands(rel, start, lines[start:j], tag)))
        i = j + 1
    return blocks


def _commands(doc: str, offset: int, body: list[str], tag: str) -> list[Command]:
    block_marker = None
    first = next((ln for ln in body if ln.strip()), "")
    if first.strip().startswith("#") and MARKER.search(first):
        block_marker = MARKER.search(first).group(1)
    commands: list[Command] = []
    k = 0
    while k < len(body):
        raw = body[k]
        lineno = offset + k + 1
        k += 1
        text = raw.strip()
        if tag == "console":
            if not text.startswith("$ "):
                continue
            text = text[2:]
        if not text or text.startswith("#"):
            continue
        parts = [text]
        while parts[-1].endswith("\\") and k < len(body):
            nxt = body[k].strip()
            if tag == "console" and nxt.startswith("> "):
                nxt = nxt[2:]
            parts.append(nxt)
            k += 1
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", " ".join(parts))
        if heredoc:
            end = heredoc.group(1)
            while k < len(body):
                parts.append(body[k])
                k += 1
                if body[k - 1].strip() == end:
                    break
            command = "\n".join(parts)
        else:
            command = "\n".join(parts)
        marker = MARKER.search(command)
        commands.append(Command(doc, lineno, command, block_marker or (marker.group(1) if marker else None)))
    return commands


ALL_BLOCKS = [block for doc in DOCS if doc.exists() for block in _blocks_of(doc)]


def _scratch(tmp_path: Path) -> Path:
    """A directory that mirrors the repository's top level through symlinks."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv"} or entry.name.startswith(".pytest"):
            continue
        (work / entry.name).symlink_to(entry)
    return work


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.pop("MAILQ_DB_URL", None)  # a doc command never reaches a real server here
    return env


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_documented_commands_run(block: Block, tmp_path: Path) -> None:
    to_run = [c for c in block.commands if c.exempt is None]
    if not to_run:
        pytest.skip(f"{block.id}: every command is marked as needing "
                    f"{sorted({c.exempt for c in block.commands if c.exempt})}")
    work = _scratch(tmp_path)
    env = _env()
    for command in to_run:
        if SELF.search(command.text):
            continue  # runs the test suite, i.e. this test: never recursively
        if re.match(r"(sudo\s+)?(apt-get|apt|pip|pip3|python -m pip)\s+install\b", command.text):
            pytest.fail(f"{command.doc}:{command.line}: `{command.text}` installs software; "
                        "mark it `# needs network` (or `# needs root`)")
        try:
            result = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command.text],
                cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command.doc}:{command.line}: `{command.text}` ran over {TIMEOUT_SECONDS}s")
        assert result.returncode == 0, (
            f"{command.doc}:{command.line}: `{command.text}` exited {result.returncode}; "
            f"run it, or mark it `# needs SQL Server` (or Docker/network/root/systemd) if it "
            f"cannot run without one.\nstdout: {result.stdout[-1500:]}\nstderr: {result.stderr[-1500:]}"
        )


def test_docs_have_runnable_commands() -> None:
    """The rule is not satisfied vacuously: some documented commands do run."""
    runnable = [c for b in ALL_BLOCKS for c in b.commands if c.exempt is None]
    assert runnable, "no documented command is run by the tests"


def test_parser_follows_the_rule() -> None:
    sample = [
        "# needs SQL Server",
        "mailq-db deploy --url x",
    ]
    assert all(c.exempt == "SQL Server" for c in _commands("x.md", 0, sample, "bash"))
    mixed = ["mailq-db --help", "mailq-db stats  # needs SQL Server", "spin -V \\", "  --x"]
    cmds = _commands("x.md", 0, mixed, "bash")
    assert [(c.text, c.exempt) for c in cmds] == [
        ("mailq-db --help", None),
        ("mailq-db stats  # needs SQL Server", "SQL Server"),
        ("spin -V \\\n--x", None),
    ]
    console = ["$ mailq-db --version", "mailq-db 0.1.0"]
    assert [c.text for c in _commands("x.md", 0, console, "console")] == ["mailq-db --version"]
