"""Model checks: run spin on every Promela model in models/.

Each check generates the verifier in a temporary directory (never in the
repository), compiles it with gcc and runs it.  Correct models must report
``errors: 0`` over a complete search; the seed article's bugs (and the
variants that weaken mailq-db's own protocol on purpose) must make spin
report the expected counterexample, which shows that the checker can fail.

Without ``spin`` or ``gcc`` the checks skip with a reason, except under CI
(``CI=true``: GitHub Actions, .ci/run installs both), where that is a failure.
See docs/models.md for what each model covers and what it does not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"

#: One verifier run may take at most this long (each is far below it).
TIMEOUT_SECONDS = 240


@dataclass(frozen=True)
class Check:
    id: str
    model: str
    #: cpp switches for spin (-D...), i.e. which variant of the model
    spin_defines: tuple[str, ...] = ()
    #: gcc switches for pan.c (-DSAFETY, -DNFAIR=3, ...)
    cc_defines: tuple[str, ...] = ("-DSAFETY",)
    #: arguments for ./pan
    pan_args: tuple[str, ...] = ("-m400000",)
    #: None: the model must verify; else a regex that pan's output must match
    expect_error: str | None = None
    why: str = field(default="", compare=False)


LIVENESS = ("-DNFAIR=3",)
LIVE_ARGS = ("-a", "-f", "-m400000")
#: delayexec.pml's checks store millions of states: compressed (COLLAPSE is lossless)
DELAY_CC = ("-DSAFETY", "-DCOLLAPSE")

CHECKS = [
    # ---- the mail protocol -------------------------------------------------
    Check("mail-safety-2w", "mailqueue.pml",
          why="invariants, 1 mail, 2 workers, admin actions"),
    Check("mail-safety-3w", "mailqueue.pml", ("-DNW=3", "-DREQUEUES=0"),
          why="invariants, 1 mail, 3 workers"),
    Check("mail-safety-2m", "mailqueue.pml",
          ("-DNM=2", "-DNO_ADMIN", "-DWAITS=0", "-DEXTENDS=0", "-DATT=1"),
          why="invariants, 2 mails competing for 2 workers"),
    Check("mail-liveness", "mailqueue.pml", ("-DLIVE", "-DREQUEUES=0"),
          LIVENESS, LIVE_ARGS,
          why="every mail reaches a final state under weak fairness"),
    Check("mail-liveness-expiry", "mailqueue.pml",
          ("-DLIVE", "-DUNBOUNDED_ENV", "-DEXPIRY=4", "-DNO_ADMIN"),
          LIVENESS, LIVE_ARGS,
          why="with ExpiresAtUtc, endless throttling and stalls still end"),
    Check("mail-liveness-needs-bound", "mailqueue.pml",
          ("-DLIVE", "-DUNBOUNDED_ENV", "-DNO_ADMIN"), LIVENESS, LIVE_ARGS,
          expect_error=r"acceptance cycle",
          why="without expiry, endless Wait/ReleaseMail refunds loop forever"),
    Check("mail-strict-window", "mailqueue.pml", ("-DSTRICT_WINDOW",),
          expect_error=r"assertion violated \(window\[m\]==1\)",
          why="a stall between the lease check and SMTP acceptance also duplicates"),
    Check("mail-unfenced-ack", "mailqueue.pml", ("-DUNFENCED",),
          expect_error=r"assertion violated \(holder\[m\]==\(w\+1\)\)",
          why="acknowledging by ID alone (the article) lets a stale worker write"),
    Check("mail-safety-old-claim", "mailqueue.pml", ("-DCLAIM_FINALIZES",),
          why="the claim of 0001-0004 (finalizing inside the claim) kept for comparison"),
    # ---- rate windows (mailq.ClaimMail's budget, issue 10 point 6) ---------
    Check("rate-window", "mailqueue.pml", ("-DRATE",),
          why="mails charged to any window never exceed the limit, claimers racing at boundaries"),
    Check("rate-window-3c", "mailqueue.pml", ("-DRATE", "-DNC=3", "-DLIMIT=3", "-DNWIN=3"),
          why="the same with three claimers"),
    Check("rate-window-old", "mailqueue.pml", ("-DRATE", "-DOLD_WINDOW"),
          expect_error=r"assertion violated \(charged\[seen\]<=",
          why="0001-0004: clock read before the budget lock, window reset backwards"),
    # ---- delayed execution, third design (sql/broker/, issue 23) ------------
    Check("delay-timer", "delayexec.pml", ("-DFAILS=0", "-DSLOW=0", "-DALTERS=0"), DELAY_CC,
          why="two inserters, two readers: the timer is never lost (monitor Wake) and every "
              "task runs, whatever the order of inserts, commits, passes and re-arms"),
    Check("delay-timer-3-readers", "delayexec.pml",
          ("-DNR=3", "-DFAILS=0", "-DSLOW=0", "-DALTERS=0", "-DMAXT=5", "-DHARD=12"), DELAY_CC,
          why="the same with three readers"),
    Check("delay-runs", "delayexec.pml", ("-DALTERS=0", "-DMAXT=4", "-DHARD=12"), DELAY_CC,
          why="slow targets past their lease, a target that commits or rolls back (266), a "
              "failure and its retry: the sweep never runs a task twice at once"),
    Check("delay-fails", "delayexec.pml", ("-DALTERS=0", "-DSLOW=0", "-DMAXT=5", "-DHARD=12"),
          DELAY_CC, why="a failing target is retried, then Failed; the timer follows the retry"),
    Check("delay-hold", "delayexec.pml", ("-DFAILS=0", "-DSLOW=0", "-DMAXT=5", "-DHARD=12"),
          DELAY_CC,
          why="an ALTER before or during a run holds the task (B1); listed again, it runs"),
    Check("delay-reader-dies", "delayexec.pml",
          ("-DDIES=1", "-DNO_WAKE_CHECK", "-DFAILS=0", "-DSLOW=0", "-DALTERS=0"), DELAY_CC,
          why="a reader dies mid-run: the safety tick re-armed with the RECEIVE and the "
              "sweep still run every task (at least once)"),
    Check("delay-replace", "delayexec.pml",
          ("-DREPLACE", "-DFAILS=0", "-DSLOW=0", "-DALTERS=0"), DELAY_CC,
          expect_error=r"assertion violated 0",
          why="an inserter arming its own due time, not the earliest: BEGIN CONVERSATION "
              "TIMER replaces the earlier inserter's timer, which is lost"),
    Check("delay-read-before-write", "delayexec.pml",
          ("-DREAD_BEFORE_WRITE", "-DFAILS=0", "-DSLOW=0", "-DALTERS=0"), DELAY_CC,
          expect_error=r"assertion violated 0",
          why="the reader reading the due index before writing delay.Dispatcher: a lost wake-up"),
    Check("delay-readpast-min", "delayexec.pml",
          ("-DREADPAST_MIN", "-DFAILS=0", "-DSLOW=0", "-DALTERS=0"), DELAY_CC,
          expect_error=r"assertion violated 0",
          why="the reader's first-due read skipping uncommitted rows: a lost wake-up"),
    Check("delay-no-run-lock", "delayexec.pml",
          ("-DNO_RUN_LOCK", "-DALTERS=0", "-DMAXT=4", "-DHARD=12"), DELAY_CC,
          expect_error=r"assertion violated \(running\[t\]==0\)",
          why="a run that does not hold its row: the sweep runs a slow task a second time"),
    Check("delay-no-session-lock", "delayexec.pml",
          ("-DNO_SESSION_LOCK", "-DALTERS=0", "-DMAXT=4", "-DHARD=12"), DELAY_CC,
          expect_error=r"assertion violated \(running\[t\]==0\)",
          why="without the run's session lock, a target that rolls back the transaction "
              "opened for it (the run's mark with it) and runs on is swept and run again"),
    Check("delay-no-outcome-token", "delayexec.pml",
          ("-DNO_OUTCOME_TOKEN", "-DALTERS=0", "-DMAXT=4", "-DHARD=12"), DELAY_CC,
          expect_error=r"assertion violated \(done\[t\]==0\)",
          why="a failed run's outcome written by TaskID alone after its rollback: a sweep "
              "that claimed and finished the task meanwhile is overwritten, and it runs again"),
    Check("delay-refuse-changed", "delayexec.pml",
          ("-DREFUSE_CHANGED", "-DFAILS=0", "-DSLOW=0", "-DMAXT=5", "-DHARD=12"), DELAY_CC,
          expect_error=r"assertion violated .*changed&&\(st\[t\]==4\)",
          why="the second design (finding B1): an ALTER refuses the tasks for good"),
    Check("delay-no-safety-rearm", "delayexec.pml",
          ("-DNO_SAFETY_REARM", "-DDIES=1", "-DNO_WAKE_CHECK", "-DFAILS=0", "-DSLOW=0",
           "-DALTERS=0"), DELAY_CC,
          expect_error=r"assertion violated .*changed&&\(st\[t\]==4\)",
          why="without the tick re-armed with the RECEIVE, a reader dying mid-pass leaves "
              "a claimed task and no timer"),
    # ---- the seed article: the checker must find its bugs --------------------
    Check("article-claim", "article_claim.pml",
          expect_error=r"assertion violated.*proc\[0\]",
          why="the article's claim transaction as printed: two workers hold one row"),
    Check("article-claim-temp-recheck", "article_claim.pml",
          ("-DNO_RELEASE", "-DTEMP_RECHECK"),
          expect_error=r"assertion violated.*proc\[0\]",
          why="select into #tmpRows, then update re-checking the copy: double claim"),
    Check("article-claim-no-release", "article_claim.pml", ("-DNO_RELEASE", "-DNW=3"),
          why="select + update re-checking the live row under its lock: blocks, never doubles"),
    Check("article-stale-release", "article_stale_release.pml",
          expect_error=r"assertion violated \(now>=\(dp\+2\)\)",
          why="DateProcessed < now + 15 min frees a lock taken a moment ago"),
    Check("article-stale-release-fixed", "article_stale_release.pml", ("-DFIXED", "-DNW=3"),
          why="with now - 15 min only stale locks are freed"),
    Check("article-stale-release-fixed-unfenced", "article_stale_release.pml",
          ("-DFIXED", "-DTWO_HOLDERS"),
          expect_error=r"assertion violated.*sending\[0\]",
          why="even fixed, a stalled worker keeps sending a retaken row: no fence"),
]


def _tools_or_skip() -> None:
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed (Debian: apt-get install spin gcc)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI must run the model checks")
    pytest.skip(message)


def run_check(check: Check, workdir: Path) -> tuple[str, float]:
    """Generate, compile and run the verifier; return pan's output, seconds."""
    shutil.copy(MODELS / check.model, workdir / check.model)
    started = time.monotonic()
    gen = subprocess.run(
        ["spin", *check.spin_defines, "-a", check.model],
        cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
    )
    assert gen.returncode == 0 and (workdir / "pan.c").exists(), (
        f"spin -a {check.model} failed:\n{gen.stdout}\n{gen.stderr}"
    )
    cc = subprocess.run(
        ["gcc", "-O2", "-w", *check.cc_defines, "-o", "pan", "pan.c"],
        cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
    )
    assert cc.returncode == 0, f"gcc pan.c failed:\n{cc.stderr[-4000:]}"
    pan = subprocess.run(
        ["./pan", *check.pan_args],
        cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
    )
    return pan.stdout + pan.stderr, time.monotonic() - started


def _summary(output: str) -> str:
    keep = [line.strip() for line in output.splitlines()
            if re.search(r"errors:|states, stored|^pan:|elapsed time", line)]
    return " | ".join(keep)


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
def test_model(check: Check, tmp_path: Path) -> None:
    _tools_or_skip()
    output, seconds = run_check(check, tmp_path)
    summary = f"{check.id} ({check.why}): {_summary(output)} [{seconds:.1f}s]"
    print(summary)
    assert "max search depth too small" not in output, (
        f"search truncated, raise -m: {summary}"
    )
    match = re.search(r"errors: (\d+)", output)
    assert match, f"no verdict from pan:\n{output[-3000:]}"
    errors = int(match.group(1))
    if check.expect_error is None:
        assert errors == 0, f"spin found a counterexample: {summary}\n{output[-3000:]}"
        assert "Search not completed" not in output, summary
    else:
        assert errors > 0, f"spin found NO counterexample, expected one: {summary}"
        assert re.search(check.expect_error, output), (
            f"spin failed differently than expected ({check.expect_error}): {summary}"
        )


def test_every_model_is_checked() -> None:
    """A model file that no check runs is dead weight: list it in CHECKS."""
    checked = {c.model for c in CHECKS}
    present = {p.name for p in MODELS.glob("*.pml")}
    assert present <= checked, f"models without a check: {sorted(present - checked)}"


def test_model_runs_leave_no_files_in_repo() -> None:
    leftovers = [p.name for p in MODELS.iterdir()
                 if p.name in {"pan", "pan.c", "pan.h", "pan.b", "pan.m", "pan.p", "pan.t"}
                 or p.suffix == ".trail"]
    assert not leftovers, f"verifier files in models/: {leftovers}"
