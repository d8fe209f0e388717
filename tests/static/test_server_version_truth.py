"""Issue 10, point 9: one truth about the SQL Server versions mailq-db runs on.

mailq.CheckServer stops the deployment below SQL Server 2019 (major version
15) outside Azure; no document may promise an older version.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLD = re.compile(r"SQL\s+Server\s+(2005|2008|2012|2014|2016|2017)\b|\b2016\s+SP1\b", re.I)


def test_check_server_requires_2019():
    text = (ROOT / "sql/checks/mailq.CheckServer.sql").read_text(encoding="utf-8")
    assert "@MajorVersion < 15" in text and "SQL Server 2019" in text


def test_no_document_promises_an_older_server():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in docs
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OLD.search(line)]
    assert offenders == []


def test_the_check_catches_an_old_promise():
    assert OLD.search("runs on SQL Server 2016 SP1 or later")
    assert not OLD.search("SQL Server 2019 or later")
