"""The built wheel carries sql/ and the migrations: in an empty virtualenv,
`pip install <wheel>` then `mailq-db deploy --sql` prints the same script as
`alembic upgrade head --sql` run from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return next(out.glob("mailq_db-*.whl"))


def test_wheel_contains_sql_and_migrations(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mailq_db/_bundle/sql/procedures/mailq.ClaimMail.sql" in names
    assert "mailq_db/_bundle/sql/BuildOrder.txt" in names
    assert "mailq_db/_bundle/alembic/env.py" in names
    assert "mailq_db/_bundle/alembic/frozen/MANIFEST.sha256" in names
    assert "mailq_db/_bundle/alembic.ini" in names
    assert any(n.startswith("mailq_db/_bundle/alembic/versions/0001_") for n in names)
    # Issue 12 point 10: no developer tools, no sqlfluff plugin registered for
    # every user (plugins/sqlfluff-tsql-broker is its own distribution).
    assert not any(n.startswith("sqlfluff_tsql_broker/") for n in names)
    assert not any(n.startswith("mailq_db/devtools/") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[sqlfluff]" not in zipfile.ZipFile(wheel).read(entry_points).decode()
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: alembic<1.21,>=1.20" in metadata or "Requires-Dist: alembic>=1.20,<1.21" in metadata
    assert "mailq_db/worker/smtp_rules.toml" in names  # issue 15: the reply rule table


def test_installed_wheel_prints_the_checkout_script(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, timeout=900
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAILQ_DB_URL")}
    from_wheel = subprocess.run(
        [str(env_dir / "bin" / "mailq-db"), "deploy", "--sql"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env,
    )
    assert from_wheel.returncode == 0, from_wheel.stderr[-3000:]
    from_checkout = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head", "--sql"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert from_checkout.returncode == 0, from_checkout.stderr[-3000:]
    assert "CREATE OR ALTER PROCEDURE mailq.ClaimMail" in from_wheel.stdout
    assert from_wheel.stdout == from_checkout.stdout
