"""docs/dba-guide.md is true where a DBA relies on it (issue 21 point 7): the
roles table lists every grant the deployment makes, the index table every
index it creates (and none it does not), LOCK_ESCALATION is stated for the
tables that have it, and no document tells anyone to install an unpublished
name from PyPI."""

from __future__ import annotations

import re
from pathlib import Path

from mailq_db import deployment as d

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "dba-guide.md").read_text(encoding="utf-8")
_GRANT = re.compile(r"GRANT\s+(\w+)\s+ON\s+(OBJECT|TYPE)::([\w.]+)\s+TO\s+(\w+)", re.I)


def section(title: str) -> str:
    start = GUIDE.index(f"## {title}")
    end = GUIDE.find("\n## ", start + 3)
    return GUIDE[start:] if end < 0 else GUIDE[start:end]


def table_rows(text: str) -> dict[str, str]:
    """First cell (without backticks) -> the whole row, for every row of the tables in ``text``."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and cells:
            rows[cells[0].strip("`")] = line
    return rows


def granted() -> dict[str, set[tuple[str, str]]]:
    """role -> {(permission, object)} over the grant files of the build order."""
    out: dict[str, set[tuple[str, str]]] = {}
    for rel in d.build_order(ROOT):
        text = d.strip_comments((d.sql_dir(ROOT) / rel).read_text(encoding="utf-8"))
        for perm, _, obj, role in _GRANT.findall(text):
            out.setdefault(role, set()).add((perm.upper(), obj))
    return out


def documented(row: str) -> set[tuple[str, str]]:
    """(permission, object) pairs of a roles-table row: each backticked name
    counts under the last EXECUTE or SELECT written before it."""
    grants_cell = row.strip().strip("|").split("|")[1]
    pairs, perm = set(), None
    for token in re.finditer(r"\b(EXECUTE|SELECT)\b|`([\w.]+)`", grants_cell):
        if token.group(1):
            perm = token.group(1)
        elif perm:
            pairs.add((perm, token.group(2)))
    return pairs


def test_every_role_is_documented_with_every_grant():
    rows = table_rows(section("3. Roles"))
    roles = {d.describe((d.sql_dir(ROOT) / rel).read_text(encoding="utf-8")).name
             for rel in d.build_order(ROOT) if rel.endswith(".role.sql")}
    assert set(rows) == roles, (sorted(rows), sorted(roles))
    words = "One Two Three Four Five Six Seven Eight Nine Ten Eleven Twelve".split()
    assert f"{words[len(roles) - 1]} roles, `AUTHORIZATION dbo`" in section("3. Roles")  # the count stated
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(f"`{role}`" in readme for role in roles), "README.md names every role"
    for role, grants in granted().items():
        assert documented(rows[role]) == grants, role


def test_the_allow_list_is_db_owners():
    text = section("3. Roles")
    assert "`delay.AllowProcedure`" in text and "belong to `db_owner`" in text
    assert ("EXECUTE", "delay.AllowProcedure") not in granted().get("MailqAdmin", set())


def test_the_index_table_lists_every_index_and_no_other():
    rows = table_rows(section("7. Tables and indexes"))
    indexes = set()
    for rel in d.build_order(ROOT):
        obj = d.describe((d.sql_dir(ROOT) / rel).read_text(encoding="utf-8"))
        if obj.kind == "index":
            indexes.add(f"{obj.parent}.{obj.name}")
    assert set(rows) == indexes


def test_lock_escalation_is_stated_for_the_tables_that_disable_it():
    text = section("7. Tables and indexes")
    # Every file of the build order: the broker's tables (delay.Task, delay.Log) too.
    disabled = sorted(rel.split("/")[-1][:-4] for rel in d.build_order(ROOT)
                      if "LOCK_ESCALATION = DISABLE" in (d.sql_dir(ROOT) / rel).read_text(encoding="utf-8")
                      and d.describe((d.sql_dir(ROOT) / rel).read_text(encoding="utf-8")).kind == "table")
    assert disabled == ["delay.Log", "delay.Task", "mailq.MailAttachment", "mailq.MailEvent", "mailq.MailQueue"]
    for table in disabled:
        assert f"`{table}`" in text.split("Table options a DBA must know")[1].split("**Your own")[0]
    notes = section("8. Operating notes for DBAs")
    assert "Lock escalation is disabled" in notes
    assert all(f"`{table}`" in notes for table in disabled)


def test_no_document_installs_the_unpublished_name():
    """`pip install mailq-db` installs whatever someone publishes under that
    name: mailq-db is installed from a checkout or a wheel built from it."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = re.compile(r"pip3?\s+install\s+(?:-\S+\s+)*mailq[-_]db\b(?![-\w./])", re.I)
    found = [f"{p.relative_to(ROOT)}:{i}" for p in docs
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if bad.search(line)]
    assert found == []
    assert "pip wheel" in section("0. Getting `mailq-db`")


def test_dev_golden_leaves_the_guide_in_step():
    from mailq_db.commands.dev import sync_dba_guide

    assert sync_dba_guide(GUIDE, ROOT) == GUIDE, "run `mailq-db dev golden`"


def test_dev_golden_follows_a_new_grant_and_a_new_index(tmp_path):
    """A helper's new procedure grant and index reach the guide with the one
    regeneration command, and the checks above then hold for it."""
    import shutil

    from mailq_db.commands.dev import sync_dba_guide

    shutil.copytree(ROOT / "sql", tmp_path / "sql")
    (tmp_path / "sql/indexes/mailq.MailQueue.IX_MailQueue_New.sql").write_text(
        "/*\nIX_MailQueue_New: serves mailq.Report.\n*/\nCREATE NONCLUSTERED INDEX IX_MailQueue_New "
        "ON mailq.MailQueue (dtStamp);\n", encoding="utf-8")
    grants = tmp_path / "sql/security/MailqSender.grants.sql"
    grants.write_text(grants.read_text(encoding="utf-8") + "GRANT EXECUTE ON OBJECT::mailq.Report TO MailqSender;\n",
                      encoding="utf-8")
    order = tmp_path / "sql/BuildOrder.txt"
    order.write_text(order.read_text(encoding="utf-8") + "indexes/mailq.MailQueue.IX_MailQueue_New.sql\n",
                     encoding="utf-8")
    synced = sync_dba_guide(GUIDE, tmp_path)
    roles = table_rows(synced[synced.index("## 3. Roles"):synced.index("## 4.")])
    assert ("EXECUTE", "mailq.Report") in documented(roles["MailqSender"])
    indexes = table_rows(synced[synced.index("## 7. Tables and indexes"):synced.index("## 8.")])
    assert "IX_MailQueue_New: serves mailq.Report." in indexes["mailq.MailQueue.IX_MailQueue_New"]
    assert sync_dba_guide(synced, tmp_path) == synced


def test_every_granted_procedure_states_its_isolation_level():
    """A DBA reviews the contract of what a role may call: each procedure granted
    to a role says in its header which isolation level it runs at."""
    granted_procedures = {obj for grants in granted().values() for perm, obj in grants if perm == "EXECUTE"}
    missing = []
    for rel in d.build_order(ROOT):
        text = (d.sql_dir(ROOT) / rel).read_text(encoding="utf-8")
        obj = d.describe(text)
        if obj.kind == "procedure" and obj.name in granted_procedures:
            header = text[:text.index("*/")] if text.startswith("/*") else ""
            if "Isolation" not in header:
                missing.append(obj.name)
    assert missing == []
