"""`mailq-db bounces parse FILE --json` against real-world and project-written delivery reports.

* ../shared/corpora/bounces/ (52 messages from real mail software, labels and
  rules in its README): read from the checkout's sibling, never copied here;
  the parser must agree with at least 95 % of them on kind, recipients and
  status (the README's comparison rules).
* tests/corpus/bounces/ (the project's own: DSNs the realmta lab's Postfix
  produced, and messages written in documented formats the shared corpus
  lacks, each citing its source in labels.tsv): every one must agree.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from mailq_db.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: ../shared beside the checkout (CI); MAILQ_SHARED_DIR names it where the
#: checkout is a worktree elsewhere.
SHARED = Path(os.environ.get("MAILQ_SHARED_DIR") or ROOT.parent / "shared") / "corpora" / "bounces"
OWN = ROOT / "tests" / "corpus" / "bounces"
THRESHOLD = 0.95


def parse_json(path: Path, capsys) -> dict:
    assert main(["bounces", "parse", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def disagreements(row: dict[str, str], got: dict) -> list[str]:
    """The README's rule: kind equal; recipient set equal (a|b either, ?a optional,
    lower-cased, duplicates collapsed); each status contains the labelled code."""
    problems = []
    if got["kind"] != row["kind"]:
        problems.append(f"kind {got['kind']} != {row['kind']}")
    labels = [x for x in row["recipients"].split(",") if x]
    if not labels:
        return problems
    statuses = row["status"].split(",") if row["status"] else []
    by_address = {r["address"]: r for r in got["recipients"]}
    matched = set()
    for i, label in enumerate(labels):
        alternatives = label.lstrip("?").split("|")
        hit = [a for a in alternatives if a in by_address]
        if not hit and not label.startswith("?"):
            problems.append(f"missing recipient {label}")
        matched |= set(hit)
        want = statuses[i].split("|") if i < len(statuses) and statuses[i] else []
        if hit and want and not any(by_address[a]["status"] and any(c in by_address[a]["status"] for c in want)
                                    for a in hit):
            problems.append(f"status of {label}: {[by_address[a]['status'] for a in hit]} !~ {want}")
    extra = set(by_address) - matched
    if extra:
        problems.append(f"extra recipients {sorted(extra)}")
    return problems


def labelled(base: Path) -> list[dict[str, str]]:
    with open(base / "labels.tsv", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def agreement(base: Path, capsys) -> tuple[int, list[str]]:
    rows = labelled(base)
    failures = []
    for row in rows:
        problems = disagreements(row, parse_json(base / "messages" / row["file"], capsys))
        if problems:
            failures.append(f"{row['file']}: {'; '.join(problems)}")
    return len(rows), failures


def test_shared_real_world_corpus_agreement_is_at_least_95_percent(capsys):
    if not SHARED.exists():
        pytest.skip(f"{SHARED} is absent: the shared bounce corpus lives in ../shared beside the checkout "
                    "(present in CI)")
    total, failures = agreement(SHARED, capsys)
    agreed = total - len(failures)
    print(f"shared bounce corpus: {agreed}/{total} agree ({agreed / total:.1%})")
    assert total == 52
    assert agreed / total >= THRESHOLD, "\n".join(failures)


def test_own_corpus_agrees_on_every_message(capsys):
    total, failures = agreement(OWN, capsys)
    assert total >= 8
    assert failures == []


def test_own_corpus_cites_a_source_for_every_message():
    for row in labelled(OWN):
        assert (OWN / "messages" / row["file"]).is_file(), row["file"]
        assert row["source"].strip(), f"{row['file']}: no source cited"


def test_parse_prints_a_summary_without_json(capsys, tmp_path):
    msg = tmp_path / "m.eml"
    msg.write_bytes(b"From: a@example.com\r\nSubject: hello\r\n\r\njust a note\r\n")
    assert main(["bounces", "parse", str(msg)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kind: not-bounce") and "(no recipient)" in out


def test_parse_of_a_missing_file_says_so(capsys, tmp_path):
    assert main(["bounces", "parse", str(tmp_path / "nope.eml")]) == 1
    assert "cannot read" in capsys.readouterr().err
