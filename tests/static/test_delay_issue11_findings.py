"""Issue 11, what a fresh reader still found in revision 0006 (revision 0010).

Text checks of the procedures; each also runs against the text of revision
0006 (tests/static/samples/delay-0006) and must fail there, so it shows the finding.  Behaviour: the
spin model (tests/models: delay-recovery-any-message finds the 0006 recovery's
counterexample, delay-recovery-later-message checks 0010's) and
tests/integration/test_delay_execution.py (SQL Server 2022).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db import deployment as d

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "sql" / "broker"


def current(name: str) -> str:
    return d.strip_comments((BROKER / name).read_text(encoding="utf-8"))


def at_0006(name: str) -> str:
    """The text of revision 0006 (a negative sample kept in tests/static/samples)."""
    path = ROOT / "tests" / "static" / "samples" / "delay-0006" / name
    return d.strip_comments(path.read_text(encoding="utf-8")) if path.is_file() else ""


def between(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i + len(start))]


# ---- 1. the recovery takes only the message that failed ------------------


def recovery_takes_only_the_failed_message(pdq: str) -> bool:
    try:
        step1 = between(pdq, "WAITFOR (", "), TIMEOUT @ReceiveWaitMs;")
        rec = between(pdq, "WHERE conversation_handle = @Handle;", "END CATCH;")
    except ValueError:
        return False
    recv = pdq[pdq.index("WHERE conversation_handle = @Handle;") - 300 : pdq.index("WHERE conversation_handle = @Handle;")]
    incident = rec.index("INSERT INTO delay.Incident") if "INSERT INTO delay.Incident" in rec else -1
    return (
        "@MessageId = message_id" in step1
        and "@MessageSequence = message_sequence_number" in step1
        and "@ReceivedId = message_id" in recv
        and "@ReceivedSequence = message_sequence_number" in recv
        # the comparison decides, NULL-safe, before anything is recorded
        and "INTERSECT" in rec
        and re.search(r"IF @SameMessage = 1\s+BEGIN\s+INSERT INTO delay\.Incident", rec) is not None
        and 0 < rec.index("IF @SameMessage = 1") < incident
        # a later message is rolled back, its conversation not ended
        and re.search(r"ELSE IF @ReceivedCount > 0\s+BEGIN\s+ROLLBACK TRANSACTION;", rec) is not None
        and "END CONVERSATION" not in between(rec, "ELSE IF @ReceivedCount > 0", "IF @@TRANCOUNT > 0")
    )


def test_the_recovery_takes_only_the_failed_message():
    assert recovery_takes_only_the_failed_message(current("dbo.ProcessDelayQueue.sql"))


def test_the_recovery_check_fails_on_0006():
    assert not recovery_takes_only_the_failed_message(at_0006("dbo.ProcessDelayQueue.sql"))


def test_the_recovery_rollback_is_the_only_one_and_state_is_reset():
    pdq = current("dbo.ProcessDelayQueue.sql")
    rec = between(pdq, "IF @Recover = 1", "END CATCH;")
    # reset before every recovery: a RECEIVE that returns no row assigns nothing
    assert "SELECT @ReceivedId = NULL, @ReceivedSequence = NULL, @ReceivedCount = 0, @SameMessage = 0;" in rec
    assert "SET @ReceivedCount = @@ROWCOUNT;" in rec
    assert "IF @@TRANCOUNT > 0\n                    COMMIT TRANSACTION;" in pdq


# ---- 2. endpoint states: DI/ER are not gone, DO is -------------------------

GONE = "('CD', 'DO')"


def reconcile_classifies_states(text: str) -> bool:
    try:
        pass_ = between(text, "INSERT INTO @Candidate", "INSERT INTO @Finding")
        loop = between(text, "WHILE 1 = 1", "WHILE @Done < @MaxRows")
    except ValueError:
        return False
    return (
        "ep.state IN ('CD', 'DO', 'DI', 'ER')" in pass_
        and "WHERE c.EndpointState IN ('DI', 'ER')" in text          # reported, left
        and "c.EndpointState IN ('CD', 'DO')" in loop                 # repaired
        and f"e.state NOT IN {GONE}" in loop                          # re-checked under the row lock
        and "'DI'" not in loop and "'ER'" not in loop
    )


def test_reconcile_classifies_endpoint_states():
    assert reconcile_classifies_states(current("delay.Reconcile.sql"))


def test_reconcile_state_check_fails_on_0006():
    assert not reconcile_classifies_states(at_0006("delay.Reconcile.sql"))


def test_reconcile_joins_the_endpoints_once_not_per_iteration():
    text = current("delay.Reconcile.sql")
    code = between(text, "WITH Endpoint AS", "WHILE @Done < @MaxRows")
    loop = code[code.index("WHILE 1 = 1"):]
    before = code[: code.index("WHILE 1 = 1")]
    assert before.count("FROM sys.conversation_endpoints") == 1
    # inside the loop: a lookup by handle only, never a join of all endpoints
    assert "JOIN" not in loop.replace("LEFT OUTER JOIN Endpoint", "")
    assert re.findall(r"FROM sys\.conversation_endpoints AS e\s+WHERE e\.conversation_handle = @Handle", loop)
    assert "FROM sys.conversation_endpoints" not in loop.replace(
        "FROM sys.conversation_endpoints AS e\n                WHERE e.conversation_handle = @Handle", "")
    # and 0006 joined them inside its loop
    old = at_0006("delay.Reconcile.sql")
    old_loop = between(old, "WHILE @Done < @MaxRows", "BEGIN TRY")
    assert "sys.conversation_endpoints" in old_loop
    header = (BROKER / "delay.Reconcile.sql").read_text(encoding="utf-8")
    assert "Cost:" in header[: header.index("*/")]


def test_reconcile_never_ends_a_live_group_after_the_row():
    """Lock order: Reconcile only repairs tasks whose conversation has no
    group anybody can lock (no endpoint, CD, DO); FinishTask skips those."""
    finish = current("delay.FinishTask.sql")
    assert "e.state NOT IN ('CD', 'DO')" in finish
    assert "e.state <> 'CD'" in at_0006("delay.FinishTask.sql")
    text = current("delay.Reconcile.sql")
    loop = between(text, "WHILE 1 = 1", "WHILE @Done < @MaxRows")
    assert "END CONVERSATION" not in loop and "BEGIN CONVERSATION TIMER (@Handle)" not in loop


@pytest.mark.parametrize("name", ["dbo.ProcessDelayQueue.sql", "delay.CancelTask.sql", "delay.Reconcile.sql"])
def test_do_is_never_taken_for_an_open_conversation(name):
    text = current(name)
    assert "NOT IN ('CD', 'ER', 'DI')" not in text
    assert "NOT IN ('CD', 'ER', 'DI')" in at_0006(name) or name == "delay.CancelTask.sql"


# ---- 3. Cancel racing the task's completion --------------------------------


def cancel_maps_the_race(text: str) -> bool:
    try:
        catch = between(text, "BEGIN CATCH", "END CATCH;")
    except ValueError:
        return False
    return (
        "SET @Step = N'timer';" in text
        and "IF @Step = N'timer' AND @ErrorNumber < 50000" in catch
        and "THROW 50321" in catch and "THROW 50343" in catch
        and catch.rstrip().endswith("THROW;")
        and catch.index("ROLLBACK TRANSACTION") < catch.index("IF @Step = N'timer'")
    )


def test_cancel_maps_the_race_with_completion_to_its_numbered_errors():
    assert cancel_maps_the_race(current("delay.CancelTask.sql"))


def test_cancel_race_check_fails_on_0006():
    assert not cancel_maps_the_race(at_0006("delay.CancelTask.sql"))


def test_cancel_reports_an_ending_conversation_as_not_cancellable():
    text = current("delay.CancelTask.sql")
    assert "IF @EndpointState IN ('DI', 'ER')" in text
    errors = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert "finished while the cancel waited" in errors


# ---- 4. the benchmark ------------------------------------------------------


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("delay_throughput_f", ROOT / "bench" / "delay_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_says_it_needs_a_server_when_it_cannot_connect(monkeypatch, capsys):
    bench = _bench()
    import mailq_db.connection as connection

    def refuse(url):
        raise OSError("connection refused")

    monkeypatch.setattr(connection, "connect", refuse)
    assert bench.main(["mssql://nowhere/db"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("delay_throughput: needs a SQL Server")


def test_the_benchmark_prints_lateness_and_duration_beside_the_reference():
    source = (ROOT / "bench" / "delay_throughput.py").read_text(encoding="utf-8")
    assert "| reference: p99 < " in source and "| reference: --target-ms" in source
    bench = _bench()
    assert bench.GOAL_P99_S == 1.0 and bench.GOAL_RATE == 1000
    # the goal load by default: 1,000 tasks/s for 60 s = 60,000 tasks
    assert "default=1000" in source and "default=60" in source


# ---- 5. step 3 is a procedure of its own -----------------------------------


def test_step3_is_split_into_record_outcome():
    pdq = current("dbo.ProcessDelayQueue.sql")
    outcome = current("delay.RecordOutcome.sql")
    assert "EXEC delay.RecordOutcome" in pdq and "@Recorded = @Recorded OUTPUT" in pdq
    # the activation procedure no longer records outcomes itself ...
    assert "EXEC delay.FinishTask @SetReceipt = 0, @TaskID = @TaskID, @TaskState = N'Done';" not in pdq
    # ... the step procedure does, in its own transaction, group before row
    assert "EXEC delay.FinishTask @SetReceipt = 0, @TaskID = @TaskID, @TaskState = N'Done';" in outcome
    assert outcome.index("BEGIN CONVERSATION TIMER (@TaskHandle)") < outcome.index("WITH (UPDLOCK, ROWLOCK)")
    assert "THROW 50360" in outcome and "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;" in outcome
    assert "tabDIYTable12402" not in outcome  # the receipt stays after the COMMIT, in the caller
    text = (BROKER / "delay.RecordOutcome.sql").read_text(encoding="utf-8")
    head = text[: text.index("*/")]
    for line in ("Parameters:", "Result set:", "Errors:", "Transaction:", "Isolation:", "Lock order:"):
        assert line in head, line
    order = (ROOT / "sql" / "BuildOrder.txt").read_text(encoding="utf-8")
    assert order.index("broker/delay.RecordOutcome.sql") < order.index("broker/dbo.ProcessDelayQueue.sql")
    grants = "\n".join(p.read_text(encoding="utf-8") for p in BROKER.glob("*.grants.sql"))
    assert "delay.RecordOutcome" not in grants  # internal: reached by ownership chaining only
