"""Independent real-server scenarios of the worker's failure paths (kept apart for verification).

Written apart from test_worker_faults_postfix.py, against a private Postfix +
Dovecot instance of their own (scenario_lab.ScenarioLab: lab.py's Lab plus two
ports whose RCPT and end-of-data replies each test scripts through a Postfix
policy service, one of them calling itself a QQ Mail server).  The database is
the unit suite's FakeQueue (the worker is under test, never a procedure).
Every scenario ends by waiting for Postfix to deliver what it accepted and
counting the copies of each Message-ID per recipient in the Maildir: exactly
one per accepted recipient, or more only where the row carries
PossibleDuplicate (a reclaimed lease, or a reply lost after the final dot:
outcome unknown, at-least-once by design, docs/guarantees.md).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import replace

import pytest
from lab import running_lab
from realmta_helpers import FakeConnection, FakeQueue, account, make_mail, worker
from scenario_lab import QQ_HOST, ScenarioLab, SwallowingProxy

from mailq_db.cli import main as cli_main
from mailq_db.connection import Backoff
from mailq_db.errors import DatabaseError
from mailq_db.worker.classify import RETRY, STOP, classify_reply, resolve_provider
from mailq_db.worker.logs import FIELDS
from mailq_db.worker.loop import Worker
from mailq_db.worker.runner import run_workers
from mailq_db.worker.smtp import SmtpSession

INCIDENT = "451 4.3.0 Temporary server error. Please try again later"


@pytest.fixture(scope="module")
def slab():
    yield from running_lab(ScenarioLab, "mailq-scenarios-", "the scenario lab")


@pytest.fixture(autouse=True)
def _accept_everything(slab):
    slab.script(None)
    yield
    slab.script(None)


# --------------------------------------------------------------------------- helpers


def mail(mail_id: int, to: list[str] | str, **fields) -> object:
    to = [to] if isinstance(to, str) else to
    fields.setdefault("from_address", "mailer@lab.test")
    return make_mail(mail_id, to_address=";".join(to), message_id=f"<v22.{mail_id}@mailq.lab.test>", **fields)


def fast(w: Worker) -> Worker:
    """No real sleeping between database retries (the faults are injected, not waited for)."""
    w.db._sleep = lambda s: None
    w.pause = lambda s: None
    return w


def copies(slab: ScenarioLab) -> dict[str, dict[str, int]]:
    """Message-ID -> recipient -> copies, once Postfix's queue is empty."""
    slab.wait_queue_empty()
    out: dict[str, dict[str, int]] = {}
    import re
    for d in slab.delivered():
        m = re.search(rb"^Message-ID:\s*(\S+)\r?$", d.raw, re.MULTILINE | re.IGNORECASE)
        if m:
            per = out.setdefault(m.group(1).decode(), {})
            per[d.recipient] = per.get(d.recipient, 0) + 1
    return out


def recipients(row) -> list[str]:
    return [r.strip() for r in row.mail.to_address.split(";")]


def once_each(slab: ScenarioLab, queue: FakeQueue, ids=None, *, refused_prefix: str = "nouser") -> None:
    """Every recipient of every (listed) mail has exactly one copy, a refused one none."""
    seen = copies(slab)
    for row in queue.rows.values():
        if ids is not None and row.mail.id not in ids:
            continue
        got = seen.get(row.mail.message_id, {})
        want = {r: 0 if r.startswith(refused_prefix) else 1 for r in recipients(row)}
        assert {r: got.get(r, 0) for r in want} == want, f"mail {row.mail.id}: {got}"


def make_due(queue: FakeQueue) -> None:
    for r in queue.rows.values():
        if r.status == "UnSent":
            r.due = r.due.min


def run_until_final(w: Worker, queue: FakeQueue, rounds: int = 6) -> None:
    for _ in range(rounds):
        w.run(once=True)
        if all(r.status in ("Sent", "Failed") for r in queue.rows.values()):
            return
        make_due(queue)
        queue.blocked_until.clear()
    raise AssertionError(f"not final after {rounds} runs: {queue.statuses()}")


def deadlock() -> DatabaseError:
    return DatabaseError(1205, "Transaction was deadlocked on lock resources with another process")


# --------------------------------------------------------------------------- 1. 452 split, then every ack deadlocks


def test_a_452_split_mail_whose_acknowledgements_deadlock_past_the_connection_retries_arrives_once(slab):
    """53 recipients (Postfix's smtpd_recipient_limit is 50: a follow-up transaction
    after "452 4.5.3 too many recipients"), one unknown.  RecordRecipientOutcomes
    deadlocks 7 times (more than the connection's 5 resends: the worker's own
    retention must carry it), MarkSent then loses its connection after committing
    and meets 6 Azure 40613s.  The mail ends Sent, each accepted recipient has one
    copy, and the mail is never released."""
    rcpts = [f"split-{i:02d}@lab.test" for i in range(52)]
    rcpts.insert(10, "nouser-split@lab.test")
    slab.script(lambda a: "550 5.1.1 No such user" if a.get("protocol_state") == "RCPT"
                and a.get("recipient", "").startswith("nouser") else None)
    queue = FakeQueue([mail(101, rcpts)])
    for _ in range(7):
        queue.fail_next("record_recipient_outcomes", deadlock())
    queue.fail_next("mark_sent", ConnectionResetError("connection reset after commit"), committed=True)
    for _ in range(6):
        queue.fail_next("mark_sent", DatabaseError(40613, "Database is not currently available"))
    w = fast(worker(queue, {"default": account(slab, "hooked")}))
    w.run(once=True)
    row = queue.rows[101]
    assert row.status == "Sent" and not row.possible_duplicate
    assert sorted(o for o, _, _ in row.recipients.values()) == ["Delivered"] * 52 + ["Refused"]
    assert queue.calls_to("release_mail") == []
    assert "queue IDs of its 2 transactions" in row.smtp_text  # the relay's log can be searched for both
    assert len(queue.calls_to("record_recipient_outcomes")) == 8 and len(queue.calls_to("mark_sent")) == 8
    once_each(slab, queue)
    eom = [a for a in slab.hook.requests if a.get("protocol_state") == "END-OF-MESSAGE"]
    assert [a["recipient_count"] for a in eom] == ["50", "2"]  # two transactions on the server


# --------------------------------------------------------------------------- 2. relay window on one account


def test_a_relay_answering_451_for_a_window_pauses_its_account_while_the_other_account_flows(slab):
    """Account "relay" (the hooked port) answers every message with 451 for a window;
    account "healthy" (the mx port) is fine.  With the default escalation (5
    temporary failures within 300 s), the relay's account is paused after 5 tries,
    with its reason in the event stream and no attempt spent, and the healthy
    account's mail, claimed in the same batch behind it, is delivered meanwhile."""
    slab.script(lambda a: INCIDENT if a.get("protocol_state") == "END-OF-MESSAGE" else None)
    relay = [mail(200 + i, f"window-r{i}@lab.test", account_name="relay", priority=9) for i in range(8)]
    healthy = [mail(220 + i, f"window-h{i}@lab.test", account_name="healthy") for i in range(4)]
    queue = FakeQueue([*relay, *healthy])
    w = fast(worker(queue, {"relay": account(slab, "hooked", name="relay"),
                            "healthy": account(slab, "mx", name="healthy")}))
    w.run(once=True)
    tries = [a for a in slab.hook.requests if a.get("protocol_state") == "END-OF-MESSAGE"]
    assert len(tries) == 5
    assert all(queue.rows[m.id].dispositions == ["Wait"] and queue.rows[m.id].attempts_remaining == 5
               for m in relay)
    waits = [c for c in queue.calls_to("mark_failed") if c["disposition"] == "Wait"]
    assert len(waits) == 1 and "escalated: 5 temporary failures" in waits[0]["error"]
    assert "Temporary server error" in waits[0]["error"]
    assert set(queue.blocked_until) == {"relay"}
    assert all(queue.status(m.id) == "Sent" for m in healthy)
    assert all(r.attempts_remaining == 5 for r in queue.rows.values() if r.mail.account_name == "relay")
    slab.script(None)  # the window ends
    run_until_final(w, queue)
    assert all(queue.rows[m.id].attempts_remaining == 4 for m in relay)  # only the attempt that worked
    once_each(slab, queue)


# --------------------------------------------------------------------------- 3. 421 mid-batch


def test_a_421_after_the_dot_in_the_middle_of_a_batch_loses_and_duplicates_nothing(slab):
    """The server answers the third message of six with 421 and hangs up (Postfix:
    a 421 action disconnects at once; the message is not queued).  Every mail
    arrives exactly once; the mails after it go on on a new connection."""
    count = {"eom": 0}

    def decide(a):
        if a.get("protocol_state") == "END-OF-MESSAGE":
            count["eom"] += 1
            if count["eom"] == 3:
                return "421 4.3.2 Service shutting down, closing transmission channel"
        return None

    slab.script(decide)
    queue = FakeQueue([mail(300 + i, f"mid421-{i}@lab.test") for i in range(6)])
    w = fast(worker(queue, {"default": account(slab, "hooked")}))
    run_until_final(w, queue)
    assert set(queue.statuses().values()) == {"Sent"}
    # "421 4.3.2 Service shutting down" is the account's Wait (rule service-closing-421):
    # the third mail and those behind it were given back uncharged, one attempt each was spent
    assert [r.dispositions for r in queue.rows.values()] == [[], [], *[["Wait"]] * 4]
    assert all(r.attempts_remaining == 4 for r in queue.rows.values())
    once_each(slab, queue)
    print(f"\nFIGURE 421 mid-batch: attempts left {[r.attempts_remaining for r in queue.rows.values()]}, "
          f"dispositions {[r.dispositions for r in queue.rows.values()]}")


# --------------------------------------------------------------------------- 4. reply lost after the dot


def test_a_connection_dropped_after_the_final_dot_is_retried_never_lost(slab):
    """A proxy drops the connection in place of the second mail's "250 ... queued
    as": Postfix has it, the worker cannot know.  The mail is recorded as a Retry
    whose reason starts with "outcome unknown", flagged PossibleDuplicate, and sent
    again (same Message-ID): never lost; the other mails arrive once, unflagged."""
    proxy = SwallowingProxy(slab.ports["hooked"], swallow={2})
    try:
        queue = FakeQueue([mail(400 + i, f"dot-{i}@lab.test") for i in range(3)])
        plain = replace(account(slab, "hooked"), port=proxy.port, tls="none", allow_plaintext=True)
        w = fast(worker(queue, {"default": plain}))
        w.run(once=True)
        assert len(proxy.swallowed) == 1
        assert [queue.status(i) for i in (400, 401, 402)] == ["Sent", "UnSent", "Sent"]
        assert queue.rows[401].last_error.startswith("outcome unknown")
        assert [queue.rows[i].possible_duplicate for i in (400, 401, 402)] == [False, True, False]
        assert copies(slab)[queue.rows[401].mail.message_id] == {"dot-1@lab.test": 1}  # the server has it
        run_until_final(w, queue)
    finally:
        proxy.close()
    seen = copies(slab)
    assert seen["<v22.401@mailq.lab.test>"] == {"dot-1@lab.test": 2}  # at-least-once, same Message-ID
    once_each(slab, queue, ids={400, 402})


# --------------------------------------------------------------------------- 5. SIGTERM, acks pending, database down


class _DownQueue(FakeQueue):
    """A FakeQueue whose every call fails as a lost connection while ``down``."""

    down = False

    def _record(self, name, kwargs):
        drop = super()._record(name, kwargs)
        if self.down:
            return (False, ConnectionResetError(f"database down during {name}"))
        return drop


def test_sigterm_while_acknowledgements_are_pending_and_the_database_is_down(slab, caplog):
    """A real SIGTERM to this process after the second of four mails, just as the
    database goes down.  The runner stops: the two sent mails are never released,
    they are left to their leases after ack_shutdown_wait_seconds with one WARNING
    each; the two unsent ones are not sent.  When the database is back and the
    leases expire, the reclaim flags the sent ones PossibleDuplicate."""
    queue = _DownQueue([mail(500 + i, f"term-{i}@lab.test") for i in range(4)])
    stop = threading.Event()
    sent = []

    class TermAfterSecond(SmtpSession):
        def send(self, out):
            result = super().send(out)
            sent.append(out)
            if len(sent) == 2:
                queue.down = True
                os.kill(os.getpid(), signal.SIGTERM)
                assert stop.wait(10), "SIGTERM did not reach the runner's handler"
            return result

    def factory(config, db, **kw):
        db.backoff = Backoff(0.001, 0.002)
        db._sleep = lambda s: None
        w = Worker(config, db, **kw)
        w.session_factory = TermAfterSecond
        return w

    cfg = worker(queue, {"default": account(slab, "hooked")}, ack_shutdown_wait_seconds=1).config
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="mailq_db.worker"):
            code = run_workers(cfg, FakeConnection, procs=queue, stop=stop, concurrency=1,
                               worker_factory=factory, progress_seconds=3600)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    took = time.monotonic() - started
    assert code == 0 and took < 20
    assert [queue.status(500 + i) for i in range(4)] == ["Sending"] * 4  # acks and release both failed
    released = [i for c in queue.calls_to("release_mail") for i in c["ids"]]
    assert 500 not in released and 501 not in released
    given_up = [r for r in caplog.records if "acknowledgement not written" in r.getMessage()]
    assert sorted(getattr(r, FIELDS)["mail_id"] for r in given_up) == [500, 501]
    assert all(r.levelno == logging.WARNING for r in given_up)
    assert sorted(copies(slab).get(f"<v22.{500 + i}@mailq.lab.test>", {}).get(f"term-{i}@lab.test", 0)
                  for i in range(4)) == [0, 0, 1, 1]
    # the database is back; the leases run out; another worker reclaims
    queue.down = False
    queue.expire_leases()
    w = fast(worker(queue, {"default": account(slab, "hooked")}))
    run_until_final(w, queue)
    assert set(queue.statuses().values()) == {"Sent"}
    assert queue.rows[500].possible_duplicate and queue.rows[501].possible_duplicate
    seen = copies(slab)
    for i in range(4):
        n = seen[f"<v22.{500 + i}@mailq.lab.test>"][f"term-{i}@lab.test"]
        assert n == (2 if i < 2 else 1), (i, n)


# --------------------------------------------------------------------------- 6. bad From at RCPT (delay_reject)


def test_bad_from_addresses_refused_at_rcpt_fail_or_pause_only_their_mail(slab):
    """On the mx port Postfix applies its sender rules at RCPT TO (smtpd_delay_reject
    = yes, its default), so a refusal of the From address arrives as a refusal of
    every recipient.  It must be judged as the sender's: the 554 fails that mail
    (not recorded as refused recipients), the 451 pauses that From address (its
    second mail is not even tried), and the account's good mail goes on."""
    blocked = mail(600, ["fromrcpt-a@lab.test", "fromrcpt-b@lab.test"], from_address="blocked-sender@lab.test",
                   priority=9)
    temp = [mail(601 + i, f"fromrcpt-t{i}@lab.test", from_address="tempfail-sender@lab.test", priority=8)
            for i in range(2)]
    good = [mail(610 + i, f"fromrcpt-g{i}@lab.test") for i in range(3)]
    queue = FakeQueue([blocked, *temp, *good])
    w = fast(worker(queue, {"default": account(slab, "mx")}))
    w.run(once=True)
    row = queue.rows[600]
    assert row.status == "Failed" and row.dispositions == ["Stop"] and row.recipients == {}
    assert "Sender address rejected" in row.last_error
    assert [queue.rows[m.id].dispositions for m in temp] == [["Retry"], ["Retry"]]
    assert "is paused" in queue.rows[602].last_error
    assert queue.blocked_until == {}
    assert all(queue.status(m.id) == "Sent" for m in good)
    assert all(r.attempts_remaining == 4 for r in queue.rows.values())
    once_each(slab, queue, ids={m.id for m in good})
    assert "<v22.600@mailq.lab.test>" not in copies(slab)


# --------------------------------------------------------------------------- 7. QQ's 550 frequency limit


def test_qq_frequency_550_is_a_recipient_retry_when_the_server_says_it_is_qq(slab, capsys):
    """QQ Mail answers a recipient that received a lot of mail "550 Mailbox
    unavailable or access denied" (a temporary protection).  The account names no
    provider and its host is 127.0.0.1; the server calls itself *.qq.com in its
    greeting and EHLO reply.  The worker defers that recipient (Retry) and
    delivers the other; the same reply from a server that is not QQ is a Stop
    for the recipient.  `mailq-db classify --provider qq` says the same."""
    seen_once: set[str] = set()

    def decide(a):
        rcpt = a.get("recipient", "")
        if a.get("protocol_state") == "RCPT" and rcpt.startswith("qqfreq") and rcpt not in seen_once:
            seen_once.add(rcpt)
            return "550 Mailbox unavailable or access denied"
        return None

    slab.script(decide)
    queue = FakeQueue([mail(700, "qqfreq-1@lab.test"), mail(701, ["qqok-1@lab.test", "qqfreq-2@lab.test"]),
                       mail(702, "qqfreq-3@lab.test", account_name="plain")])
    w = fast(worker(queue, {"default": account(slab, "qq"), "plain": account(slab, "hooked", name="plain")}))
    w.run(once=True)
    assert queue.rows[700].dispositions == ["Retry"] and queue.status(700) == "UnSent"
    assert queue.rows[701].dispositions == ["Retry"]
    assert {a: o for a, (o, _, _) in queue.rows[701].recipients.items()} == {
        "qqok-1@lab.test": "Delivered", "qqfreq-2@lab.test": "Deferred"}
    assert queue.status(702) == "Failed"  # the same words from a server that is not QQ
    assert resolve_provider(None, "127.0.0.1", f"{QQ_HOST} ESMTP Postfix", QQ_HOST) == "qq"
    assert classify_reply(550, "Mailbox unavailable or access denied", "rcpt", "qq").disposition == RETRY
    assert classify_reply(550, "Mailbox unavailable or access denied", "rcpt", None).disposition == STOP
    assert cli_main(["classify", "550 Mailbox unavailable or access denied", "--provider", "qq", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disposition"] == RETRY
    queue.rows[702].status = "Failed"
    run_until_final(w, queue)
    once_each(slab, queue, ids={700, 701})


# --------------------------------------------------------------------------- 8. slow DATA vs the lease


class _ShortLeases(FakeQueue):
    """A database that grants 3 s per claim and per extension, whatever is asked."""

    def extend_lease(self, conn, *, ids, lock_token, lease_seconds):
        return super().extend_lease(conn, ids=ids, lock_token=lock_token, lease_seconds=3)


def test_a_server_slower_than_the_lease_to_accept_the_message_keeps_the_lease(slab):
    """The server takes 4.5 s to accept the message after the final dot; the
    database grants 3 s leases.  Another worker claims every 0.2 s meanwhile.
    The worker keeps extending while it waits for the reply: the other worker
    never gets the mail, MarkSent is accepted, one copy, no PossibleDuplicate."""
    def decide(a):
        if a.get("protocol_state") == "END-OF-MESSAGE":
            time.sleep(4.5)
        return None

    slab.script(decide)
    queue = _ShortLeases([mail(800, "slowdata-1@lab.test")], lease_override_seconds=3)
    stolen: list = []
    done = threading.Event()

    def other_worker():
        while not done.wait(0.2):
            stolen.extend(queue.claim_mail(None, batch_size=5, lock_token="00000000-0000-0000-0000-0000000000ff",
                                           lease_seconds=60))

    class Watched(SmtpSession):
        def send(self, out):
            threading.Thread(target=other_worker, daemon=True).start()
            try:
                return super().send(out)
            finally:
                done.set()

    w = fast(worker(queue, {"default": account(slab, "hooked")}, lease_seconds=10,
                    lease_safety_margin_seconds=2))
    w.session_factory = Watched
    started = time.monotonic()
    w.run(once=True)
    assert time.monotonic() - started >= 4.5
    assert stolen == []
    assert queue.status(800) == "Sent" and not queue.rows[800].possible_duplicate
    assert len(queue.calls_to("extend_lease")) >= 3
    once_each(slab, queue)


# --------------------------------------------------------------------------- 9. M2 and M1 on the real server


def test_every_recipient_refused_with_mixed_4xx_and_5xx_retries_the_4xx_one_only(slab):
    """RCPT: one unknown user (550 5.1.1), one greylisted (450).  Nobody accepted.
    The mail is a Retry, not a Stop; the next attempt names only the greylisted
    recipient; it arrives once, the unknown one never."""
    grey_seen: set[str] = set()

    def decide(a):
        rcpt = a.get("recipient", "")
        if a.get("protocol_state") != "RCPT":
            return None
        if rcpt.startswith("nouser"):
            return "550 5.1.1 No such user"
        if rcpt.startswith("grey") and rcpt not in grey_seen:
            grey_seen.add(rcpt)
            return "450 4.2.0 Greylisted, please try again later"
        return None

    slab.script(decide)
    queue = FakeQueue([mail(900, ["nouser-mixed@lab.test", "grey-mixed@lab.test"])])
    w = fast(worker(queue, {"default": account(slab, "hooked")}))
    w.run(once=True)
    row = queue.rows[900]
    assert row.dispositions == ["Retry"] and row.status == "UnSent"
    assert {a: o for a, (o, _, _) in row.recipients.items()} == {
        "nouser-mixed@lab.test": "Refused", "grey-mixed@lab.test": "Deferred"}
    slab.hook.requests.clear()
    run_until_final(w, queue)
    assert [a["recipient"] for a in slab.hook.requests if a.get("protocol_state") == "RCPT"] == \
        ["grey-mixed@lab.test"]
    once_each(slab, queue)


def test_a_failed_follow_up_transaction_never_gives_the_first_recipients_a_second_copy(slab):
    """55 recipients: 50 in the first transaction, 5 in a follow-up after 452; the
    follow-up's message is answered 451.  Meanwhile RecordRecipientOutcomes
    deadlocks past the connection's retries and MarkFailed loses its connection
    after committing.  The next attempt goes to the 5 only: one copy each."""
    count = {"eom": 0}

    def decide(a):
        if a.get("protocol_state") == "END-OF-MESSAGE":
            count["eom"] += 1
            if count["eom"] == 2:
                return "451 4.3.0 Temporary failure, try again"
        return None

    slab.script(decide)
    rcpts = [f"follow-{i:02d}@lab.test" for i in range(55)]
    queue = FakeQueue([mail(950, rcpts)])
    for _ in range(6):
        queue.fail_next("record_recipient_outcomes", deadlock())
    queue.fail_next("mark_failed", ConnectionResetError("reset after commit"), committed=True)
    w = fast(worker(queue, {"default": account(slab, "hooked")}))
    w.run(once=True)
    row = queue.rows[950]
    assert row.dispositions == ["Retry"]
    outcomes = [o for o, _, _ in row.recipients.values()]
    assert outcomes.count("Delivered") == 50 and outcomes.count("Deferred") == 5
    run_until_final(w, queue)
    once_each(slab, queue)


# --------------------------------------------------------------------------- 10. relay window at RCPT


def test_a_relay_answering_451_to_every_rcpt_for_a_window_pauses_the_account_and_spends_no_attempt(slab):
    """The same bad minutes, but the relay says it at RCPT TO (a relay whose own
    back end fails answers every recipient "451 4.3.0 Temporary server error").
    No recipient is at fault: after the escalation's 5 temporary failures the
    account waits, and no mail spends an attempt (before the fix every mail was
    a charged Retry and the account never paused: ~7.5 minutes of this failed
    the queue)."""
    slab.script(lambda a: INCIDENT if a.get("protocol_state") == "RCPT" else None)
    queue = FakeQueue([mail(1000 + i, f"rcptwin-{i}@lab.test") for i in range(8)])
    w = fast(worker(queue, {"default": account(slab, "hooked")}))
    w.run(once=True)
    rcpts = [a for a in slab.hook.requests if a.get("protocol_state") == "RCPT"]
    assert len(rcpts) == 5
    assert set(queue.blocked_until) == {"default"}
    assert [r.dispositions for r in queue.rows.values()] == [["Wait"]] * 8
    assert all(r.attempts_remaining == 5 for r in queue.rows.values())
    waits = [c for c in queue.calls_to("mark_failed") if c["disposition"] == "Wait"]
    assert "escalated: 5 temporary failures" in waits[0]["error"] and "Temporary server error" in waits[0]["error"]
    slab.script(None)
    run_until_final(w, queue)
    assert all(r.attempts_remaining == 4 for r in queue.rows.values())
    once_each(slab, queue)
