"""Every file a comment or docstring of src/ points to exists in the checkout.

A reference is a path under docs/, tests/, examples/, sql/, src/, bench/, models/,
scripts/ or tools/ ending in a file extension, or a top-level README.md or
DESIGN.md; web addresses are not references to the checkout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"https?://\S+")
REFERENCE = re.compile(
    r"(?<![\w./-])((?:docs|tests|examples|sql|src|bench|models|scripts|tools)/[\w./-]*\w\.(?:md|py|toml|sql|txt|csv|yml|ini)"
    r"|(?:README|DESIGN)\.md)\b")
SOURCES = sorted(p for p in (ROOT / "src").rglob("*") if p.suffix in (".py", ".toml") and p.is_file())


def references(path: Path) -> list[tuple[int, str]]:
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in REFERENCE.finditer(URL.sub("", line)):
            found.append((n, m.group(1)))
    return found


def test_the_scan_finds_references():
    assert ("docs/smtp-classification.md" in {r for p in SOURCES for _, r in references(p)})


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_referenced_file_exists(path):
    missing = [f"line {n}: {ref}" for n, ref in references(path)
               if not (ROOT / ref).exists() and not (ROOT / "src" / "mailq_db" / ref).exists()]
    assert not missing, f"{path.relative_to(ROOT)} points to files that do not exist: {missing}"
