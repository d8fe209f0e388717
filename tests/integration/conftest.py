"""SQL Server 2022 for the integration tests, through pytest-docker and docker-compose.yml.

Every test in this folder runs against a real SQL Server; none is ever run
against a mock or another database.  Where the machine has no Docker engine
(or no ODBC driver for SQL Server), the whole folder is skipped with ONE
reason, computed once, that says which precondition is missing: it never
fails and never passes vacuously.

Fixtures:
  mssql_server_url  session: URL of the server's master database (login sa)
  mssql_url         module: URL of a fresh database, Service Broker enabled,
                    READ_COMMITTED_SNAPSHOT ON (MAILQ_TEST_RCSI=off: OFF),
                    ALLOW_SNAPSHOT_ISOLATION ON, deployed with
                    `alembic upgrade head`; dropped afterwards
  fresh_database    factory: ``fresh_database(deploy=True, broker=True)`` makes
                    another fresh database and returns its URL; the suite
                    connects as sa (user dbo, mapped to no application), so
                    a deployed database opts in to unmapped enqueuers
                    (mailq.SetEnqueuePolicy) unless
                    ``allow_unmapped_enqueuers=False`` keeps a new
                    installation's refusal (docs/enqueue.md)
  conn              module: an autocommit connection (as sa) to ``mssql_url``
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parents[2]
SA_PASSWORD = os.environ.get("MSSQL_SA_PASSWORD", "MailqDb-Local-2022!")


@functools.lru_cache(maxsize=1)
def skip_reason() -> str | None:
    """Why SQL Server cannot be started here, or None when it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "SQL Server integration tests need a Docker engine: no docker client on this machine"
    try:
        probe = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SQL Server integration tests need a Docker engine: `docker info` failed ({exc})"
    if probe.returncode != 0:
        return "SQL Server integration tests need a Docker engine: `docker info` found no running engine"
    from mailq_db.connection import installed_drivers, pyodbc_problem

    problem = pyodbc_problem()
    if problem:
        return f"SQL Server integration tests need pyodbc with unixODBC: {problem}"
    if not any("SQL Server" in d or d == "FreeTDS" for d in installed_drivers()):
        return "SQL Server integration tests need an ODBC driver (msodbcsql18 or FreeTDS tdsodbc)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = skip_reason()
    if reason is None:
        return
    if os.environ.get("MAILQ_REQUIRE_INTEGRATION") == "1":
        # Where SQL Server must be tested (the integration job of
        # .github/workflows/ci.yml), a missing precondition is a failure.
        raise pytest.UsageError(f"MAILQ_REQUIRE_INTEGRATION=1 but: {reason}")
    here = Path(__file__).parent
    marker = pytest.mark.skip(reason=reason)
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def docker_compose_file():
    return str(ROOT / "docker-compose.yml")


@pytest.fixture(scope="session")
def docker_compose_project_name():
    return "mailq-db-tests"


@pytest.fixture(scope="session")
def docker_setup():
    # Only SQL Server: the SMTP sink and the worker sit under the "local" profile.
    return ["up -d mssql"]


def server_url(port: int, database: str = "master") -> str:
    return (
        f"mssql+pyodbc://sa:{quote(SA_PASSWORD, safe='')}@127.0.0.1:{port}/{database}"
        "?TrustServerCertificate=yes&Encrypt=yes"
    )


def _can_connect(url: str) -> bool:
    from mailq_db.connection import connect

    try:
        connect(url, timeout=5).close()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False


@pytest.fixture(scope="session")
def mssql_server_url(docker_services) -> str:
    port = docker_services.port_for("mssql", 1433)
    url = server_url(port)
    docker_services.wait_until_responsive(timeout=180.0, pause=2.0, check=lambda: _can_connect(url))
    return url


@pytest.fixture(scope="session")
def fresh_database(mssql_server_url):
    """Factory of fresh databases; every one made is dropped at the end of the session."""
    from mailq_db.connection import connect
    from mailq_db.deployment import alembic_config

    made: list[str] = []
    master = connect(mssql_server_url)

    def make(deploy: bool = True, broker: bool = True, x_args: tuple[str, ...] = (),
             allow_unmapped_enqueuers: bool = True) -> str:
        name = f"mailq_test_{uuid.uuid4().hex[:12]}"
        cursor = master.cursor()
        cursor.execute(f"CREATE DATABASE [{name}]")
        if broker:
            # Test databases only: the package itself never runs ALTER DATABASE.
            cursor.execute(f"ALTER DATABASE [{name}] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE")
        # MAILQ_TEST_RCSI=off runs the suite on locking READ COMMITTED (the
        # default of a new database); on (the default here) on row versions.
        # .ci/run runs the mail-queue tests both ways (issue 10, point 3).
        if os.environ.get("MAILQ_TEST_RCSI", "on").lower() != "off":
            cursor.execute(f"ALTER DATABASE [{name}] SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE")
        # SNAPSHOT callers (tests/integration/test_mailq_transactions.py).
        cursor.execute(f"ALTER DATABASE [{name}] SET ALLOW_SNAPSHOT_ISOLATION ON")
        made.append(name)
        url = mssql_server_url.replace("/master?", f"/{name}?")
        if deploy:
            from alembic import command

            command.upgrade(alembic_config(x_args=[f"url={url}", *x_args]), "head")
            if allow_unmapped_enqueuers:
                from mailq_db import procedures
                from mailq_helpers import connection

                with connection(url) as c:
                    procedures.set_enqueue_policy(c, allow_unmapped_enqueuers=True)
        return url

    yield make
    cursor = master.cursor()
    for name in made:
        cursor.execute(
            f"IF DB_ID(N'{name}') IS NOT NULL BEGIN "
            f"ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE; DROP DATABASE [{name}]; END"
        )
    master.close()


@pytest.fixture(scope="module")
def mssql_url(fresh_database) -> str:
    """A fresh database per test module, deployed with `alembic upgrade head`."""
    return fresh_database()


@pytest.fixture(scope="module")
def conn(mssql_url):
    """An autocommit connection (as sa) to the module's database, closed afterwards."""
    from mailq_helpers import connection

    with connection(mssql_url) as c:
        yield c
