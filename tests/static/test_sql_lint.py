"""(b) `sqlfluff lint sql/` passes the project's .sqlfluff, run exactly as a
developer or CI runs it (the CLI, so the plugin's entry point is exercised)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint(target: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sqlfluff", "lint", str(target), "--disable-progress-bar"],
        cwd=cwd, capture_output=True, text=True, timeout=900,
    )


def test_sql_folder_passes_the_project_lint_config():
    result = lint(ROOT / "sql", ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "All Finished" in result.stdout + result.stderr


def test_lint_fails_on_a_file_that_breaks_the_config(tmp_path):
    shutil.copy(ROOT / ".sqlfluff", tmp_path / ".sqlfluff")
    (tmp_path / "bad.sql").write_text(
        "create or alter procedure mailq.Bad\nas\nbegin\n    select a.ID from mailq.MailQueue a;\nend;\n",
        encoding="utf-8",
    )
    result = lint(tmp_path / "bad.sql", tmp_path)
    assert result.returncode != 0
    assert "CP01" in result.stdout  # keywords must be upper case
    assert "AL01" in result.stdout  # aliases must use AS


def test_no_sql_file_is_excluded_from_linting():
    config = (ROOT / ".sqlfluff").read_text(encoding="utf-8")
    assert "ignore_paths" not in config and not (ROOT / ".sqlfluffignore").exists()
