"""FakeDashboardData: a test double of the dashboard's DATABASE LAYER
(mailq_db.dashboard.data.DatabaseData), not a test of it.  It returns fixed,
realistic result sets shaped like mailq.GetQueueMetrics, GetMailHistory,
GetMailEvents and FindMail, and records the actions asked of it.  The
procedures themselves are tested against SQL Server
(tests/integration/test_mailq_monitoring.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from mailq_db.dashboard.data import ActionOutcome, ActionRefused, MailStory, Overview
from mailq_db.procedures import MailEvent, MailHistory, QueueMetrics

NOW = datetime(2026, 11, 27, 9, 30, 12)
WINDOW_END = datetime(2026, 11, 27, 9, 30)


def queue_metrics(caller_is_admin: bool = False) -> QueueMetrics:
    minutes = [WINDOW_END - timedelta(minutes=n) for n in (3, 2, 1)]
    attempts = []
    for i, minute in enumerate(minutes):
        attempts += [
            {"MinuteUtc": minute, "AccountName": "default", "Outcome": "Sent", "ReplyClass": "2xx", "Attempts": 20 + i},
            {"MinuteUtc": minute, "AccountName": "default", "Outcome": "Retry", "ReplyClass": "4xx", "Attempts": 2},
            {"MinuteUtc": minute, "AccountName": "bulk", "Outcome": "Wait", "ReplyClass": "4xx", "Attempts": 5},
        ]
    attempts.append({"MinuteUtc": minutes[2], "AccountName": "default", "Outcome": "Stop", "ReplyClass": "5xx",
                     "Attempts": 1})
    return QueueMetrics(
        NOW, WINDOW_END - timedelta(minutes=3), WINDOW_END, caller_is_admin,
        depth=[
            {"AccountName": "bulk", "RunMode": "prod", "Status": "Sending", "MailCount": 0},
            {"AccountName": "bulk", "RunMode": "prod", "Status": "UnSent", "MailCount": 12},
            {"AccountName": "default", "RunMode": "prod", "Status": "Sending", "MailCount": 3},
            {"AccountName": "default", "RunMode": "prod", "Status": "UnSent", "MailCount": 42},
            {"AccountName": "default", "RunMode": "staging", "Status": "Sending", "MailCount": 0},
            {"AccountName": "default", "RunMode": "staging", "Status": "UnSent", "MailCount": 5},
        ],
        sendable=[
            {"AccountName": "bulk", "RunMode": "prod", "DueCount": 12, "IsBlocked": True, "SendableCount": 0,
             "OldestSendableUtc": None, "OldestSendableAgeSeconds": 0},
            {"AccountName": "default", "RunMode": "prod", "DueCount": 40, "IsBlocked": False, "SendableCount": 40,
             "OldestSendableUtc": NOW - timedelta(seconds=754), "OldestSendableAgeSeconds": 754},
            {"AccountName": "default", "RunMode": "staging", "DueCount": 0, "IsBlocked": False, "SendableCount": 0,
             "OldestSendableUtc": None, "OldestSendableAgeSeconds": 0},
        ],
        accounts=[
            {"AccountName": "bulk", "IsBlocked": True, "BlockedUntilUtc": NOW + timedelta(seconds=1800),
             "BlockedSecondsLeft": 1800, "BlockReason": "421 4.7.0 Too many connections <script>x</script>",
             "PerMinuteLimit": 30, "PerHourLimit": None, "PerDayLimit": 10000},
            {"AccountName": "default", "IsBlocked": False, "BlockedUntilUtc": None, "BlockedSecondsLeft": 0,
             "BlockReason": None, "PerMinuteLimit": None, "PerHourLimit": None, "PerDayLimit": None},
        ],
        attempts=attempts,
    )


def delay_row() -> dict[str, Any]:
    return {"PendingTasks": 7, "OverdueTasks": 2, "HeldTasks": 0, "FailedTasks": 1, "QueueReceiveEnabled": 1,
            "BrokerEnabled": 1}


def mail_story(mail_id: int) -> MailStory:
    t0 = datetime(2026, 11, 27, 9, 0, 0)
    mail = {
        "ID": mail_id, "MessageID": f"<{mail_id}.abc@mailq.example>", "AccountName": "default", "AppName": "billing",
        "RunMode": "prod", "Status": "Sent", "Priority": 5, "FromAddress": "billing@example.com",
        "ToAddress": "ann@example.org; bob@example.net", "CC": None, "BCC": None, "Subject": "Invoice 2026-117",
        "EnqueuedAtUtc": t0, "DateToProcess": t0, "VisibleAtUtc": t0 + timedelta(seconds=95),
        "SentAtUtc": t0 + timedelta(seconds=95), "DateProcessed": t0 + timedelta(seconds=95), "ExpiresAtUtc": None,
        "AttemptCount": 2, "AttemptsRemaining": 3, "PossibleDuplicate": False, "DryRun": False, "LastError": None,
        "TemplateName": None, "TemplateVersion": None,
    }
    attempts = [
        {"AttemptNo": 1, "WorkerName": "host1/0", "StartedAtUtc": t0 + timedelta(seconds=1),
         "EndedAtUtc": t0 + timedelta(seconds=2), "Outcome": "Retry", "SmtpCode": 451,
         "ErrorText": "451 4.3.0 Temporary lookup failure", "TemplateVersion": None},
        {"AttemptNo": 2, "WorkerName": "host1/1", "StartedAtUtc": t0 + timedelta(seconds=94),
         "EndedAtUtc": t0 + timedelta(seconds=95), "Outcome": "Sent", "SmtpCode": 250,
         "ErrorText": "250 2.0.0 Ok: queued as 4XyZ12AbC", "TemplateVersion": None},
    ]
    recipients = [
        {"Address": "ann@example.org", "Outcome": "Delivered", "SmtpCode": 250, "SmtpText": "2.1.5 Ok",
         "AttemptNo": 2, "UpdatedAtUtc": t0 + timedelta(seconds=95)},
    ]
    kinds = [("Enqueued", "UnSent", 0, None, None, 0), ("Claimed", "Sending", 1, None, "host1/0", 1),
             ("RetryScheduled", "UnSent", 1, 451, "451 4.3.0 Temporary lookup failure", 2),
             ("Claimed", "Sending", 2, None, "host1/1", 94),
             ("Sent", "Sent", 2, 250, "250 2.0.0 Ok: queued as 4XyZ12AbC", 95)]
    events = [MailEvent(1000 + i, mail_id, "billing", kind, status, attempt, code, detail,
                        t0 + timedelta(seconds=sec))
              for i, (kind, status, attempt, code, detail, sec) in enumerate(kinds)]
    return MailStory(MailHistory(mail, attempts, recipients), events)


class FakeDashboardData:
    def __init__(self, *, admin: bool = False, refuse_in_database: bool | None = None) -> None:
        self.admin = admin
        #: the database refuses actions (error 229) unless told otherwise: default = not admin
        self.refuse_in_database = (not admin) if refuse_in_database is None else refuse_in_database
        self.calls: list[tuple[str, Any]] = []
        self.unsent = [101, 102, 103]
        self.failed = [201, 202]

    def overview(self) -> Overview:
        self.calls.append(("overview", None))
        return Overview(queue_metrics(self.admin), delay_row())

    def mail_story(self, mail_id: int) -> MailStory:
        self.calls.append(("mail_story", mail_id))
        if mail_id >= 900000:
            return MailStory(MailHistory(None, [], []), [])
        return mail_story(mail_id)

    def find_mail(self, *, status: str, account_name: str | None, run_mode: str | None,
                  max_rows: int) -> list[dict[str, Any]]:
        self.calls.append(("find_mail", (status, account_name, run_mode, max_rows)))
        ids = self.unsent if status == "UnSent" else self.failed if status == "Failed" else []
        return [{"ID": i, "MessageID": f"<{i}@x>", "AccountName": account_name or "default", "RunMode": "prod",
                 "Status": status, "Subject": f"mail {i}", "EnqueuedAtUtc": NOW, "DateProcessed": None,
                 "AttemptCount": 1, "LastError": "550 5.1.1 no such user" if status == "Failed" else None}
                for i in ids[:max_rows]]

    def caller_is_admin(self) -> bool:
        self.calls.append(("caller_is_admin", None))
        return self.admin

    def _act(self, name: str, ids: list[int]) -> ActionOutcome:
        self.calls.append((name, list(ids)))
        if self.refuse_in_database:
            raise ActionRefused(f"The EXECUTE permission was denied on the object '{name}Mail'")
        return ActionOutcome(done=ids[:-1], skipped={ids[-1]: "Mail is Sending; only an UnSent mail can be cancelled."}
                             if ids else {})

    def cancel(self, ids: list[int]) -> ActionOutcome:
        return self._act("cancel", ids)

    def requeue(self, ids: list[int]) -> ActionOutcome:
        return self._act("requeue", ids)

    def unblock(self, account_name: str) -> int:
        self.calls.append(("unblock", account_name))
        if self.refuse_in_database:
            raise ActionRefused("The EXECUTE permission was denied on the object 'UnblockSendingAccount'")
        return 12
