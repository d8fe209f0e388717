"""``alembic downgrade base`` removes exactly what the package created (SQL Server 2022).

On a database deployed with ``alembic upgrade head`` (fixture
``fresh_database``), holding data and a role member, ``downgrade base`` first
refuses (50420, naming the tables that hold rows and their counts) and
changes nothing; with ``-x drop_data=yes`` it must leave nothing of ours
behind:

* no schema ``mailq`` or ``delay``;
* no user object at all (tables, views, procedures, functions, triggers,
  constraints, queues...) except Alembic's own ``dbo.mailq_alembic_version``
  (and its key), which is empty;
* no role ``Mailq*`` (the role with a member is dropped too);
* no Service Broker service, queue, contract or message type of ours (only
  the system ones); no user-defined type; no DDL trigger;

and ``upgrade head`` afterwards deploys again and works (enqueue, claim,
acknowledge), a second ``upgrade head`` is a no-op, and a second
``downgrade base`` is clean again.

A platform table ``dbo.tabDIYTable12402`` that existed before the
deployment is adopted, and ``downgrade base`` keeps it with its rows
(while our trigger on it is gone).
"""

from __future__ import annotations

import uuid

import pytest

from mailq_helpers import claim, connection, enqueue, execute, new_account, new_app, query, scalar
from mailq_db import procedures
from mailq_db.deployment import VERSION_TABLE, alembic_config

pytestmark = pytest.mark.integration

PLATFORM_TABLE = "dbo.tabDIYTable12402"


def leftovers(conn, keep_tables: tuple[str, ...] = ()) -> dict[str, list[tuple]]:
    """Everything user-made that is left in the database, by kind (empty lists when clean)."""
    keep = (f"dbo.{VERSION_TABLE}",) + keep_tables
    keep_sql = ", ".join(f"OBJECT_ID(N'{name}')" for name in keep)
    return {
        "schemas": query(conn, "SELECT name FROM sys.schemas WHERE name IN (N'mailq', N'delay');"),
        "objects": query(
            conn,
            "SELECT SCHEMA_NAME(o.schema_id), o.name, o.type_desc FROM sys.objects AS o "
            f"WHERE o.is_ms_shipped = 0 AND o.object_id NOT IN ({keep_sql}) "
            f"AND NOT (o.parent_object_id IN ({keep_sql}) AND o.type IN ('PK', 'D', 'UQ', 'C', 'F')) "
            "ORDER BY 1, 2;"),
        "tables": query(
            conn,
            "SELECT SCHEMA_NAME(t.schema_id) + N'.' + t.name FROM sys.tables AS t "
            f"WHERE t.is_ms_shipped = 0 AND t.object_id NOT IN ({keep_sql});"),
        "roles": query(conn, "SELECT name FROM sys.database_principals WHERE type = 'R' AND name LIKE N'Mailq%';"),
        "services": query(conn, "SELECT name FROM sys.services "
                                "WHERE name NOT LIKE N'http://schemas.microsoft.com/SQL/%';"),
        "queues": query(conn, "SELECT name FROM sys.service_queues WHERE is_ms_shipped = 0;"),
        "contracts": query(conn, "SELECT name FROM sys.service_contracts "
                                 "WHERE name NOT LIKE N'http://schemas.microsoft.com/SQL/%' AND name <> N'DEFAULT';"),
        "message_types": query(conn, "SELECT name FROM sys.service_message_types "
                                     "WHERE name NOT LIKE N'http://schemas.microsoft.com/SQL/%' "
                                     "AND name <> N'DEFAULT';"),
        "triggers": query(conn, "SELECT name FROM sys.triggers WHERE is_ms_shipped = 0;"),
        "types": query(conn, "SELECT name FROM sys.types WHERE is_user_defined = 1;"),
    }


def assert_clean(conn, keep_tables: tuple[str, ...] = ()) -> None:
    left = {kind: rows for kind, rows in leftovers(conn, keep_tables).items() if rows}
    assert left == {}, f"downgrade base left objects behind: {left}"
    assert scalar(conn, f"SELECT COUNT(*) FROM dbo.{VERSION_TABLE};") == 0


def smoke(conn) -> None:
    """The deployed queue works end to end."""
    account = new_account(conn, "smoke")
    app = new_app(conn, "smoke")
    (mail,) = enqueue(conn, account, app, 1)
    token, got = claim(conn, app)
    assert [m.id for m in got] == [mail.mail_id]
    assert procedures.mark_sent(conn, ids=[mail.mail_id], lock_token=token)[0].status == "Sent"


def test_downgrade_base_leaves_nothing_and_upgrade_deploys_again(fresh_database):
    from alembic import command
    from alembic.script import ScriptDirectory

    url = fresh_database()
    cfg = alembic_config(x_args=[f"url={url}"])
    head = ScriptDirectory.from_config(cfg).get_current_head()

    with connection(url) as conn:
        # Data in every table of ours, and a member in a role (a role with members
        # cannot be dropped without removing them first).
        smoke(conn)
        execute(conn, "CREATE USER it_sender WITHOUT LOGIN;")
        execute(conn, "ALTER ROLE MailqSender ADD MEMBER it_sender;")
        assert scalar(conn, f"SELECT version_num FROM dbo.{VERSION_TABLE};") == head
        assert query(conn, "SELECT name FROM sys.schemas WHERE name = N'mailq';") == [("mailq",)]

    # Tables hold rows: the downgrade refuses (50420), naming them, and changes nothing.
    with pytest.raises(Exception, match=r"50420|would drop tables that hold rows") as refused:
        command.downgrade(cfg, "base")
    assert "mailq.MailQueue (1 rows)" in str(refused.value)
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM dbo.{VERSION_TABLE};") == head
        assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue;") == 1
        assert scalar(conn, "SELECT COUNT(*) FROM sys.database_role_members "
                            "WHERE role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqSender');") == 1

    command.downgrade(alembic_config(x_args=[f"url={url}", "drop_data=yes"]), "base")
    with connection(url) as conn:
        assert_clean(conn)
        # Not ours: the user stays (only its membership went with the role).
        assert scalar(conn, "SELECT COUNT(*) FROM sys.database_principals WHERE name = N'it_sender';") == 1

    command.upgrade(cfg, "head")
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM dbo.{VERSION_TABLE};") == head
        assert scalar(conn, "SELECT COUNT(*) FROM sys.procedures WHERE SCHEMA_NAME(schema_id) = N'mailq';") >= 15
        smoke(conn)

    command.upgrade(cfg, "head")  # already at head: nothing to do, no error
    command.downgrade(alembic_config(x_args=[f"url={url}", "drop_data=yes"]), "base")
    with connection(url) as conn:
        assert_clean(conn)


def test_downgrade_keeps_an_adopted_platform_table(fresh_database):
    from alembic import command

    url = fresh_database(deploy=False)
    marker = f"platform row {uuid.uuid4().hex[:8]}"
    with connection(url) as conn:
        execute(conn, f"""
            CREATE TABLE {PLATFORM_TABLE} (
                ID INT IDENTITY (1, 1) NOT NULL CONSTRAINT PK_PlatformTable PRIMARY KEY,
                F108210 NVARCHAR(50) NULL, F108211 NVARCHAR(400) NULL,
                F108212 NVARCHAR(200) NULL, F108213 NVARCHAR(200) NULL, F108214 NVARCHAR(200) NULL,
                F108215 NVARCHAR(200) NULL, F108216 NVARCHAR(200) NULL,
                F108217 DATETIME NULL, F108218 INT NULL, F108219 INT NULL
            );""")
        # A finished row (receipt 1): the trigger, once there, leaves it alone.
        execute(conn, f"INSERT INTO {PLATFORM_TABLE} (F108210, F108219) VALUES (?, 1);", marker)

    cfg = alembic_config(x_args=[f"url={url}"])
    command.upgrade(cfg, "head")
    with connection(url) as conn:
        assert scalar(conn, "SELECT Detail FROM delay.Installation WHERE Item = ?;", PLATFORM_TABLE) == "adopted"
        assert scalar(conn, "SELECT COUNT(*) FROM sys.triggers WHERE parent_id = OBJECT_ID(?);", PLATFORM_TABLE) >= 1

    command.downgrade(cfg, "base")
    with connection(url) as conn:
        assert scalar(conn, f"SELECT F108210 FROM {PLATFORM_TABLE};") == marker
        assert scalar(conn, "SELECT COUNT(*) FROM sys.triggers WHERE parent_id = OBJECT_ID(?);", PLATFORM_TABLE) == 0
        assert_clean(conn, keep_tables=(PLATFORM_TABLE,))
