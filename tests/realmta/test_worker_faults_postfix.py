"""Database faults at every call site of the worker, copies counted in the lab's Maildir.

The queue is the unit suite's FakeQueue (the worker's behaviour is tested, never a
procedure); the SMTP side is the lab's real Postfix.  Each scenario injects one
class of database error (tests/unit/fake_queue.py ``fail_next``) at one call site
of the worker -- claim, lease extension, acknowledgement (MarkSent, MarkFailed),
recipient outcomes, release -- runs the worker until every mail is final (a
lease left behind is made to expire, as time would), waits until Postfix has
delivered everything, and counts the copies of each Message-ID per recipient in
the Maildir.  Every accepted recipient has exactly one copy, or the mail carries
PossibleDuplicate (set by the reclaim where the worker could not know); a refused
recipient has none.

Also: a relay incident (the policy service answers 451 to every message for a
window) and refusals of one sender address on one account among good mail.
"""

from __future__ import annotations

import itertools
import logging
import threading

import pytest
from lab import INCIDENT_REPLY
from realmta_helpers import FakeQueue, account, make_mail, worker

from mailq_db.errors import DatabaseError, UnknownMailError
from mailq_db.worker.classify import EscalationPolicy
from mailq_db.worker.smtp import SmtpSession

#: error class -> (a factory of the error, whether the server may have committed the call first)
ROLLED_BACK = {
    "deadlock 1205": lambda: DatabaseError(1205, "chosen as the deadlock victim"),
    "lock timeout 1222": lambda: DatabaseError(1222, "Lock request time out period exceeded"),
    "azure 40613": lambda: DatabaseError(40613, "Database is not currently available"),
    "azure 40501": lambda: DatabaseError(40501, "The service is currently busy"),
    "azure 49918": lambda: DatabaseError(49918, "Not enough resources to process request"),
    "azure 4060": lambda: DatabaseError(4060, "Cannot open database requested by the login"),
    "azure 10928": lambda: DatabaseError(10928, "The request limit for the database has been reached"),
    "failover 983": lambda: DatabaseError(983, "the database replica is not in the PRIMARY or SECONDARY role"),
}
AMBIGUOUS = {
    "lost connection": lambda: ConnectionResetError("connection reset by the database host"),
    "azure 40197": lambda: DatabaseError(40197, "The service has encountered an error processing your request"),
}
SITES = ("claim_mail", "extend_lease", "mark_sent", "mark_failed", "record_recipient_outcomes", "release_mail")
_ids = itertools.count(1)


def scenarios():
    for site in SITES:
        for name in ROLLED_BACK:
            yield site, name, 1, False
        for name in AMBIGUOUS:
            for committed in (False, True):
                yield site, name, 1, committed
        yield site, "outage", 8, False  # longer than the connection's own reconnect attempts
        yield site, "outage", 8, True
        yield site, "refused 50201", 1, False  # not transient: the database refuses the call


def error_for(name: str) -> BaseException:
    factory = {**ROLLED_BACK, **AMBIGUOUS, "outage": AMBIGUOUS["lost connection"],
               "refused 50201": lambda: UnknownMailError(50201, "no mail has this ID")}[name]
    return factory()


def batch(prefix: str) -> list:
    """Three mails: one plain, one with a refused recipient (recipient outcomes, then
    MarkSent), one refused for every recipient (recipient outcomes, then MarkFailed)."""
    first = next(_ids) * 10
    kinds = [f"{prefix}-ok@lab.test", f"{prefix}-part@lab.test; nouser-{prefix}@lab.test",
             f"nouser-{prefix}-all@lab.test"]
    return [make_mail(first + i, to_address=to, from_address="mailer@lab.test",
                      message_id=f"<{prefix}.{first + i}@mailq.lab.test>") for i, to in enumerate(kinds)]


def run_to_the_end(w, queue, rounds: int = 8) -> None:
    """Run until every mail is final; between runs, what a lease still holds is made
    to expire (the time a reclaim waits for), as after a worker gave a lease up."""
    for _ in range(rounds):
        try:
            w.run(once=True)
        except Exception:  # noqa: BLE001 - a fault at the claim ends that run; the next one goes on
            pass
        if all(r.status in ("Sent", "Failed") for r in queue.rows.values()):
            return
        queue.expire_leases()
        for r in queue.rows.values():
            if r.status == "UnSent":
                r.due = r.due.min


def count_copies(lab, queue) -> list[str]:
    """The problems: a recipient the server accepted with no copy, or with more than
    one copy when the row does not say PossibleDuplicate, or a refused one with a copy."""
    lab.wait_queue_empty()
    problems = []
    for row in queue.rows.values():
        copies = lab.copies(row.mail.message_id)
        wanted = [r.strip() for r in row.mail.to_address.split(";") if not r.strip().startswith("nouser")]
        for rcpt in wanted:
            n = copies.get(rcpt, 0)
            if n == 0 or (n > 1 and not row.possible_duplicate):
                problems.append(f"mail {row.mail.id} to {rcpt}: {n} copies, PossibleDuplicate="
                                f"{row.possible_duplicate}, status {row.status}")
        for rcpt, n in copies.items():
            if rcpt not in wanted:
                problems.append(f"mail {row.mail.id}: a refused recipient {rcpt} got {n} copies")
    return problems


@pytest.mark.parametrize("site,error,times,committed", list(scenarios()),
                         ids=lambda v: str(v).replace(" ", "-"))
def test_every_accepted_mail_arrives_once_or_is_flagged(lab, site, error, times, committed):
    prefix = f"fault{next(_ids)}"
    # The claim's lease is shorter than the worker asks for, so the first lease
    # check extends it: the extension is one of the call sites under test.
    queue = FakeQueue(batch(prefix), lease_override_seconds=40)
    for _ in range(times):
        queue.fail_next(site, error_for(error), committed=committed)
    w = worker(queue, {"default": account(lab)}, lease_seconds=120, lease_safety_margin_seconds=10,
               ack_shutdown_wait_seconds=1)
    w.db._sleep = lambda s: None
    w.pause = lambda s: None
    if site == "release_mail":
        stop_after_first_send(w)
    run_to_the_end(w, queue)
    assert queue.calls_to(site), f"the fault site {site} was never reached"
    assert {r.status for r in queue.rows.values()} <= {"Sent", "Failed"}, queue.statuses()
    assert [r.status for r in queue.rows.values()] == ["Sent", "Sent", "Failed"]
    assert count_copies(lab, queue) == []
    copies = [sum(lab.copies(r.mail.message_id).values()) for r in queue.rows.values()]
    flagged = [r.mail.id for r in queue.rows.values() if r.possible_duplicate]
    print(f"\nFIGURE {site} {error} x{times} committed={committed}: copies per mail {copies} "
          f"(mail 2: one recipient of two accepted; mail 3: none), PossibleDuplicate on {len(flagged)} mail(s)")


def stop_after_first_send(w) -> None:
    """SIGTERM after the first mail: the others are released (the release is the site)."""
    stop = w.stop

    class StopAfterFirst(SmtpSession):
        def send(self, out):
            result = super().send(out)
            stop.set()
            return result

    w.session_factory = StopAfterFirst
    original = w.run

    def run(*, once=False):
        try:
            original(once=once)
        finally:
            if stop.is_set():  # the next round runs again, with the normal session
                stop.clear()
                w.session_factory = SmtpSession

    w.run = run


# --------------------------------------------------------------------------- relay incident


def test_a_relay_incident_pauses_the_account_and_no_mail_fails_or_spends_an_attempt(lab, caplog):
    prefix = "incident"
    mails = [make_mail(900 + i, to_address=f"{prefix}-{i}@lab.test", from_address="mailer@lab.test",
                       message_id=f"<{prefix}.{i}@mailq.lab.test>") for i in range(12)]
    queue = FakeQueue(mails)
    w = worker(queue, {"default": account(lab)}, lease_seconds=120)
    w.config = type(w.config)(worker=w.config.worker, accounts=w.config.accounts,
                              escalation=EscalationPolicy(retry_threshold=3, retry_wait_seconds=1))
    w.escalation = type(w.escalation)(w.config.escalation)
    lab.relay_incident(seconds=600)
    with caplog.at_level(logging.WARNING, logger="mailq_db.worker"):
        w.run(once=True)
    replies = lab.policy.incident_replies
    assert replies == 3  # three temporary failures, then the account paused: no more tries
    waits = queue.calls_to("mark_failed")
    assert len(waits) == 1 and waits[0]["disposition"] == "Wait"
    assert INCIDENT_REPLY.split(" ", 2)[2] in waits[0]["error"]  # the relay's own words
    assert "escalated: 3 temporary failures" in waits[0]["error"]  # the reason, in the event stream
    assert all(r.attempts_remaining == 5 for r in queue.rows.values())
    lab.relay_incident(seconds=0)  # the relay is back
    queue.blocked_until.clear()  # the account's pause has passed
    run_to_the_end(w, queue)
    assert queue.statuses() == {m.id: "Sent" for m in mails}
    assert all(r.attempts_remaining == 4 for r in queue.rows.values())  # one attempt each: the one that worked
    assert count_copies(lab, queue) == []


# --------------------------------------------------------------------------- one sender address refused


def test_a_refused_sender_address_fails_its_mail_and_the_account_and_the_other_account_go_on(lab):
    prefix = "senders"
    good = [make_mail(950 + i, to_address=f"{prefix}-{i}@lab.test", from_address="mailer@lab.test",
                      message_id=f"<{prefix}.{i}@mailq.lab.test>") for i in range(4)]
    good += [make_mail(960 + i, account_name="second", to_address=f"{prefix}-b{i}@lab.test",
                       from_address="mailer@lab.test", message_id=f"<{prefix}.b{i}@mailq.lab.test>")
             for i in range(2)]
    blocked = make_mail(970, to_address=f"{prefix}-x@lab.test", from_address="blocked-sender@lab.test",
                        message_id=f"<{prefix}.x@mailq.lab.test>", priority=9)
    paused = [make_mail(980 + i, to_address=f"{prefix}-p{i}@lab.test", from_address="pause-sender@lab.test",
                        message_id=f"<{prefix}.p{i}@mailq.lab.test>", priority=8) for i in range(2)]
    queue = FakeQueue([blocked, *paused, *good])
    w = worker(queue, {"default": account(lab), "second": account(lab, name="second")})
    w.run(once=True)
    assert queue.status(970) == "Failed" and "sender-address-refused" in queue.rows[970].last_error
    assert [queue.status(m.id) for m in paused] == ["UnSent", "UnSent"]  # the From address pauses
    assert "is paused" in queue.rows[981].last_error  # the second was not even tried
    assert all(queue.status(m.id) == "Sent" for m in good)  # both accounts went on
    assert queue.blocked_until == {}  # no account was paused
    assert w.metrics.snapshot()["sender_pauses"] == 1
    assert count_copies(lab, FakeQueueView(queue, [m.id for m in good])) == []
    assert lab.copies(blocked.message_id) == {}


class FakeQueueView:
    """The rows of some mails only (count_copies reads ``rows``)."""

    def __init__(self, queue: FakeQueue, ids: list[int]):
        self.rows = {i: queue.rows[i] for i in ids}


def test_a_lease_the_database_gave_away_is_not_acknowledged_twice(lab):
    """Another worker reclaimed a mail after this one sent it (its lease expired
    mid-send): MarkSent is refused with LeaseLost, the mail is logged as possibly
    sent twice, and the reclaim's copy carries PossibleDuplicate."""
    prefix = "stolen"
    mails = [make_mail(990, to_address=f"{prefix}-0@lab.test", from_address="mailer@lab.test",
                       message_id=f"<{prefix}.0@mailq.lab.test>")]
    queue = FakeQueue(mails)
    stolen = threading.Event()

    class Stealing(SmtpSession):
        def send(self, out):
            result = super().send(out)
            if not stolen.is_set():
                stolen.set()
                queue.expire_leases()
                queue.claim_mail(None, batch_size=1, lock_token="00000000-0000-0000-0000-00000000abcd",
                                 lease_seconds=60)
            return result

    w = worker(queue, {"default": account(lab)})
    w.session_factory = Stealing
    w.run(once=True)
    assert queue.rows[990].possible_duplicate and queue.status(990) == "Sending"
    assert count_copies(lab, queue) == []  # one copy so far: the reclaim's send is still to come
