"""The Python side of mailq.ClaimMail / ExtendLease's LeaseSecondsRemaining,
FinalizeMail's Busy, GetQueueStats' window and GetEventStreamStall: what the
wrappers send and how they read the result sets, and how `mailq-db doctor`
and `mailq-db events` report a stalled event stream.

The connection here is a stand-in that replays result sets shaped like the
procedures' (tests/integration runs the procedures on SQL Server); nothing
here claims anything about the T-SQL.
"""

from __future__ import annotations

import io
import uuid
from datetime import datetime

import pytest
from fake_queue import FakeConnection, FakeQueue, make_mail

from mailq_db import procedures
from mailq_db.cli import main
from mailq_db.commands import doctor, events
from mailq_db.errors import DatabaseError


class Row(tuple):
    """A pyodbc-like row: by index and by column name."""

    def __new__(cls, names, values):
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getattr__(self, name):
        try:
            return self[self._names.index(name)]
        except ValueError:
            raise AttributeError(name) from None


class Cursor:
    def __init__(self, conn):
        self.conn = conn
        self.sets: list = []

    def execute(self, sql, *params):
        self.conn.calls.append((sql, list(params)))
        self.sets = list(self.conn.sets)
        return self

    @property
    def description(self):
        return [(n,) for n in self.sets[0][0]] if self.sets else None

    def fetchall(self):
        names, rows = self.sets[0]
        return [Row(names, r) for r in rows]

    def fetchone(self):
        names, rows = self.sets[0]
        self.sets[0] = (names, rows[1:])
        return Row(names, rows[0]) if rows else None

    def nextset(self):
        self.sets.pop(0)
        return bool(self.sets)

    def close(self):
        pass


class Conn:
    def __init__(self, *sets):
        self.sets = sets
        self.calls: list = []

    def cursor(self):
        return Cursor(self)


CLAIM_COLUMNS = (
    "ID", "MessageID", "AccountName", "AppName", "FromName", "FromAddress", "ReplyTo", "ToAddress", "CC", "BCC",
    "Subject", "Body", "BodyFormat", "TextBody", "Headers", "Priority", "AttemptNo", "AttemptsRemaining",
    "LeaseExpiresUtc", "PossibleDuplicate", "dtStamp", "RunMode", "DryRun", "TemplateName", "TemplateVersion",
    "TemplateModel", "LeaseSecondsRemaining",
)


def test_claim_mail_reads_lease_seconds_remaining_from_the_last_column():
    lease = datetime(2030, 1, 1, 12, 5)
    row = (7, "<7@x>", "default", None, None, "a@x.org", None, "b@x.org", None, None, "S", "B", "Text", None,
           None, 5, 1, 4, lease, False, datetime(2030, 1, 1), "prod", False, None, None, None, 299)
    conn = Conn((CLAIM_COLUMNS, [row]), (("MailID",), []), (("TemplateName",), []))
    (mail,) = procedures.claim_mail(conn, batch_size=1, lock_token=uuid.uuid4(), lease_seconds=300)
    assert mail.lease_seconds_remaining == 299 and mail.lease_expires_utc == lease


def _claimed_row(mail_id, body="B"):
    return (mail_id, f"<{mail_id}@x>", "default", None, None, "a@x.org", None, "b@x.org", None, None, "S", body,
            "Text", None, None, 5, 1, 4, datetime(2030, 1, 1, 12, 5), False, datetime(2030, 1, 1), "prod", False,
            None, None, None, 299)


ATTACHMENT_COLUMNS = ("MailID", "AttachmentNo", "FileName", "ContentType", "Content", "Generator", "GeneratorArgs")


def test_claim_mail_reads_content_within_the_batch_budget_in_claim_order():
    """Bodies in claim order (3, 1, 2), then attachments by mail ID: mail 1's piece fits; mail
    2's next piece would pass the budget and nothing was claimed after mail 2, so mail 2 drops
    what it held and keeps nothing more; mail 3's piece, last to arrive, evicts mail 1 (claimed
    after it) and fits.  Sizes of mails given up are still counted for the next claim."""
    big = bytes(600_000)
    conn = Conn((CLAIM_COLUMNS, [_claimed_row(3), _claimed_row(1), _claimed_row(2)]),
                (ATTACHMENT_COLUMNS, [(1, 1, "a", None, big, None, None), (2, 1, "b", None, bytes(10), None, None),
                                      (2, 2, "c", None, big, None, None), (2, 3, "d", None, big, None, None),
                                      (2, 4, "e", None, None, "csv", None), (3, 1, "f", None, big, None, None),
                                      (9, 1, "g", None, big, None, None)]),  # a mail not in the first set
                (("TemplateName",), []))
    mails = procedures.claim_mail(conn, batch_size=3, lock_token=uuid.uuid4(), lease_seconds=300,
                                  max_batch_bytes=1_000_000)
    by_id = {m.id: m for m in mails}
    assert [m.id for m in mails] == [3, 1, 2]
    assert [a.file_name for a in by_id[3].attachments] == ["f"] and not by_id[3].over_budget
    assert by_id[1].over_budget and by_id[1].attachments == [] and by_id[1].content_bytes == 1 + 600_000
    assert by_id[2].over_budget and by_id[2].attachments == [] and by_id[2].body == ""
    assert by_id[2].content_bytes == 1 + 10 + 2 * 600_000
    assert sum(procedures.held_bytes(m) for m in mails) == 1 + 600_000  # within the budget


def test_the_first_mail_is_kept_whole_even_alone_past_the_budget():
    conn = Conn((CLAIM_COLUMNS, [_claimed_row(5), _claimed_row(4)]),
                (ATTACHMENT_COLUMNS, [(4, 1, "small", None, bytes(100), None, None),
                                      (5, 1, "huge", None, bytes(2_000_000), None, None)]),
                (("TemplateName",), []))
    first, second = procedures.claim_mail(conn, batch_size=2, lock_token=uuid.uuid4(), lease_seconds=300,
                                          max_batch_bytes=1_000_000)
    assert [a.file_name for a in first.attachments] == ["huge"] and not first.over_budget
    assert second.over_budget and second.attachments == []


def test_a_mail_that_cannot_fit_evicts_no_one():
    """Mail 2 (claimed second) has more than the budget: it is given up without evicting
    mail 3 (claimed after it), which fits beside the first mail."""
    conn = Conn((CLAIM_COLUMNS, [_claimed_row(1), _claimed_row(2), _claimed_row(3)]),
                (ATTACHMENT_COLUMNS, [(1, 1, "a", None, bytes(100), None, None),
                                      (3, 1, "c", None, bytes(100), None, None),
                                      (2, 1, "b", None, bytes(2_000_000), None, None)]),
                (("TemplateName",), []))
    mails = procedures.claim_mail(conn, batch_size=3, lock_token=uuid.uuid4(), lease_seconds=300,
                                  max_batch_bytes=1_000_000)
    assert [m.id for m in mails if m.over_budget] == [2]


def test_the_budget_counts_what_text_takes_in_memory_not_its_length():
    """Python keeps a str at 1, 2 or 4 bytes a character (PEP 393): 400,000 Chinese characters
    take 800,000 bytes, so with a 1,000,000-byte budget the second such body is over it (by
    len() both fit, and the batch would hold twice what the budget says)."""
    chinese = "\u4f60\u597d" * 200_000
    conn = Conn((CLAIM_COLUMNS, [_claimed_row(1, chinese), _claimed_row(2, chinese)]),
                (ATTACHMENT_COLUMNS, []), (("TemplateName",), []))
    mails = procedures.claim_mail(conn, batch_size=2, lock_token=uuid.uuid4(), lease_seconds=300,
                                  max_batch_bytes=1_000_000)
    first, second = mails
    assert procedures.held_bytes(first) >= 800_000 and not first.over_budget
    assert second.over_budget and second.body == "" and second.content_bytes >= 800_000


def test_claim_mail_without_a_budget_keeps_everything():
    conn = Conn((CLAIM_COLUMNS, [_claimed_row(1), _claimed_row(2)]),
                (ATTACHMENT_COLUMNS, [(1, 1, "a", None, bytes(900), None, None),
                                      (2, 1, "b", None, bytes(900), None, None)]),
                (("TemplateName",), []))
    mails = procedures.claim_mail(conn, batch_size=2, lock_token=uuid.uuid4(), lease_seconds=300)
    assert [len(m.attachments) for m in mails] == [1, 1] and not any(m.over_budget for m in mails)


def test_extend_lease_returns_expiry_and_seconds_per_mail():
    lease = datetime(2030, 1, 1, 12, 10)
    conn = Conn((("ID", "LeaseExpiresUtc", "LeaseSecondsRemaining"), [(7, lease, 119), (8, lease, 119)]))
    got = procedures.extend_lease(conn, ids=[7, 8], lock_token=uuid.uuid4(), lease_seconds=120)
    assert got == {7: procedures.Lease(lease, 119), 8: procedures.Lease(lease, 119)}


def test_extend_lease_from_a_database_that_does_not_report_seconds():
    lease = datetime(2030, 1, 1, 12, 10)
    conn = Conn((("ID", "LeaseExpiresUtc"), [(7, lease)]))
    assert procedures.extend_lease(conn, ids=[7], lock_token=uuid.uuid4(), lease_seconds=120) == {
        7: procedures.Lease(lease, None)}


def test_finalize_mail_reads_busy():
    conn = Conn((("FailedCount", "ExpiredCount", "MoreLeft", "Busy"), [(0, 3, False, True)]))
    assert procedures.finalize_mail(conn) == procedures.FinalizeResult(0, 3, False, True)


def test_get_queue_stats_sends_the_window_and_reads_four_sets():
    conn = Conn(
        (("Status", "AccountName", "MailCount"), [("UnSent", "default", 3)]),
        (("AccountName", "OldestDueUtc", "OldestDueAgeSeconds", "DueCount"), []),
        (("HourUtc", "AccountName", "Sent", "Failed", "Expired", "Cancelled", "Stopped"),
         [(datetime(2030, 1, 1, 12), "default", 10, 1, 0, 0, 0)]),
        (("ID",), []),
    )
    stats = procedures.get_queue_stats(conn, recent_failures=5, finished_hours=48)
    assert conn.calls[0] == (procedures.STATS_SQL, [5, 48])
    assert stats.queued == [{"Status": "UnSent", "AccountName": "default", "MailCount": 3}]
    assert stats.finished_per_hour[0]["Sent"] == 10 and stats.failures == []


STALL_HEAD = ("HeldBack", "MinActiveRowversion", "NextRowversion", "CanSeeTransactions", "Permission",
              "OldestOpenSeconds")
STALL_ROWS = ("SessionID", "TransactionID", "TransactionName", "OpenSinceUtc", "OpenSeconds", "State",
              "SessionStatus", "ProgramName", "HostName", "LoginName", "LogRecords")


def test_get_event_stream_stall_reads_the_summary_and_the_holders():
    since = datetime(2030, 1, 1, 11, 0)
    conn = Conn(
        ((STALL_HEAD), [(True, 5000, 5123, True, "VIEW SERVER STATE", 3600)]),
        (STALL_ROWS, [(57, 9001, "user_transaction", since, 3600, "active", "sleeping", "billing-api",
                       "app01", "billing", 12)]),
    )
    stall = procedures.get_event_stream_stall(conn, min_open_seconds=60)
    assert conn.calls[0] == (procedures.EVENT_STREAM_STALL_SQL, [60])
    assert stall.held_back and stall.min_active_rowversion == 5000 and stall.oldest_open_seconds == 3600
    (holder,) = stall.holders
    text = holder.describe()
    for part in ("session 57", "2030-01-01 11:00:00 UTC", "3600 s", "program 'billing-api'", "host app01",
                 "login billing", "sleeping"):
        assert part in text, text


# -- the unit-test fake keeps the contract the worker relies on ---------------


def test_fake_queue_returns_lease_seconds_remaining_at_claim_and_extension():
    queue = FakeQueue([make_mail(1)])
    token = uuid.uuid4()
    (mail,) = queue.claim_mail(None, batch_size=1, lock_token=token, lease_seconds=120)
    assert mail.lease_seconds_remaining == 120
    ext = queue.extend_lease(None, ids=[1], lock_token=token, lease_seconds=300)
    assert ext[1].seconds_remaining == 300 and ext[1].expires_utc == queue.rows[1].lease_expires


# -- doctor -------------------------------------------------------------------


def holder(tid=9001, seconds=3600, session=57):
    return procedures.RowversionHolder(session, tid, None, datetime(2030, 1, 1, 11), seconds, "active",
                                       "sleeping", "billing-api", "app01", "billing", 12)


def stall(held=True, see=True, holders=(), min_active=5000):
    return procedures.EventStreamStall(held, min_active, 5123, see, "VIEW SERVER STATE", None, list(holders))


class StallQueue(FakeQueue):
    def __init__(self, answers):
        super().__init__()
        self.answers = list(answers)

    def get_event_stream_stall(self, conn, *, min_open_seconds=None):
        self.calls.append(("get_event_stream_stall", {"min_open_seconds": min_open_seconds}))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def doctor_queue(monkeypatch):
    def install(*answers):
        queue = StallQueue(answers)
        monkeypatch.setattr(doctor, "procedures", queue)
        return queue
    return install


def test_doctor_stall_ok_when_nothing_is_held_back(doctor_queue):
    queue = doctor_queue(stall(held=False))
    (check,) = doctor.stall_checks(None, sleep=lambda s: None)
    assert check.status == "OK"
    assert queue.calls[0][1] == {"min_open_seconds": doctor.STALL_SECONDS}


def test_doctor_stall_names_the_oldest_holder(doctor_queue):
    doctor_queue(stall(holders=[holder(), holder(tid=9002, seconds=90, session=61)]))
    (check,) = doctor.stall_checks(None, sleep=lambda s: None)
    assert check.status == "WARN"
    assert "session 57" in check.detail and "billing-api" in check.detail and "1 more" in check.detail
    assert "KILL" in check.fix and "commit or roll back" in check.fix


def test_doctor_stall_a_write_in_flight_is_ok(doctor_queue):
    doctor_queue(stall(holders=[]))
    assert doctor.stall_checks(None, sleep=lambda s: None)[0].status == "OK"


def test_doctor_stall_without_permission_samples_twice(doctor_queue):
    slept = []
    doctor_queue(stall(see=False), stall(see=False))
    (check,) = doctor.stall_checks(None, sleep=slept.append)
    assert slept == [doctor.STALL_RESAMPLE_SECONDS]
    assert check.status == "WARN" and "VIEW SERVER STATE" in check.detail and "GRANT VIEW SERVER STATE" in check.fix
    doctor_queue(stall(see=False), stall(see=False, min_active=5200))
    assert doctor.stall_checks(None, sleep=lambda s: None)[0].status == "OK"


def test_doctor_stall_not_deployed_or_not_granted(doctor_queue):
    doctor_queue(DatabaseError(2812, "Could not find stored procedure 'mailq.GetEventStreamStall'."))
    assert doctor.stall_checks(None, sleep=lambda s: None) == []
    doctor_queue(DatabaseError(229, "The EXECUTE permission was denied on the object 'GetEventStreamStall'"))
    (check,) = doctor.stall_checks(None, sleep=lambda s: None)
    assert check.status == "WARN" and "cannot check" in check.detail


# -- mailq-db events ------------------------------------------------------------


def test_stall_watch_names_each_holder_once_and_at_most_every_interval():
    answers = [stall(holders=[holder()]), stall(holders=[holder()]), stall(held=False)]
    now = [0.0]
    out = io.StringIO()
    watch = events.StallWatch(lambda: answers.pop(0), every=30, out=out, clock=lambda: now[0])
    watch()
    watch()            # within 30 s: no second look
    now[0] = 31
    watch()            # same transaction: not repeated
    now[0] = 62
    watch()            # flows again
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "session 57" in lines[0] and "held back" in lines[0]
    assert answers == []


def test_stall_watch_without_permission_speaks_after_two_looks_at_one_value():
    answers = [stall(see=False), stall(see=False)]
    now = [0.0]
    out = io.StringIO()
    watch = events.StallWatch(lambda: answers.pop(0), every=30, out=out, clock=lambda: now[0])
    watch()
    assert out.getvalue() == ""
    now[0] = 30
    watch()
    assert "VIEW SERVER STATE" in out.getvalue()


def test_stall_watch_goes_quiet_when_the_procedure_cannot_be_called():
    calls = []

    def check():
        calls.append(1)
        raise DatabaseError(229, "permission denied")
    watch = events.StallWatch(check, every=0, out=io.StringIO())
    watch()
    watch()
    assert calls == [1]


def test_events_command_reports_the_holder_on_stderr(monkeypatch, capsys):
    queue = StallQueue([stall(holders=[holder()])])
    monkeypatch.setattr(events, "procedures", queue)
    monkeypatch.setattr(events, "connect", lambda *a, **k: FakeConnection())
    queue.get_mail_events = lambda conn, **kw: []
    assert main(["events", "--app", "billing"]) == 0
    err = capsys.readouterr().err
    assert "held back" in err and "session 57" in err
    assert queue.calls[-1] == ("get_event_stream_stall", {"min_open_seconds": events.STALL_SECONDS})
