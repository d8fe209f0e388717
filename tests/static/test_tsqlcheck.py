"""(g) Microsoft's own T-SQL parser and DacFx model validation (docs/static-proof.md).

* every .sql file under sql/ and alembic/frozen/, and the rendered upgrade,
  queue-only (-x broker=off) and downgrade scripts, parse with ScriptDom's
  TSql150Parser (SQL Server 2019 syntax) with zero errors;
* the whole schema (sql/, in BuildOrder.txt order) builds into a DacFx Sql150
  model with zero messages, apart from unresolved references to the objects
  of tools/tsqlcheck/allowlist.txt (sys.* and Alembic's version table, which
  DacFx cannot see without master.dacpac);
* the queue-only schema builds into a DacFx SqlAzure model (Azure SQL
  Database) with zero messages on the same terms;
* the model preprocessing (IF guards unwrapped, CREATE OR ALTER given as
  CREATE, run-time statements skipped) is shown on samples and on the schema;
* each check bites: a column typo, an EXEC parameter the callee lacks, a
  Service Broker object in the Azure model, SQL Server 2022-only syntax.

The tool needs Mono and the mssql-cli 1.0.0 wheel (.ci/run installs both);
where they cannot be had, every test that runs it skips with ONE reason, and
fails instead when MAILQ_REQUIRE_TSQLCHECK=1.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from mailq_db import deployment as d
from mailq_db.devtools import tsqlcheck as t
from mailq_db.devtools.scripts import render

ROOT = Path(__file__).resolve().parents[2]
SQL_FILES = sorted((ROOT / "sql").rglob("*.sql")) + sorted((ROOT / "alembic/frozen").rglob("*.sql"))
SCRIPTS = {
    "upgrade": ("upgrade", "head", ()),
    "upgrade-queue-only": ("upgrade", "head", ("broker=off",)),
    "downgrade": ("downgrade", "head:base", ()),
    "downgrade-queue-only": ("downgrade", "head:base", ("broker=off",)),
}


def _tool_needed() -> None:
    _, reason = t.tool_or_reason(ROOT)
    if reason is None:
        return
    if os.environ.get(t.REQUIRE_ENV) == "1":
        pytest.fail(f"{t.REQUIRE_ENV}=1 but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def tool():
    _tool_needed()


def schema_files(root: Path = ROOT, queue_only: bool = False) -> list[Path]:
    files = d.build_order(root)
    if queue_only:
        files = [rel for rel in files if not rel.startswith(d.BROKER_PREFIX)]
    return [d.sql_dir(root) / rel for rel in files]


def problems_of(records: list[dict]) -> list[str]:
    problems, _ = t.classify(records, t.allowlist(ROOT), t.table_texts(schema_files(ROOT)))
    return [t.describe_problem(p) for p in problems]


# -- parse: every file and every rendered script ------------------------------


@pytest.fixture(scope="module")
def parsed(tool):
    return t.parse(SQL_FILES, ROOT)


def test_there_are_files_to_parse():
    assert len([p for p in SQL_FILES if "frozen" in p.parts]) > 40
    assert len([p for p in SQL_FILES if "frozen" not in p.parts]) > 40


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_file_parses_with_tsql150parser(parsed, path):
    assert parsed[str(path)] == []


def sqlcmd_commands_as_comments(script: str) -> str:
    """The script with its SQLCMD commands (``:on error exit``, ``:setvar``) turned into comments,
    line for line. They are sqlcmd's, not T-SQL: ScriptDom parses T-SQL only (SSDT hands its
    scripts to sqlcmd's preprocessor first). ``$(var)`` references stand inside string literals."""
    return re.sub(r"^(\s*):(?=[a-z]+\b)", r"\1-- sqlcmd :", script, flags=re.M | re.I)


def test_sqlcmd_commands_become_comments_line_for_line():
    script = ":on error exit\n:setvar X \"1\"\nGO\nSELECT ':keep';\n"
    assert sqlcmd_commands_as_comments(script) == (
        "-- sqlcmd :on error exit\n-- sqlcmd :setvar X \"1\"\nGO\nSELECT ':keep';\n")


@pytest.fixture(scope="module")
def rendered(tool, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rendered")
    paths = {}
    for name, (command, revision, x_args) in SCRIPTS.items():
        paths[name] = folder / f"{name}.sql"
        paths[name].write_text(sqlcmd_commands_as_comments(render(command, revision, x_args)), encoding="utf-8")
    return paths


@pytest.mark.parametrize("name", SCRIPTS)
def test_rendered_script_parses_with_tsql150parser(rendered, name):
    records = t.run(["parse", str(rendered[name])], ROOT)
    assert records[0]["errors"] == []
    assert records[0]["batches"] > 10  # GO-separated batches, read by ScriptDom itself


def test_rendered_scripts_carry_no_generated_marker(rendered):
    for path in rendered.values():
        assert d.GENERATED_MARKER not in path.read_text(encoding="utf-8"), path.name


# -- the DacFx models -----------------------------------------------------------


@pytest.fixture(scope="module")
def sql150(tool):
    return t.model("Sql150", schema_files(), ROOT)


@pytest.fixture(scope="module")
def azure(tool):
    return t.model("SqlAzure", schema_files(queue_only=True), ROOT)


def _summary(records: list[dict]) -> dict:
    return next(r for r in records if r["kind"] == "summary")


def test_whole_schema_builds_into_a_sql150_model(sql150):
    assert problems_of(sql150) == []
    summary = _summary(sql150)
    assert summary["files"] == len(d.build_order(ROOT))
    assert summary["objects"] > 100  # tables, columns, constraints, modules, broker objects, grants


def test_queue_only_schema_builds_into_an_azure_sql_database_model(azure):
    assert problems_of(azure) == []
    assert _summary(azure)["objects"] > 50


def test_every_object_of_sql_is_in_the_model(sql150):
    """No definition is lost in preprocessing: every file that creates an object
    gives the model at least one statement."""
    kept = {Path(r["source"]) for r in sql150 if r["kind"] == "statement"}
    for path in schema_files():
        if d.describe(path.read_text(encoding="utf-8")).kind != "script":
            assert path in kept, path


def test_allowlist_is_short_reviewed_and_used(sql150, azure):
    allowed = t.allowlist(ROOT)
    assert 0 < len(allowed) <= 25
    for entry in allowed.values():
        assert entry.name.startswith("sys.") or entry.name == f"dbo.{d.VERSION_TABLE}", entry.name
        assert entry.why, f"{entry.name}: say why the project reads it"
    _, used150 = t.classify(sql150, allowed)
    _, used_azure = t.classify(azure, allowed)
    assert sorted(set(allowed) - used150 - used_azure) == [], "remove allow-list entries no module uses"


# -- preprocessing for the model: samples ------------------------------------------


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


GUARDED_TABLE = """\
/* header */
IF OBJECT_ID(N'mailq.T', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.T (ID INT NOT NULL CONSTRAINT PK_T PRIMARY KEY);
    INSERT INTO mailq.Log (Item) VALUES (N'created');
    IF COL_LENGTH(N'mailq.T', N'X') IS NULL
    BEGIN
        CREATE INDEX IX_T ON mailq.T (ID);
    END;
END;
ELSE
BEGIN
    ALTER TABLE mailq.T ADD ID INT NULL;
END;
"""

CREATE_OR_ALTER = """\
-- a comment that says CREATE OR ALTER PROCEDURE
CREATE OR ALTER PROCEDURE mailq.P
AS
BEGIN
    SELECT N'CREATE OR ALTER VIEW x' AS Text;
END;
"""

TOP_LEVEL_WORK = """\
DECLARE @Msg NVARCHAR(100);
SET @Msg = N'x';
IF @Msg IS NULL
    THROW 50400, @Msg, 1;
INSERT INTO mailq.Log (Item) VALUES (@Msg);
EXEC sys.sp_executesql N'SELECT 1';
PRINT @Msg;
GRANT EXECUTE ON mailq.P TO MailqAdmin;
"""


def test_if_guard_is_unwrapped_and_its_else_branch_skipped(tool, tmp_path):
    records = t.preprocess([_write(tmp_path, "t.sql", GUARDED_TABLE)], ROOT)
    kept = [(r["type"], r["line"]) for r in records if r["kind"] == "statement"]
    skipped = [(r["type"], r["line"]) for r in records if r["kind"] == "skipped"]
    assert kept == [("CreateTableStatement", 4), ("CreateIndexStatement", 8)]
    assert skipped == [("InsertStatement", 5), ("BeginEndBlockStatement", 12)]
    else_record = next(r for r in records if r["kind"] == "skipped" and r["line"] == 12)
    assert "ELSE" in else_record["why"]


def test_create_or_alter_is_given_as_create_in_place(tool, tmp_path):
    path = _write(tmp_path, "p.sql", CREATE_OR_ALTER)
    (record,) = [r for r in t.preprocess([path], ROOT) if r["kind"] == "statement"]
    assert record["type"] == "CreateOrAlterProcedureStatement"
    assert record["line"] == 2
    text = record["text"]
    assert re.match(r"CREATE {10}PROCEDURE mailq\.P\n", text)  # OR ALTER blanked: offsets unchanged
    assert len(text) == len(CREATE_OR_ALTER.split("\n", 1)[1].rstrip("\n"))
    assert "N'CREATE OR ALTER VIEW x'" in text  # a string literal is never touched


def test_top_level_work_is_skipped_and_grants_kept(tool, tmp_path):
    records = t.preprocess([_write(tmp_path, "w.sql", TOP_LEVEL_WORK)], ROOT)
    assert [r["type"] for r in records if r["kind"] == "statement"] == ["GrantStatement"]
    assert [r["type"] for r in records if r["kind"] == "skipped"] == [
        "DeclareVariableStatement", "SetVariableStatement", "ThrowStatement", "InsertStatement",
        "ExecuteStatement", "PrintStatement",
    ]


def test_schema_preprocessing_skips_only_run_time_work(sql150):
    """On the real schema, nothing that defines an object is ever skipped: only top-level
    run-time work (DML, THROW, DECLARE/SET, EXEC, PRINT: seed rows, dynamic SQL, guards),
    DROP INDEX, and ELSE branches of IF guards (they adopt an existing object)."""
    skipped = {(r["type"], r["why"]) for r in sql150 if r["kind"] == "skipped"}
    run_time = {"DeclareVariableStatement", "SetVariableStatement", "ThrowStatement", "InsertStatement",
                "UpdateStatement", "DeleteStatement", "SelectStatement", "PrintStatement",
                "ExecuteStatement", "DropIndexStatement"}
    for kind, why in skipped:
        assert kind in run_time or "ELSE" in why, (kind, why)
    kept = {r["type"] for r in sql150 if r["kind"] == "statement"}
    assert {"CreateTableStatement", "CreateOrAlterProcedureStatement", "CreateQueueStatement",
            "GrantStatement"} <= kept


# -- it bites: failing samples ------------------------------------------------------


def _break(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"sample text not found in {path.name}: {old!r}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


MODEL_SAMPLES = [
    # (file, original, broken, words the expected message holds).  All defects
    # go into ONE copy of the schema, built into ONE model (a model costs
    # seconds); each sample is asserted on its own message, which names the
    # broken element.
    ("procedures/mailq.ClaimMail.sql", "q.VisibleAtUtc <= @Now", "q.VisibleAtUtx <= @Now",
     ("SQL71501", "[mailq].[ClaimMail]", "VisibleAtUtx")),
    ("procedures/mailq.ClaimMail.sql", "INSERT INTO mailq.MailAttempt (MailID, AttemptNo,",
     "INSERT INTO mailq.MailAttempt (MailID, AttemptNumber,", ("[mailq].[MailAttempt].[AttemptNumber]",)),
    ("procedures/mailq.MarkSent.sql", "            inserted.AttemptCount,\n            inserted.AppName,\n",
     "            inserted.Attempts,\n            inserted.AppName,\n", ("[mailq].[MailQueue].[Attempts]",)),
    ("functions/mailq.EnqueueMailCheck.sql", "FROM mailq.SendingAccount AS s\n",
     "FROM mailq.SendingAccounts AS s\n", ("[mailq].[SendingAccounts]",)),
    ("procedures/mailq.ReleaseMail.sql", "@IDList = @IDList, @LockToken = @LockToken;",
     "@IDLst = @IDList, @LockToken = @LockToken;", ("[mailq].[LockLeasedMail].[@IDLst]",)),
    ("views/mailq.RecentFailures.sql", "t.ErrorText AS LastError", "t.ErrorTxt AS LastError",
     ("[mailq].[RecentFailures]", "ErrorTxt")),
    ("procedures/mailq.GetInstallationHealth.sql", "mailq_alembic_version", "alembic_version",
     ("[dbo].[alembic_version]",)),
    # The claim's per-pair seeks (competing and isolated) are validated too.
    ("procedures/mailq.ClaimMail.sql", "                        k.VisibleAtUtc,\n",
     "                        k.VisibleAtUtz,\n", ("[mailq].[ClaimMail]", "VisibleAtUtz")),
    ("procedures/mailq.ClaimMail.sql",
     "INDEX (IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, UPDLOCK, ROWLOCK\n"
     "                    )\n                    WHERE\n                        k.AccountName = d.AccountName",
     "INDEX (IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, UPDLOCK, ROWLOCK\n"
     "                    )\n                    WHERE\n                        k.AccountNam = d.AccountName",
     ("[mailq].[ClaimMail]", "AccountNam]")),
    ("procedures/mailq.GetQueueStats.sql", "AND q.DateProcessed >= @FinishedSince",
     "AND q.DateProcesed >= @FinishedSince", ("[mailq].[GetQueueStats]", "DateProcesed")),
]
#: A view on a sys object that is not in the allow-list.
UNLISTED_SYS_VIEW = ("views/mailq.WaitCount.sql",
                     "CREATE OR ALTER VIEW mailq.WaitCount\nAS\nSELECT COUNT_BIG(*) AS Waits\n"
                     "FROM sys.dm_os_wait_stats;\n")
#: A Service Broker object among the queue-only files.
BROKER_IN_QUEUE = ("tables/mailq.NotifyQueue.sql", "CREATE QUEUE mailq.NotifyQueue;\n")


@pytest.fixture(scope="module")
def broken_copy(tmp_path_factory) -> list[Path]:
    """The queue-only schema files of a copy of sql/ with every defect of MODEL_SAMPLES."""
    root = tmp_path_factory.mktemp("broken")
    shutil.copytree(d.sql_dir(ROOT), root / "sql")
    for rel, old, new, _ in MODEL_SAMPLES:
        _break(root / "sql" / rel, old, new)
    extra = root / "sql" / UNLISTED_SYS_VIEW[0]
    extra.write_text(UNLISTED_SYS_VIEW[1], encoding="utf-8")
    return schema_files(root, queue_only=True) + [extra]


@pytest.fixture(scope="module")
def broken_sql150(tool, broken_copy):
    return problems_of(t.model("Sql150", broken_copy, ROOT))


@pytest.mark.parametrize("rel,old,new,expected", MODEL_SAMPLES, ids=[s[2].split()[-1] for s in MODEL_SAMPLES])
def test_sql150_model_finds_a_broken_reference(broken_sql150, rel, old, new, expected):
    assert any(all(w.lower() in p.lower() for w in expected) for p in broken_sql150), broken_sql150


def test_a_sys_object_outside_the_allowlist_is_a_problem(broken_sql150):
    assert any("[mailq].[WaitCount]" in p and "[sys].[dm_os_wait_stats]" in p for p in broken_sql150)


def test_every_problem_of_the_broken_copy_is_one_of_the_samples(broken_sql150):
    """The samples are caught for their own defect, not by noise."""
    elements = {"[mailq].[ClaimMail]", "[mailq].[MarkSent]", "[mailq].[EnqueueMailCheck]", "[mailq].[ReleaseMail]",
                "[mailq].[RecentFailures]", "[mailq].[GetInstallationHealth]", "[mailq].[WaitCount]",
                "[mailq].[GetQueueStats]"}
    for problem in broken_sql150:
        assert any(e in problem for e in elements), problem


def test_azure_model_refuses_a_service_broker_object(tool, tmp_path):
    shutil.copytree(d.sql_dir(ROOT), tmp_path / "sql")
    queue = tmp_path / "sql" / BROKER_IN_QUEUE[0]
    queue.write_text(BROKER_IN_QUEUE[1], encoding="utf-8")
    problems = problems_of(t.model("SqlAzure", schema_files(tmp_path, queue_only=True) + [queue], ROOT))
    assert any("SQL71626" in p and "[mailq].[NotifyQueue]" in p for p in problems), problems
    assert all("[mailq].[NotifyQueue]" in p for p in problems), problems


#: SQL Server 2022-only syntax (the target is 2019 and later).  TSql150Parser
#: refuses the new grammar; the new built-in table and date functions reach
#: DacFx as unresolved names.  GREATEST/LEAST and the bit functions look like
#: any function call to both tools: the project's own check
#: (mailq_db.devtools.versions, tests/static/test_sql_versions.py) covers them.
PARSE_2022 = {
    "is-distinct-from": "SELECT 1 AS x WHERE @a IS DISTINCT FROM @b;",
    "is-not-distinct-from": "SELECT 1 AS x WHERE @a IS NOT DISTINCT FROM @b;",
    "window-clause": "SELECT ROW_NUMBER() OVER w AS r FROM mailq.MailQueue WINDOW w AS (ORDER BY ID);",
    "json-object": "SELECT JSON_OBJECT('a':1) AS j;",
}
MODEL_2022 = {
    "GenerateSeries": ("SELECT value FROM GENERATE_SERIES(1, 10);", "[GENERATE_SERIES]"),
    "DateBucket": ("SELECT DATE_BUCKET(DAY, 1, SYSUTCDATETIME()) AS b;", "column DAY"),
    "Datetrunc": ("SELECT DATETRUNC(day, SYSUTCDATETIME()) AS d;", "column day"),
    "StringSplitOrdinal": ("SELECT ordinal FROM STRING_SPLIT(N'a,b', N',', 1);", "column ordinal"),
}
#: 2022-only built-ins that pass ScriptDom and DacFx: mailq_db.devtools.versions' job.
PASS_2022 = ("GREATEST", "LEAST", "BIT_COUNT")


def _procedure(body: str, name: str = "Sample2022") -> str:
    return f"CREATE OR ALTER PROCEDURE dbo.{name} @a INT = 0, @b INT = 0\nAS\nBEGIN\n    {body}\nEND;\n"


@pytest.fixture(scope="module")
def samples_2022(tool, tmp_path_factory):
    """(parse errors by name, model problems) of one procedure per 2022 sample, in one model."""
    folder = tmp_path_factory.mktemp("sql2022")
    bodies = {**{k: v for k, v in PARSE_2022.items()}, **{k: v[0] for k, v in MODEL_2022.items()},
              **{k: f"SELECT {k}(1, 2) AS x;" for k in PASS_2022}}
    paths = {}
    for name, body in bodies.items():
        paths[name] = _write(folder, f"{name}.sql", _procedure(body, "Sample_" + name.replace("-", "_")))
    parsed = t.parse(list(paths.values()), ROOT)
    errors = {name: parsed[str(path)] for name, path in paths.items()}
    modelled = [paths[name] for name in [*MODEL_2022, *PASS_2022]]
    return errors, problems_of(t.model("Sql150", modelled, ROOT))


@pytest.mark.parametrize("name", PARSE_2022)
def test_tsql150parser_refuses_sql_server_2022_syntax(samples_2022, name):
    errors, _ = samples_2022
    assert errors[name] and errors[name][0]["line"] == 4, errors[name]


@pytest.mark.parametrize("name", MODEL_2022)
def test_sql150_model_refuses_sql_server_2022_functions(samples_2022, name):
    errors, problems = samples_2022
    assert errors[name] == []  # the grammar accepts it ...
    mine = [p for p in problems if f"[dbo].[Sample_{name}]" in p]
    assert any(MODEL_2022[name][1].lower() in p.lower() for p in mine), problems  # ... the model does not


@pytest.mark.parametrize("name", PASS_2022)
def test_2022_functions_microsoft_tools_let_through_are_the_project_checks(samples_2022, name):
    """One authority per question: these pass ScriptDom and DacFx, so
    mailq_db.devtools.versions must (and does) catch them."""
    from mailq_db.devtools.versions import sql2022_functions

    errors, problems = samples_2022
    assert errors[name] == []
    assert [p for p in problems if f"[dbo].[Sample_{name}]" in p] == []
    assert sql2022_functions(_procedure(f"SELECT {name}(1, 2) AS x;")) == [f"line 4: {name}"]


# -- the message reader (no Mono needed) ----------------------------------------------


def test_referenced_objects_reads_both_message_forms():
    has = ("Error validating element [dbo].[P]: SqlProcedure: [dbo].[P] has an unresolved reference "
           "to object [sys].[sp_getapplock].[@LockMode].")
    assert t.referenced_objects(has) == ["sys.sp_getapplock"]
    anyof = ("Error validating element [delay].[Health]: SqlView: [delay].[Health] contains an unresolved "
             "reference to an object. Either the object does not exist or the reference is ambiguous because "
             "it could refer to any of the following objects: [sys].[databases].[d]::[name], "
             "[mailq].[MailQueue].[d]::[name] or [sys].[databases].[name].")
    assert t.referenced_objects(anyof) == ["sys.databases", "mailq.mailqueue", "sys.databases"]
    assert t.element(anyof) == "[delay].[Health]"


def test_classify_sets_apart_only_wholly_allowlisted_references():
    allowed = {"sys.databases": t.Allowed("sys.databases", "why")}
    sys_only = {"kind": "model", "number": 71502, "severity": "Warning",
                "message": "X has an unresolved reference to object [sys].[databases]."}
    mixed = {"kind": "model", "number": 71501, "severity": "Error",
             "message": "X could refer to any of the following objects: [sys].[databases].[a]::[b] or "
                        "[mailq].[T].[a]::[b]."}
    other = {"kind": "model", "number": 71626, "severity": "Error", "message": "not supported"}
    problems, used = t.classify([sys_only, mixed, other], allowed)
    assert problems == [mixed, other]
    assert used == {"sys.databases"}


def test_classify_dismisses_an_alias_candidate_only_where_the_table_lacks_the_column():
    """delay.Reconcile's CTE over sys.conversation_endpoints: DacFx also offers
    [delay].[Task].[live]::[conversation_handle], a column delay.Task cannot have."""
    allowed = {"sys.conversation_endpoints": t.Allowed("sys.conversation_endpoints", "why")}
    tables = {"delay.task": "CREATE TABLE delay.Task (TaskID BIGINT, ConversationHandle UNIQUEIDENTIFIER);"}
    spurious = {"kind": "model", "number": 71502, "severity": "Warning",
                "message": "X could refer to any of the following objects: [delay].[Task].[live]::[conversation_handle], "
                           "[sys].[conversation_endpoints].[conversation_handle] or "
                           "[sys].[conversation_endpoints].[e]::[conversation_handle]."}
    real = {"kind": "model", "number": 71502, "severity": "Warning",
            "message": "X could refer to any of the following objects: [delay].[Task].[t]::[TaskID] or "
                       "[sys].[conversation_endpoints].[TaskID]."}
    problems, used = t.classify([spurious, real], allowed, tables)
    assert problems == [real]
    assert used == {"sys.conversation_endpoints"}
    assert t.classify([spurious], allowed)[0] == [spurious]  # without the tables, nothing is dismissed
