"""The deployment helpers: what a file creates, how it is dropped, how it is sent."""

from __future__ import annotations

import pytest

from mailq_db import deployment as d


@pytest.mark.parametrize(
    "sql,kind,name,parent",
    [
        ("/* CREATE TABLE x.Y */\nCREATE OR ALTER PROCEDURE mailq.ClaimMail\nAS SELECT 1;", "procedure", "mailq.ClaimMail", None),
        ("IF OBJECT_ID(N'mailq.T', N'U') IS NULL\nBEGIN\n CREATE TABLE mailq.T (ID INT);\nEND;", "table", "mailq.T", None),
        ("CREATE NONCLUSTERED INDEX IX_T_A\nON mailq.T (A) WHERE A = 1;", "index", "IX_T_A", "mailq.T"),
        ("CREATE UNIQUE NONCLUSTERED INDEX UX_T ON mailq.T (A);", "index", "UX_T", "mailq.T"),
        ("CREATE OR ALTER VIEW mailq.V AS SELECT 1 AS A;", "view", "mailq.V", None),
        ("CREATE OR ALTER TRIGGER dbo.trg ON dbo.T AFTER INSERT AS SELECT 1;", "trigger", "dbo.trg", "dbo.T"),
        ("IF DATABASE_PRINCIPAL_ID(N'R') IS NULL CREATE ROLE R AUTHORIZATION dbo;", "role", "R", None),
        ("CREATE SCHEMA mailq AUTHORIZATION dbo;", "schema", "mailq", None),
        ("CREATE QUEUE dbo.Q WITH STATUS = ON ON [DEFAULT];", "queue", "dbo.Q", None),
        ("CREATE MESSAGE TYPE [//x/Request] VALIDATION = NONE;", "message type", "[//x/Request]", None),
        ("GRANT EXECUTE ON OBJECT::mailq.P TO R;", "grant", "", None),
        ("DECLARE @x INT = 1; IF @x = 2 THROW 50402, N'CREATE TABLE in a string', 1;", "script", "", None),
    ],
)
def test_describe(sql, kind, name, parent):
    assert d.describe(sql) == d.SqlObject(kind, name, parent)


def test_drop_statements():
    assert d.drop_statement(d.SqlObject("procedure", "mailq.P")) == "DROP PROCEDURE IF EXISTS mailq.P"
    assert d.drop_statement(d.SqlObject("index", "IX", "mailq.T")) == "DROP INDEX IF EXISTS IX ON mailq.T"
    role = d.drop_statement(d.SqlObject("role", "MailqSender"))
    assert "DROP MEMBER" in role and role.rstrip().endswith("END")
    queue = d.drop_statement(d.SqlObject("queue", "dbo.Q"))
    assert "sys.service_queues" in queue and "DROP QUEUE dbo.Q" in queue
    assert d.drop_statement(d.SqlObject("script", "")) is None


def test_revoke_statements_undo_each_grant():
    sql = "/* grants */\nGRANT EXECUTE ON OBJECT::mailq.A TO R1;\nGRANT SELECT ON OBJECT::mailq.V TO R2;\n"
    assert d.revoke_statements(sql) == [
        "REVOKE EXECUTE ON OBJECT::mailq.A FROM R1",
        "REVOKE SELECT ON OBJECT::mailq.V FROM R2",
    ]


def test_statement_text_strips_one_trailing_semicolon():
    assert d.statement_text("BEGIN\n  SELECT 1;\nEND;\n\n") == "BEGIN\n  SELECT 1;\nEND"
    assert d.statement_text("SELECT 1") == "SELECT 1"


def test_colons_survive_sqlalchemy_text():
    from sqlalchemy import text
    from sqlalchemy.dialects import mssql

    sql = "GRANT EXECUTE ON OBJECT::mailq.P TO R; SELECT N'a :b', N'12:30:00';"
    compiled = text(sql.replace(":", "\\:")).compile(dialect=mssql.dialect())
    assert str(compiled) == sql
