"""The worker's finalization timer (Worker.maybe_finalize, revision 0005):
mailq.FinalizeMail runs at most every FINALIZE_INTERVAL_SECONDS, before a
claim, and a failure of it never stops the worker from claiming."""

from __future__ import annotations

from worker_helpers import FakeQueue, make_worker

from mailq_db.procedures import FinalizeResult
from mailq_db.worker import loop


class FinalizingQueue(FakeQueue):
    def __init__(self, *args, fail: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.finalize_calls = 0
        self.fail = fail

    def finalize_mail(self, conn, *, batch_size=None, max_batches=None) -> FinalizeResult:
        self.finalize_calls += 1
        if self.fail:
            raise RuntimeError("permission denied on mailq.FinalizeMail")
        return FinalizeResult(failed=1, expired=2, more_left=False)


def test_finalize_runs_before_the_first_claim_then_once_per_interval():
    queue = FinalizingQueue()
    worker = make_worker(queue, {})
    worker.run(once=True)
    assert queue.finalize_calls == 1
    worker.run(once=True)
    assert queue.finalize_calls == 1, "finalized again before the interval passed"
    worker._finalized_at -= loop.FINALIZE_INTERVAL_SECONDS
    worker.run(once=True)
    assert queue.finalize_calls == 2


def test_a_failing_finalize_never_stops_claiming(caplog):
    queue = FinalizingQueue(fail=True)
    worker = make_worker(queue, {})
    worker.maybe_finalize()
    assert queue.finalize_calls == 1
    assert "mailq.FinalizeMail failed" in caplog.text
    worker.run(once=True)
    assert len(queue.calls_to("claim_mail")) == 1, "the worker stopped claiming after a failed finalize"


def test_a_queue_without_finalize_is_left_alone():
    queue = FakeQueue()
    worker = make_worker(queue, {})
    worker.maybe_finalize()  # no finalize_mail: nothing to call, no error
    worker.run(once=True)
