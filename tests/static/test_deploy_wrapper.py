"""scripts/deploy-script --apply looks for a registered ODBC driver (odbcinst -q
-d), not for the unixODBC library: with unixODBC and no driver (the 2026-11-26
reading, defect 10) it used to install nothing and fail later.

The script runs from a copy whose .venv/bin/mailq-db and whose odbcinst and id
on PATH are stand-ins that record what they were asked: this tests the
wrapper's decisions, not the driver."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    executable(tmp_path / ".venv/bin/mailq-db", '#!/bin/sh\necho "mailq-db $*"\n')
    return tmp_path


def run(copy: Path, drivers: str, uid: str = "1000", *args: str) -> subprocess.CompletedProcess:
    bin_dir = copy / "fakebin"
    executable(bin_dir / "odbcinst", "#!/bin/sh\n[ \"$1 $2\" = \"-q -d\" ] && printf '%b' \"" + drivers + "\"\n")
    executable(bin_dir / "id", f'#!/bin/sh\necho {uid}\n')
    executable(bin_dir / "apt-get", f'#!/bin/sh\necho "apt-get $*" >> "{copy}/apt.log"\n')
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("MAILQ_DB_URL", None)
    return subprocess.run(["bash", str(copy / "scripts/deploy-script"), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_a_registered_driver_is_enough(copy):
    result = run(copy, "[FreeTDS]\\n", "1000", "--apply")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "mailq-db deploy"
    assert "no ODBC driver" not in result.stderr


def test_no_registered_driver_is_reported_when_not_root(copy):
    result = run(copy, "[PostgreSQL Unicode]\\n", "1000", "--apply")
    assert "no ODBC driver for SQL Server is registered (odbcinst -q -d)" in result.stderr
    assert not (copy / "apt.log").exists()


def test_no_registered_driver_is_installed_as_root(copy):
    run(copy, "", "0", "--apply")
    log = (copy / "apt.log").read_text(encoding="utf-8")
    assert "install -y -qq --no-install-recommends unixodbc tdsodbc" in log


def test_printing_needs_no_driver(copy):
    result = run(copy, "", "0")
    assert result.stdout.strip() == "mailq-db deploy --sql"
    assert not (copy / "apt.log").exists()
