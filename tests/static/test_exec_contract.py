"""(d) Every EXEC the Python layer sends names a procedure defined in sql/, only
its parameters, and every parameter that has no default; every EXEC inside a
sql/ module passes every required parameter of its callee (the one EXEC
question DacFx leaves open: docs/static-proof.md)."""

from __future__ import annotations

from pathlib import Path

from mailq_db.devtools.contract import check_source, check_sql, check_sql_tree, check_tree, procedures

ROOT = Path(__file__).resolve().parents[2]


def test_every_exec_in_src_matches_a_procedure():
    problems, checked = check_tree(ROOT / "src", ROOT / "sql")
    assert problems == []
    assert checked >= 14  # one per public procedure wrapper at least


def test_every_public_mail_procedure_has_a_wrapper():
    source = (ROOT / "src/mailq_db/procedures.py").read_text(encoding="utf-8")
    internal = {"mailq.lockleasedmail", "mailq.renderdbmailquery", "mailq.hookdispatchertask",
                "mailq.enqueuemailrows",
                "mailq.applysuppressions",  # granted to no role: reached by ownership chaining
                "mailq.checkbouncereport", "mailq.checkdbmailrequest", "mailq.checkclaimrequest"}  # checks split from their callers
    public = {name for name in procedures(ROOT / "sql") if name.startswith("mailq.")} - internal
    missing = [name for name in sorted(public) if f"EXEC {name}".lower() not in source.lower()]
    assert missing == []


def _procs():
    return {"mailq.claimmail": {"@batchsize": True, "@locktoken": False, "@leaseseconds": True}}


def test_unknown_procedure_is_reported():
    problems = check_source('SQL = "EXEC mailq.ClaimMails @BatchSize = ?;"\n', "x.py", _procs())
    assert problems and "no such procedure" in problems[0]


def test_unknown_parameter_is_reported():
    source = 'SQL = "EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @Lease = ?;"\n'
    problems = check_source(source, "x.py", _procs())
    assert any("@lease is not a parameter" in p for p in problems)


def test_missing_required_parameter_is_reported():
    problems = check_source('SQL = "EXEC mailq.ClaimMail @BatchSize = ?;"\n', "x.py", _procs())
    assert any("required @locktoken" in p for p in problems)


def test_exec_built_with_an_fstring_is_reported():
    problems = check_source('name = "x"\nSQL = f"EXEC mailq.{name} @A = ?"\n', "x.py", _procs())
    assert any("f-string" in p for p in problems)


def test_correct_exec_passes():
    source = 'SQL = "EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?;"\n'
    assert check_source(source, "x.py", _procs()) == []


# -- EXEC inside sql/ modules: required parameters ------------------------------


def test_every_exec_in_sql_passes_the_required_parameters():
    problems, checked = check_sql_tree(ROOT / "sql")
    assert problems == []
    assert checked >= 10  # ReleaseMail -> LockLeasedMail, delay.RunDueTasks -> delay.RunTask, ...


def test_module_exec_missing_a_required_parameter_is_reported(sql_copy):
    path = sql_copy / "procedures/mailq.ReleaseMail.sql"
    text = path.read_text(encoding="utf-8")
    old = "@IDList = @IDList, @LockToken = @LockToken;"
    assert old in text
    path.write_text(text.replace(old, "@IDList = @IDList;", 1), encoding="utf-8")
    problems, _ = check_sql_tree(sql_copy)
    assert any("mailq.ReleaseMail.sql" in p and "required @locktoken" in p for p in problems), problems


def test_module_exec_reads_code_only():
    procs = {"delay.finishtask": {"@taskid": False, "@taskstate": False}}
    assert check_sql("-- EXEC delay.FinishTask @TaskID = 1;\nSELECT N'EXEC delay.FinishTask';\n", "x.sql", procs) == []
    sql = "SET @x = 1;\nEXEC @rc = delay.FinishTask @TaskID = @TaskID;\n"
    assert check_sql(sql, "x.sql", procs) == ["x.sql:2: EXEC delay.FinishTask: required @taskstate is not passed"]
