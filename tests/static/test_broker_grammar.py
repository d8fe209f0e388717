"""The sqlfluff plugin `sqlfluff_tsql_broker` teaches the tsql dialect Service Broker.

Every test here goes through sqlfluff's own entry-point loading (no explicit
import of the plugin), so a passing run also proves the registration in
pyproject.toml. The project must be installed (`pip install -e .`).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest
import sqlfluff
from sqlfluff.core import FluffConfig, Linter
from sqlfluff.core.parser import BaseSegment

# -- helpers -----------------------------------------------------------------


def parse(sql: str) -> BaseSegment:
    """Parse T-SQL with the configured dialect; the tree, parse errors included."""
    parsed = Linter(dialect="tsql").parse_string(sql)
    assert parsed.tree is not None
    return parsed.tree


def unparsable(tree: BaseSegment) -> list[str]:
    return [seg.raw for seg in tree.recursive_crawl("unparsable")]


def assert_parses(sql: str, *types: str) -> BaseSegment:
    """No unparsable section, and each of `types` occurs in the tree."""
    tree = parse(sql)
    assert unparsable(tree) == [], tree.stringify()
    for seg_type in types:
        assert any(
            tree.recursive_crawl(seg_type)
        ), f"{seg_type} missing:\n{tree.stringify()}"
    return tree


def in_procedure(body: str) -> str:
    return (
        "CREATE OR ALTER PROCEDURE dbo.BrokerTest\n"
        "AS\nBEGIN\n"
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\nEND;\n"
    )


# -- every documented form, with the segment type it produces ---------------

FORMS = [
    # CREATE QUEUE
    ("CREATE QUEUE dbo.DelayServiceQueue;", "create_queue_statement"),
    (
        """CREATE QUEUE dbo.DelayServiceQueue
            WITH STATUS = ON,
            RETENTION = OFF,
            ACTIVATION (
                STATUS = ON,
                PROCEDURE_NAME = dbo.ProcessDelayQueue,
                MAX_QUEUE_READERS = 4,
                EXECUTE AS OWNER
            ),
            POISON_MESSAGE_HANDLING (STATUS = ON)
            ON [DEFAULT];""",
        "create_queue_statement",
    ),
    (
        "CREATE QUEUE db.dbo.q WITH ACTIVATION (PROCEDURE_NAME = p, "
        "MAX_QUEUE_READERS = 1, EXECUTE AS N'broker_user') ON fg_broker;",
        "create_queue_statement",
    ),
    (
        "CREATE QUEUE q WITH ACTIVATION (PROCEDURE_NAME = p, MAX_QUEUE_READERS = 0, "
        "EXECUTE AS SELF);",
        "create_queue_statement",
    ),
    # [ , ] marks the commas between queue options as optional.
    (
        "CREATE QUEUE q WITH STATUS = OFF RETENTION = ON, POISON_MESSAGE_HANDLING ();",
        "create_queue_statement",
    ),
    # ALTER QUEUE
    ("ALTER QUEUE dbo.q WITH ACTIVATION (DROP);", "alter_queue_statement"),
    ("ALTER QUEUE dbo.q WITH STATUS = OFF;", "alter_queue_statement"),
    (
        "ALTER QUEUE dbo.q WITH RETENTION = OFF, ACTIVATION (MAX_QUEUE_READERS = 2 "
        "EXECUTE AS SELF), POISON_MESSAGE_HANDLING (STATUS = OFF);",
        "alter_queue_statement",
    ),
    ("ALTER QUEUE dbo.q WITH ACTIVATION (STATUS = OFF);", "alter_queue_statement"),
    ("ALTER QUEUE dbo.q REBUILD;", "alter_queue_statement"),
    ("ALTER QUEUE dbo.q REBUILD WITH (MAXDOP = 2);", "alter_queue_statement"),
    ("ALTER QUEUE dbo.q REORGANIZE;", "alter_queue_statement"),
    (
        "ALTER QUEUE dbo.q REORGANIZE WITH (LOB_COMPACTION = ON);",
        "alter_queue_statement",
    ),
    ("ALTER QUEUE dbo.q MOVE TO fg_broker;", "alter_queue_statement"),
    ('ALTER QUEUE dbo.q MOVE TO "default";', "alter_queue_statement"),
    ("ALTER QUEUE dbo.q MOVE TO [DEFAULT];", "alter_queue_statement"),
    # CREATE / ALTER SERVICE
    (
        "CREATE SERVICE [//mailq-db/DelayExecution/Service]\n"
        "    ON QUEUE dbo.DelayServiceQueue ([//mailq-db/DelayExecution/Contract]);",
        "create_service_statement",
    ),
    (
        "CREATE SERVICE [//x/Target] AUTHORIZATION dbo ON QUEUE q ([//x/Contract], [DEFAULT]);",
        "create_service_statement",
    ),
    ("CREATE SERVICE InitiatorService ON QUEUE dbo.q;", "create_service_statement"),
    (
        "ALTER SERVICE [//x/s] ON QUEUE dbo.q2 (ADD CONTRACT [//x/c2], DROP CONTRACT [//x/c]);",
        "alter_service_statement",
    ),
    # CREATE CONTRACT
    (
        """CREATE CONTRACT [//mailq-db/DelayExecution/Contract]
        (
            [//mailq-db/DelayExecution/Request] SENT BY INITIATOR,
            [//mailq-db/DelayExecution/Reply] SENT BY TARGET,
            [DEFAULT] SENT BY ANY
        );""",
        "create_contract_statement",
    ),
    (
        "CREATE CONTRACT [//x/c] AUTHORIZATION dbo ([//x/m] SENT BY ANY);",
        "create_contract_statement",
    ),
    # CREATE / ALTER MESSAGE TYPE
    (
        "CREATE MESSAGE TYPE [//mailq-db/DelayExecution/Request];",
        "create_message_type_statement",
    ),
    (
        "CREATE MESSAGE TYPE [//x/m] AUTHORIZATION dbo VALIDATION = NONE;",
        "create_message_type_statement",
    ),
    (
        "CREATE MESSAGE TYPE [//x/m] VALIDATION = EMPTY;",
        "create_message_type_statement",
    ),
    (
        "CREATE MESSAGE TYPE [//x/m] VALIDATION = WELL_FORMED_XML;",
        "create_message_type_statement",
    ),
    (
        "CREATE MESSAGE TYPE [//x/m] VALIDATION = VALID_XML WITH SCHEMA COLLECTION dbo.Schemas;",
        "create_message_type_statement",
    ),
    ("ALTER MESSAGE TYPE [//x/m] VALIDATION = EMPTY;", "alter_message_type_statement"),
    # DROP
    ("DROP QUEUE dbo.DelayServiceQueue;", "drop_broker_object_statement"),
    ("DROP SERVICE [//x/s];", "drop_broker_object_statement"),
    ("DROP CONTRACT [//x/c];", "drop_broker_object_statement"),
    ("DROP MESSAGE TYPE [//x/m];", "drop_broker_object_statement"),
    # BEGIN DIALOG [CONVERSATION]
    (
        """BEGIN DIALOG CONVERSATION @Handle
            FROM SERVICE [//mailq-db/DelayExecution/Service]
            TO SERVICE N'//mailq-db/DelayExecution/Service', 'CURRENT DATABASE'
            ON CONTRACT [//mailq-db/DelayExecution/Contract]
            WITH ENCRYPTION = OFF;""",
        "begin_dialog_statement",
    ),
    ("BEGIN DIALOG @h FROM SERVICE s TO SERVICE 's';", "begin_dialog_statement"),
    (
        "BEGIN DIALOG @h FROM SERVICE s TO SERVICE N's', "
        "N'a326e034-d4cf-4e8b-8d98-4d7e1926c904' ON CONTRACT [DEFAULT];",
        "begin_dialog_statement",
    ),
    (
        "BEGIN DIALOG @h FROM SERVICE s TO SERVICE 's' "
        "WITH RELATED_CONVERSATION = @Other, LIFETIME = 600, ENCRYPTION = ON;",
        "begin_dialog_statement",
    ),
    (
        "BEGIN DIALOG @h FROM SERVICE s TO SERVICE 's' "
        "WITH RELATED_CONVERSATION_GROUP = @Group LIFETIME = @Seconds;",
        "begin_dialog_statement",
    ),
    # BEGIN CONVERSATION TIMER
    (
        "BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = 120;",
        "begin_conversation_timer_statement",
    ),
    (
        "BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Seconds;",
        "begin_conversation_timer_statement",
    ),
    # SEND
    (
        "SEND ON CONVERSATION @Handle\n"
        "    MESSAGE TYPE [//mailq-db/DelayExecution/Request] (@Body);",
        "send_statement",
    ),
    ("SEND ON CONVERSATION @h;", "send_statement"),
    ("SEND ON CONVERSATION @h (N'body');", "send_statement"),
    (
        "SEND ON CONVERSATION (@h1, @h2) MESSAGE TYPE [//x/m] (CAST(@x AS VARBINARY(MAX)));",
        "send_statement",
    ),
    # RECEIVE
    ("RECEIVE * FROM dbo.q;", "receive_statement"),
    (
        "RECEIVE TOP (1) @h = conversation_handle, @t = message_type_name, "
        "@b = CAST(message_body AS XML) FROM dbo.DelayServiceQueue;",
        "receive_statement",
    ),
    (
        "RECEIVE TOP (@n) conversation_handle, message_body AS body, "
        "kind = message_type_name FROM db.dbo.q INTO @Messages "
        "WHERE conversation_group_id = @Group;",
        "receive_statement",
    ),
    (
        "RECEIVE message_body FROM q WHERE conversation_handle = @h;",
        "receive_statement",
    ),
    # GET CONVERSATION GROUP
    ("GET CONVERSATION GROUP @Group FROM dbo.q;", "get_conversation_group_statement"),
    # WAITFOR ( RECEIVE | GET CONVERSATION GROUP ) [, TIMEOUT n]
    (
        "WAITFOR (RECEIVE TOP (1) @h = conversation_handle, @t = message_type_name, "
        "@b = message_body FROM dbo.DelayServiceQueue), TIMEOUT 5000;",
        "waitfor_statement",
    ),
    ("WAITFOR (RECEIVE * FROM q WHERE conversation_handle = @h);", "waitfor_statement"),
    (
        "WAITFOR (GET CONVERSATION GROUP @g FROM dbo.q), TIMEOUT @Ms;",
        "waitfor_statement",
    ),
    # END CONVERSATION (the dialect already had it; kept here as a regression check)
    ("END CONVERSATION @h;", "end_conversation_statement"),
    ("END CONVERSATION @h WITH CLEANUP;", "end_conversation_statement"),
    (
        "END CONVERSATION @h WITH ERROR = 50300 DESCRIPTION = N'Target failed.';",
        "end_conversation_statement",
    ),
]
FORM_IDS = [f"{i:02d}-{seg_type}" for i, (_, seg_type) in enumerate(FORMS)]


@pytest.mark.parametrize(("sql", "seg_type"), FORMS, ids=FORM_IDS)
def test_form_parses_standalone(sql: str, seg_type: str) -> None:
    tree = assert_parses(textwrap.dedent(sql), seg_type)
    # One statement: the broker statement is the whole of it.
    statements = list(tree.recursive_crawl("statement", recurse_into=False))
    assert len(statements) == 1
    assert statements[0].segments[0].is_type(seg_type)


@pytest.mark.parametrize(("sql", "seg_type"), FORMS, ids=FORM_IDS)
def test_form_parses_inside_procedure(sql: str, seg_type: str) -> None:
    body = (
        "DECLARE @h UNIQUEIDENTIFIER;\n" + textwrap.dedent(sql) + "\nSELECT 1 AS done;"
    )
    tree = assert_parses(in_procedure(body), "create_procedure_statement", seg_type)
    assert any(tree.recursive_crawl("select_statement"))


def test_queue_names_and_keywords_are_typed() -> None:
    tree = assert_parses(
        "CREATE SERVICE [//x/s] ON QUEUE dbo.q ([//x/c]);"
        "SEND ON CONVERSATION @h MESSAGE TYPE [//x/m] (@b);"
    )
    assert [s.raw for s in tree.recursive_crawl("queue_reference")] == ["dbo.q"]
    assert [s.raw for s in tree.recursive_crawl("service_reference")] == ["[//x/s]"]
    assert [s.raw for s in tree.recursive_crawl("contract_reference")] == ["[//x/c]"]
    assert [s.raw for s in tree.recursive_crawl("message_type_reference")] == [
        "[//x/m]"
    ]
    keywords = {s.raw for s in tree.recursive_crawl("keyword")}
    assert {"SERVICE", "QUEUE", "SEND", "CONVERSATION", "MESSAGE", "TYPE"} <= keywords


# -- in procedure bodies: transactions, TRY/CATCH, IF branches --------------

ACTIVATION_PROCEDURE = """\
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Handle UNIQUEIDENTIFIER;
    DECLARE @MessageType SYSNAME;
    DECLARE @Body VARBINARY(MAX);

    WHILE 1 = 1
    BEGIN
        BEGIN TRY
            BEGIN TRANSACTION;

            WAITFOR (
                RECEIVE TOP (1)
                    @Handle = conversation_handle,
                    @MessageType = message_type_name,
                    @Body = message_body
                FROM dbo.DelayServiceQueue
            ), TIMEOUT 5000;

            IF @Handle IS NULL
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            IF @MessageType = N'//mailq-db/DelayExecution/Request'
            BEGIN
                BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = 60;
                SEND ON CONVERSATION @Handle
                    MESSAGE TYPE [//mailq-db/DelayExecution/Reply]
                    (@Body);
            END
            ELSE IF @MessageType = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog'
                END CONVERSATION @Handle;
            ELSE
            BEGIN
                WAITFOR (GET CONVERSATION GROUP @Handle FROM dbo.DelayServiceQueue), TIMEOUT 10;
                END CONVERSATION @Handle WITH ERROR = 50300 DESCRIPTION = N'Unexpected message.';
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            END CONVERSATION @Handle WITH CLEANUP;
        END CATCH;
    END;
END;
"""


def test_activation_procedure_parses() -> None:
    tree = assert_parses(
        ACTIVATION_PROCEDURE,
        "create_procedure_statement",
        "try_catch",
        "transaction_statement",
        "waitfor_statement",
        "receive_statement",
        "begin_conversation_timer_statement",
        "send_statement",
        "get_conversation_group_statement",
        "end_conversation_statement",
    )
    assert len(list(tree.recursive_crawl("end_conversation_statement"))) == 3


WAITFOR_RECEIVE = (
    "WAITFOR (RECEIVE TOP (1) @h = conversation_handle, @t = message_type_name, "
    "@b = message_body FROM dbo.DelayServiceQueue), TIMEOUT 5000;"
)


@pytest.mark.parametrize(
    "body",
    [
        f"BEGIN TRANSACTION;\n{WAITFOR_RECEIVE}\nCOMMIT TRANSACTION;",
        f"BEGIN TRAN\n{WAITFOR_RECEIVE}\nCOMMIT",
        f"BEGIN TRY\n    {WAITFOR_RECEIVE}\nEND TRY\nBEGIN CATCH\n    THROW;\nEND CATCH;",
        f"BEGIN TRY\n    BEGIN TRANSACTION;\n    {WAITFOR_RECEIVE}\n    COMMIT;\n"
        "END TRY\nBEGIN CATCH\n    ROLLBACK;\nEND CATCH;",
        f"IF @x = 1\nBEGIN\n    {WAITFOR_RECEIVE}\nEND;",
        f"IF @x = 1\nBEGIN\n    SELECT 1 AS one;\nEND\nELSE\nBEGIN\n    {WAITFOR_RECEIVE}\nEND;",
        f"IF @x = 1\n    {WAITFOR_RECEIVE}\nELSE\n    {WAITFOR_RECEIVE}",
        f"WHILE 1 = 1\nBEGIN\n    {WAITFOR_RECEIVE}\n    IF @@ROWCOUNT = 0 BREAK;\nEND;",
        "BEGIN\n    BEGIN CONVERSATION TIMER (@h) TIMEOUT = 1;\nEND;",
    ],
    ids=[
        "tran",
        "tran-no-semicolons",
        "try",
        "try-tran",
        "if",
        "else",
        "if-else",
        "while",
        "timer-in-block",
    ],
)
def test_waitfor_receive_in_blocks(body: str) -> None:
    assert_parses(in_procedure(body), "create_procedure_statement")


# -- malformed forms are refused --------------------------------------------


@pytest.mark.parametrize(
    ("sql", "bad"),
    [
        # Bad option values.
        (
            "CREATE QUEUE q WITH ACTIVATION (PROCEDURE_NAME = p, "
            "MAX_QUEUE_READERS = 'x', EXECUTE AS OWNER);",
            "MAX_QUEUE_READERS = 'x'",
        ),
        ("CREATE QUEUE q WITH STATUS = MAYBE;", "STATUS = MAYBE"),
        ("ALTER QUEUE q WITH RETENTION = MAYBE;", "RETENTION = MAYBE"),
        ("CREATE QUEUE q WITH ACTIVATION (EXECUTE AS CALLER);", "CALLER"),
        ("CREATE MESSAGE TYPE [//x/m] VALIDATION = XML;", "= XML"),
        (
            "BEGIN DIALOG @h FROM SERVICE s TO SERVICE 's' WITH ENCRYPTION = MAYBE;",
            "ENCRYPTION = MAYBE",
        ),
        (
            "ALTER QUEUE q WITH POISON_MESSAGE_HANDLING ();",
            "POISON_MESSAGE_HANDLING ()",
        ),
        (
            "RECEIVE * FROM q WHERE conversation_handle > @h;",
            "WHERE conversation_handle > @h",
        ),
        # Missing clauses.
        ("BEGIN DIALOG @h TO SERVICE 's';", "BEGIN DIALOG @h TO SERVICE 's'"),
        ("BEGIN DIALOG @h FROM SERVICE s;", "BEGIN DIALOG @h FROM SERVICE s"),
        ("CREATE CONTRACT [//x/c] ([//x/m]);", "CREATE CONTRACT [//x/c] ([//x/m])"),
        ("CREATE CONTRACT [//x/c];", "CREATE CONTRACT [//x/c]"),
        ("BEGIN CONVERSATION TIMER (@h);", "BEGIN CONVERSATION TIMER (@h)"),
        ("CREATE SERVICE s ([//x/c]);", "CREATE SERVICE s ([//x/c])"),
        ("ALTER QUEUE q;", "ALTER QUEUE q"),
        ("GET CONVERSATION GROUP @g;", "GROUP @g"),
        ("RECEIVE TOP 1 * FROM q;", "TOP 1 * FROM q"),
    ],
)
def test_malformed_is_refused(sql: str, bad: str) -> None:
    """An unparsable section that holds the offending text."""
    tree = parse(sql)
    sections = unparsable(tree)
    assert sections, f"accepted: {sql}\n{tree.stringify()}"
    assert any(bad in section for section in sections), sections


# -- nothing that parsed before changes -------------------------------------

PLAIN_TSQL = """\
WAITFOR DELAY '00:00:01';
WAITFOR TIME '22:00';
END CONVERSATION @h;
END CONVERSATION @h WITH CLEANUP;
END CONVERSATION @h WITH ERROR = 1 DESCRIPTION = 'x';
BEGIN TRANSACTION;
BEGIN TRAN Named;
UPDATE dbo.T SET Status = N'Sent' WHERE Id = @Id;
SELECT TOP (1) Id, Status AS status_text FROM dbo.T WITH (READPAST) ORDER BY Id;
IF @x = 1 BEGIN SELECT 1 AS one; END ELSE SELECT 2 AS two;
BEGIN TRY SELECT 1 AS one; END TRY BEGIN CATCH THROW; END CATCH;
COMMIT TRANSACTION;
EXEC dbo.SendMail @To = N'a@example.com';
DROP TABLE dbo.T;
CREATE TABLE dbo.Queue (Id INT, Status NVARCHAR(20), Message NVARCHAR(MAX));
BEGIN
    SELECT 1 AS one;
END;
"""

_BASELINE = """\
import sys
import sqlfluff.core.plugin.host as host
discover = host._discover_plugins
host._discover_plugins = lambda: (p for p in discover() if p[1] != "tsql_broker")
from sqlfluff.core import Linter
tree = Linter(dialect="tsql").parse_string(sys.stdin.read()).tree
assert "sqlfluff_tsql_broker" not in sys.modules
print(tree.stringify(), end="")
"""


def test_plain_tsql_parses_as_before() -> None:
    """The same tree as sqlfluff without the plugin (run in a clean process)."""
    baseline = subprocess.run(
        [sys.executable, "-c", _BASELINE],
        input=PLAIN_TSQL,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tree = assert_parses(PLAIN_TSQL, "waitfor_statement", "end_conversation_statement")
    assert tree.stringify() == baseline


def test_new_words_are_not_added_to_the_keyword_sets() -> None:
    """RF04 reads `unreserved_keywords`: an alias `Status` must stay unflagged."""
    dialect = FluffConfig(overrides={"dialect": "tsql"}).get("dialect_obj")
    assert "STATUS" not in dialect.sets("unreserved_keywords")
    result = sqlfluff.lint(
        "SELECT s.Status AS Status FROM dbo.T AS s;\n", dialect="tsql", rules=["RF04"]
    )
    assert result == []


def test_extend_is_idempotent() -> None:
    from sqlfluff.dialects import dialect_tsql

    from sqlfluff_tsql_broker import extend_tsql

    grammar = dialect_tsql.StatementSegment.match_grammar
    extend_tsql()
    extend_tsql()
    assert dialect_tsql.StatementSegment.match_grammar is grammar


def test_capitalisation_rule_sees_new_keywords() -> None:
    config = FluffConfig(
        configs={
            "rules": {"capitalisation.keywords": {"capitalisation_policy": "upper"}}
        },
        overrides={"dialect": "tsql", "rules": "CP01"},
    )
    fixed = (
        Linter(config=config)
        .lint_string("waitfor (receive top (1) * from dbo.q), timeout 5;\n", fix=True)
        .fix_string()[0]
    )
    assert fixed == "WAITFOR (RECEIVE TOP (1) * FROM dbo.q), TIMEOUT 5;\n"


# -- layout: the usual ways of writing these statements pass the layout rules --

LAID_OUT = """\
CREATE MESSAGE TYPE [//mailq-db/Request]
    VALIDATION = WELL_FORMED_XML;

CREATE CONTRACT [//mailq-db/Contract] (
    [//mailq-db/Request] SENT BY INITIATOR,
    [DEFAULT] SENT BY ANY
);

CREATE CONTRACT [//mailq-db/Contract2]
    AUTHORIZATION dbo ([//mailq-db/Request] SENT BY ANY);

CREATE QUEUE dbo.DelayServiceQueue
    WITH STATUS = ON,
    RETENTION = OFF,
    ACTIVATION (
        STATUS = ON,
        PROCEDURE_NAME = dbo.ProcessDelayQueue,
        MAX_QUEUE_READERS = 4,
        EXECUTE AS OWNER
    ),
    POISON_MESSAGE_HANDLING (STATUS = ON)
    ON [DEFAULT];

ALTER QUEUE dbo.DelayServiceQueue
    WITH ACTIVATION (MAX_QUEUE_READERS = 5);

CREATE SERVICE [//mailq-db/Service]
    ON QUEUE dbo.DelayServiceQueue ([//mailq-db/Contract]);

CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    DECLARE @Handle UNIQUEIDENTIFIER;
    DECLARE @Body VARBINARY(MAX);

    BEGIN TRY
        BEGIN TRANSACTION;

        WAITFOR (
            RECEIVE TOP (1)
                @Handle = conversation_handle,
                @Body = message_body
            FROM dbo.DelayServiceQueue
            WHERE conversation_group_id = @Handle
        ), TIMEOUT 5000;

        BEGIN DIALOG CONVERSATION @Handle
            FROM SERVICE [//mailq-db/Service]
            TO SERVICE N'//mailq-db/Service', N'CURRENT DATABASE'
            ON CONTRACT [//mailq-db/Contract]
            WITH ENCRYPTION = OFF, LIFETIME = 600;

        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = 60;

        SEND ON CONVERSATION @Handle
            MESSAGE TYPE [//mailq-db/Request]
            (@Body);

        WAITFOR (GET CONVERSATION GROUP @Handle FROM dbo.DelayServiceQueue), TIMEOUT 10;

        END CONVERSATION @Handle;

        COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        END CONVERSATION @Handle WITH ERROR = 50300 DESCRIPTION = N'failed';
    END CATCH;
END;
"""


def test_layout_rules_accept_usual_layout() -> None:
    """Indent points follow Microsoft's examples: clauses indented under the verb."""
    rules = [
        "LT01",
        "LT02",
        "LT03",
        "LT04",
        "LT06",
        "LT08",
        "LT09",
        "LT10",
        "LT11",
        "LT12",
        "CP01",
    ]
    violations = sqlfluff.lint(LAID_OUT, dialect="tsql", rules=rules)
    assert violations == []


def test_long_lines_break_between_clauses() -> None:
    fixed = sqlfluff.fix(
        "BEGIN DIALOG @Handle FROM SERVICE [//mailq-db/Service] "
        "TO SERVICE N'//mailq-db/Service' ON CONTRACT [//mailq-db/Contract];\n",
        dialect="tsql",
        rules=["LT05"],
    )
    assert fixed == (
        "BEGIN DIALOG @Handle\n"
        "    FROM SERVICE [//mailq-db/Service]\n"
        "    TO SERVICE N'//mailq-db/Service' ON CONTRACT [//mailq-db/Contract];\n"
    )


# -- the entry point itself: CLI and Python API in fresh processes ----------


def test_entry_point_is_registered() -> None:
    points = importlib.metadata.entry_points(group="sqlfluff")
    assert [p.value for p in points if p.name == "tsql_broker"] == [
        "sqlfluff_tsql_broker.plugin"
    ]


BROKER_FILE = f"""\
CREATE QUEUE dbo.DelayServiceQueue WITH STATUS = ON;
{ACTIVATION_PROCEDURE}"""


@pytest.mark.parametrize("command", ["parse", "lint"])
def test_cli_loads_plugin(tmp_path, command: str) -> None:
    path = tmp_path / "broker.sql"
    path.write_text(BROKER_FILE)
    args = [sys.executable, "-m", "sqlfluff", command, "--dialect", "tsql", str(path)]
    if command == "lint":
        args += ["--rules", "CP01"]  # a rule the file passes; the point is parsing
    # cwd=tmp_path: no project config file can change what is checked.
    run = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "unparsable" not in run.stdout
    if command == "parse":
        for seg_type in (
            "create_queue_statement",
            "receive_statement",
            "send_statement",
        ):
            assert seg_type in run.stdout


def test_python_api_loads_plugin(tmp_path) -> None:
    script = (
        "import sys, sqlfluff\n"
        "tree = sqlfluff.parse(sys.stdin.read(), dialect='tsql')\n"
        "print('sqlfluff_tsql_broker.plugin' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        input=BROKER_FILE,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    # sqlfluff.parse raises APIParsingError on any unparsable section.
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"


@pytest.mark.parametrize("principal", ["OWNER", "SELF", "CALLER", "'dbo'"])
def test_trigger_execute_as_accepts_every_documented_principal(principal: str) -> None:
    tree = assert_parses(
        "CREATE OR ALTER TRIGGER dbo.trg ON dbo.T\n"
        f"WITH EXECUTE AS {principal}\nAFTER INSERT\nAS\nBEGIN\n    SET NOCOUNT ON;\nEND;\n",
        "execute_as_clause",
    )
    assert not unparsable(tree)


def test_trigger_execute_as_refuses_an_unknown_principal() -> None:
    tree = parse(
        "CREATE OR ALTER TRIGGER dbo.trg ON dbo.T\nWITH EXECUTE AS NOBODY\nAFTER INSERT\nAS\nBEGIN\n"
        "    SET NOCOUNT ON;\nEND;\n"
    )
    assert unparsable(tree)
