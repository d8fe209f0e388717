"""Issue 12 point 10: a golden copy of every rendered script.

A change of alembic, SQLAlchemy or the deployment code that alters the script
a DBA reviews fails here.  After an intended change (a new revision, a
dependency upgrade), regenerate with ONE command and review the diff:

    mailq-db dev golden
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mailq_db.commands.dev import GOLDEN, golden_dir, render_golden

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name,command,revision,x_args", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_rendered_script_equals_its_golden_copy(name, command, revision, x_args):
    path = golden_dir(ROOT) / name
    assert path.is_file(), "no golden copy: run `mailq-db dev golden`"
    rendered = render_golden(ROOT, command, revision, x_args)
    golden = path.read_text(encoding="utf-8")
    if rendered != golden:
        got, want = rendered.splitlines(), golden.splitlines()
        line = next((i + 1 for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)) + 1)
        pytest.fail(f"{name} differs from the rendered script from line {line}; if the change is "
                    "intended, run `mailq-db dev golden` and review the diff")
