"""One small function per public procedure of mailq-db.

Each function sends exactly one ``EXEC schema.Procedure @Name = ?, ...`` with
named parameters and returns plain Python values.  Nothing else in the package
touches data.  tests/static/test_exec_contract.py reads every ``EXEC`` in
``src/`` and proves that it names an existing procedure, only its parameters,
and every parameter that has no default.

Conventions shared with the procedures:

* Optional parameters are always sent; the procedures treat NULL as "use the
  default", so a wrapper never needs a second SQL text.
* Mail IDs go to the procedures as ``@IDList``, a JSON array of integers, so
  one call acknowledges every mail sent on one SMTP connection.
* Times are naive ``datetime`` values in UTC (``DATETIME2(3)`` columns).
* SQL Server errors are translated by :func:`mailq_db.errors.from_driver_error`.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Sequence

from .errors import DatabaseError, from_driver_error

try:  # pyodbc needs libodbc.so.2; the static tests import this module without it.
    import pyodbc

    _DRIVER_ERRORS: tuple[type[BaseException], ...] = (pyodbc.Error,)
except ImportError:  # pragma: no cover - depends on the machine
    _DRIVER_ERRORS = ()


# --------------------------------------------------------------------------
# Plain return types
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    file_name: str
    content: bytes
    content_type: str = "application/octet-stream"


@dataclass(frozen=True)
class LazyAttachment:
    """An attachment produced at send time by a generator: an
    entry point of the group ``mailq_db.attachment_generators`` called with
    ``arguments`` (a JSON object).  Enqueue it like an :class:`Attachment`;
    mailq.ClaimMail returns it in ``ClaimedMail.attachments`` until the worker
    replaces it by what the generator made."""

    file_name: str
    generator: str
    arguments: dict[str, Any] | str | None = None  # a dict, or JSON object text
    content_type: str | None = None  # None: the generator's, else application/octet-stream


@dataclass(frozen=True)
class ClaimedTemplate:
    """One template version a claimed batch renders (ClaimMail's third result
    set); attribute names as :class:`MailTemplateRow`, so
    ``templates.MailTemplate.from_row`` takes it."""

    template_name: str
    version: int
    subject_template: str
    html_template: str | None
    text_template: str | None


@dataclass(frozen=True)
class EnqueueResult:
    mail_id: int
    message_id: str
    created: bool  # False when an existing idempotency key returned an earlier mail


@dataclass
class ClaimedMail:
    id: int
    message_id: str
    account_name: str
    app_name: str | None
    from_name: str | None
    from_address: str
    reply_to: str | None
    to_address: str
    cc: str | None
    bcc: str | None
    subject: str
    body: str
    body_format: str  # 'Text' or 'Html'
    text_body: str | None
    headers: dict[str, str]
    priority: int
    attempt_no: int
    attempts_remaining: int
    lease_expires_utc: datetime
    possible_duplicate: bool
    dt_stamp: datetime
    attachments: list[Attachment | LazyAttachment] = field(default_factory=list)
    # Mail enqueued with a template.  template_version is the
    # version this attempt renders (None with a template_name: none to render,
    # e.g. the template was retired and the mail pinned no version); template
    # holds its texts.  subject and body are '' until the worker renders them.
    template_name: str | None = None
    template_version: int | None = None
    template_model: str | None = None
    template: ClaimedTemplate | None = None
    #: The mail's run mode (docs/run-modes.md), and DryRun = the
    #: application is in dry-run: the worker must not send it (MarkSent records
    #: it as DryRun whatever the worker reports).
    run_mode: str = "prod"
    dry_run: bool = False
    #: the seconds of lease the database granted, by its own clock (ClaimMail's
    #: LeaseSecondsRemaining); None from a database that does not report it
    lease_seconds_remaining: int | None = None
    #: bytes of content counted while the claim was read (bodies, model, stored
    #: attachments), also of content not kept; over_budget: the batch's memory budget
    #: was full, so its content was dropped as it arrived and it must be given back
    content_bytes: int = 0
    over_budget: bool = False


_EMPTY_STR = sys.getsizeof("")


def _text_bytes(text: str | None) -> int:
    """What a str's characters take in memory: 1, 2 or 4 bytes each by its widest one
    (PEP 393), not len(): a Chinese body takes 2 bytes a character, one emoji makes it 4."""
    return max(0, sys.getsizeof(text) - _EMPTY_STR) if text else 0


def held_bytes(mail: ClaimedMail) -> int:
    """About what a claimed mail holds in memory: bodies, model and stored attachment content."""
    size = _text_bytes(mail.body) + _text_bytes(mail.text_body) + _text_bytes(mail.template_model)
    return size + sum(len(a.content) for a in mail.attachments if isinstance(a, Attachment))


class ClaimBudget:
    """Admits a claimed batch's content within a byte budget, piece by piece in the order
    ClaimMail returns it (bodies in claim order, then attachments by mail ID), keeping the
    claim order's priority: a piece that would pass the budget first evicts the mails
    claimed after its own (the last first), and if it still does not fit, its own mail is
    given up.  A mail given up drops what it held and keeps nothing more; the first mail
    is always kept whole (the batch makes progress).  So the batch holds at most the
    budget, or its first mail alone when that is larger, plus the one row in hand."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self.kept: dict[int, ClaimedMail] = {}  # in claim order: a mail's first piece is its body

    def admit(self, mail: ClaimedMail, size: int) -> bool:
        """Count ``size`` more bytes of ``mail``; False when the mail is (now) over budget."""
        mail.content_bytes += size
        if mail.over_budget:
            return False
        self.kept.setdefault(mail.id, mail)
        if self.limit is not None and self.used + size > self.limit:
            order = list(self.kept)
            later = order[order.index(mail.id) + 1:]
            if order[0] != mail.id and self.used - sum(held_bytes(self.kept[i]) for i in later) + size > self.limit:
                self._give_up(mail)  # it would not fit even alone with what was claimed before it
                return False
            while later and self.used + size > self.limit:
                self._give_up(self.kept[later.pop()])
        self.used += size
        return True

    def attach(self, mail: ClaimedMail, piece: Attachment | LazyAttachment) -> None:
        """One attachment row of the claim: a lazy one costs nothing until it is made; a
        stored one is kept if the budget admits it; a mail over budget keeps neither."""
        if isinstance(piece, LazyAttachment):
            if not mail.over_budget:
                mail.attachments.append(piece)
        elif self.admit(mail, len(piece.content)):
            mail.attachments.append(piece)

    def _give_up(self, mail: ClaimedMail) -> None:
        self.used -= held_bytes(mail)
        del self.kept[mail.id]
        mail.over_budget = True
        mail.body, mail.text_body, mail.template_model, mail.attachments = "", None, None, []


@dataclass(frozen=True)
class AckResult:
    """What an acknowledgement changed: one row per mail."""

    mail_id: int
    status: str  # the mail's status after the call
    next_attempt_utc: datetime | None


# --------------------------------------------------------------------------
# Plumbing
# --------------------------------------------------------------------------


def _call(conn: Any, sql: str, params: Sequence[Any]) -> Any:
    """Execute one EXEC batch and return the cursor, translating server errors."""
    cursor = conn.cursor()
    try:
        cursor.execute(sql, *params)
    except _DRIVER_ERRORS as exc:  # pragma: no cover - needs a server
        cursor.close()
        raise from_driver_error(exc) from exc
    return cursor


def _rows(cursor: Any) -> list[Any]:
    try:
        return cursor.fetchall() if cursor.description else []
    except _DRIVER_ERRORS as exc:  # pragma: no cover - needs a server
        raise from_driver_error(exc) from exc


def _each(cursor: Any) -> Iterator[Any]:
    """The rows of the current result set one at a time: a row not kept is freed at once."""
    if not cursor.description:
        return
    while True:
        try:
            row = cursor.fetchone()
        except _DRIVER_ERRORS as exc:  # pragma: no cover - needs a server
            raise from_driver_error(exc) from exc
        if row is None:
            return
        yield row


def _next(cursor: Any) -> bool:
    try:
        return bool(cursor.nextset())
    except _DRIVER_ERRORS as exc:  # pragma: no cover - needs a server
        raise from_driver_error(exc) from exc


def id_list(ids: Iterable[int]) -> str:
    """The JSON array the procedures' @IDList parameter takes."""
    values = [int(i) for i in ids]
    if not values:
        raise ValueError("at least one mail ID is required")
    return json.dumps(values)


def attachments_json(attachments: Iterable[Attachment | LazyAttachment]) -> str | None:
    """The JSON array EnqueueMail's @Attachments takes (content base64-encoded;
    a :class:`LazyAttachment` as "Generator" + "Arguments")."""
    items: list[dict[str, Any]] = []
    for a in attachments:
        if isinstance(a, LazyAttachment):
            item: dict[str, Any] = {"FileName": a.file_name, "Generator": a.generator}
            if a.content_type is not None:
                item["ContentType"] = a.content_type
            if a.arguments is not None:
                item["Arguments"] = json.loads(a.arguments) if isinstance(a.arguments, str) else a.arguments
            items.append(item)
            continue
        items.append({
            "FileName": a.file_name,
            "ContentType": a.content_type,
            "ContentBase64": base64.b64encode(a.content).decode("ascii"),
        })
    return json.dumps(items, ensure_ascii=False) if items else None


def _token(lock_token: uuid.UUID | str) -> str:
    return str(uuid.UUID(str(lock_token)))


def _acks(cursor: Any) -> list[AckResult]:
    return [AckResult(int(r[0]), r[1], r[2]) for r in _rows(cursor)]


# --------------------------------------------------------------------------
# Enqueue (role MailqEnqueuer)
# --------------------------------------------------------------------------

ENQUEUE_SQL = """\
SET NOCOUNT ON;
DECLARE @MailID BIGINT, @MessageID NVARCHAR(255), @Created BIT;
EXEC mailq.EnqueueMail
    @ToAddress = ?, @CC = ?, @BCC = ?, @Subject = ?, @Body = ?, @BodyFormat = ?,
    @TextBody = ?, @FromAddress = ?, @FromName = ?, @ReplyTo = ?, @Headers = ?,
    @AccountName = ?, @AppName = ?, @Priority = ?, @DateToProcess = ?,
    @ExpiresAtUtc = ?, @MaxAttempts = ?, @IdempotencyKey = ?, @Attachments = ?,
    @RunMode = ?,
    @MailID = @MailID OUTPUT, @MessageID = @MessageID OUTPUT, @Created = @Created OUTPUT,
    @TemplateName = ?, @TemplateVersion = ?, @TemplateModel = ?;
SELECT @MailID AS MailID, @MessageID AS MessageID, @Created AS Created;
"""


def _model_json(model: Any) -> str | None:
    """A template model as EnqueueMail's @TemplateModel takes it (JSON object text)."""
    if model is None or isinstance(model, str):
        return model
    return json.dumps(model, ensure_ascii=False)


def enqueue_mail(
    conn: Any,
    *,
    to_address: str | None = None,  # None: a Cc-only or Bcc-only mail (at least one recipient in all)
    subject: str | None = None,
    body: str | None = None,
    body_format: str | None = "Text",
    text_body: str | None = None,
    cc: str | None = None,
    bcc: str | None = None,
    from_address: str | None = None,
    from_name: str | None = None,
    reply_to: str | None = None,
    headers: dict[str, str] | None = None,
    account_name: str | None = None,
    app_name: str | None = None,
    priority: int | None = None,
    date_to_process: datetime | None = None,
    expires_at_utc: datetime | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    attachments: Iterable[Attachment | LazyAttachment] = (),
    run_mode: str | None = None,
    template_name: str | None = None,
    template_version: int | None = None,
    template_model: Any = None,
) -> EnqueueResult:
    """mailq.EnqueueMail: validate and queue one mail; returns its ID and Message-ID.
    With ``template_name`` (+ ``template_model``, a dict or JSON object text, and
    optionally a pinned ``template_version``) instead of subject and body, the
    worker renders the mail at send time (docs/templates.md).  ``run_mode``: the run
    mode it belongs to (default 'prod', docs/run-modes.md)."""
    if template_name is not None and body_format == "Text":
        body_format = None  # the template's parts decide
    cursor = _call(
        conn,
        ENQUEUE_SQL,
        [
            to_address, cc, bcc, subject, body, body_format,
            text_body, from_address, from_name, reply_to,
            json.dumps(headers, ensure_ascii=False) if headers is not None else None,
            account_name, app_name, priority, date_to_process,
            expires_at_utc, max_attempts, idempotency_key, attachments_json(attachments),
            run_mode,
            template_name, template_version, _model_json(template_model),
        ],
    )
    row = _rows(cursor)[0]
    return EnqueueResult(int(row[0]), row[1], bool(row[2]))


# --------------------------------------------------------------------------
# Sender (role MailqSender)
# --------------------------------------------------------------------------

CLAIM_SQL = (
    "EXEC mailq.ClaimMail @BatchSize = ?, @LockToken = ?, @LeaseSeconds = ?, "
    "@AppName = ?, @WorkerName = ?, @AccountNames = ?, @RunModes = ?;"
)


def claim_mail(
    conn: Any,
    *,
    batch_size: int,
    lock_token: uuid.UUID | str,
    lease_seconds: int,
    app_name: str | None = None,
    worker_name: str | None = None,
    account_names: Iterable[str] | None = None,
    run_modes: Iterable[str] | None = None,
    max_batch_bytes: int | None = None,
) -> list[ClaimedMail]:
    """mailq.ClaimMail: lease up to ``batch_size`` due mails to this worker
    (only mail of ``account_names`` when given; only mail of ``run_modes``,
    default ["prod"]).  With ``max_batch_bytes``, the content is read within that
    budget (:class:`ClaimBudget`): a mail past it comes back ``over_budget``, empty,
    for the caller to give back."""
    accounts = json.dumps(sorted(account_names), ensure_ascii=False) if account_names is not None else None
    modes = json.dumps(sorted(set(run_modes)), ensure_ascii=False) if run_modes is not None else None
    cursor = _call(
        conn, CLAIM_SQL, [batch_size, _token(lock_token), lease_seconds, app_name, worker_name, accounts, modes]
    )
    budget = ClaimBudget(max_batch_bytes)
    mails: dict[int, ClaimedMail] = {}
    for r in _each(cursor):
        mail = mails[int(r.ID)] = ClaimedMail(
            id=int(r.ID),
            message_id=r.MessageID,
            account_name=r.AccountName,
            app_name=r.AppName,
            from_name=r.FromName,
            from_address=r.FromAddress,
            reply_to=r.ReplyTo,
            to_address=r.ToAddress,
            cc=r.CC,
            bcc=r.BCC,
            subject=r.Subject,
            body=r.Body,
            body_format=r.BodyFormat,
            text_body=r.TextBody,
            headers=json.loads(r.Headers) if r.Headers else {},
            priority=int(r.Priority),
            attempt_no=int(r.AttemptNo),
            attempts_remaining=int(r.AttemptsRemaining),
            lease_expires_utc=r.LeaseExpiresUtc,
            possible_duplicate=bool(r.PossibleDuplicate),
            dt_stamp=r.dtStamp,
            run_mode=getattr(r, "RunMode", None) or "prod",
            dry_run=bool(getattr(r, "DryRun", False)),
            lease_seconds_remaining=_int_or_none(getattr(r, "LeaseSecondsRemaining", None)),
            template_name=getattr(r, "TemplateName", None),
            template_version=_int_or_none(getattr(r, "TemplateVersion", None)),
            template_model=getattr(r, "TemplateModel", None),
        )
        budget.admit(mail, held_bytes(mail))
    if _next(cursor):
        for r in _each(cursor):
            owner, generator = mails.get(int(r.MailID)), getattr(r, "Generator", None)
            if owner is None:
                continue  # its lease ended between the two reads (e.g. cancelled): not ours
            budget.attach(owner, LazyAttachment(r.FileName, generator, r.GeneratorArgs, r.ContentType)
                          if generator is not None else Attachment(r.FileName, bytes(r.Content), r.ContentType))
        # The template versions the batch renders, each once.
        if _next(cursor):
            texts = {
                (r.TemplateName.casefold(), int(r.Version)): ClaimedTemplate(
                    r.TemplateName, int(r.Version), r.SubjectTemplate, r.HtmlTemplate, r.TextTemplate)
                for r in _rows(cursor)
            }
            for mail in mails.values():
                if mail.template_name is not None and mail.template_version is not None:
                    mail.template = texts.get((mail.template_name.casefold(), mail.template_version))
    return list(mails.values())


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


EXTEND_SQL = "EXEC mailq.ExtendLease @IDList = ?, @LockToken = ?, @LeaseSeconds = ?;"


@dataclass(frozen=True)
class Lease:
    """A lease as mailq.ExtendLease reports it."""

    expires_utc: datetime  # by the database's clock
    #: LeaseSecondsRemaining, by the database's clock; None when not reported
    seconds_remaining: int | None = None


def extend_lease(
    conn: Any, *, ids: Iterable[int], lock_token: uuid.UUID | str, lease_seconds: int
) -> dict[int, Lease]:
    """mailq.ExtendLease: push the lease of mails this worker holds; returns the new leases."""
    cursor = _call(conn, EXTEND_SQL, [id_list(ids), _token(lock_token), lease_seconds])
    return {int(r[0]): Lease(r[1], _int_or_none(getattr(r, "LeaseSecondsRemaining", None)))
            for r in _rows(cursor)}


RELEASE_SQL = "EXEC mailq.ReleaseMail @IDList = ?, @LockToken = ?;"


def release_mail(conn: Any, *, ids: Iterable[int], lock_token: uuid.UUID | str) -> list[AckResult]:
    """mailq.ReleaseMail: give back unsent mails now; the attempt is not counted."""
    return _acks(_call(conn, RELEASE_SQL, [id_list(ids), _token(lock_token)]))


MARK_SENT_SQL = (
    "EXEC mailq.MarkSent @IDList = ?, @LockToken = ?, @SmtpCode = ?, @SmtpText = ?, "
    "@DryRun = ?;"
)


def mark_sent(
    conn: Any,
    *,
    ids: Iterable[int],
    lock_token: uuid.UUID | str,
    smtp_code: int | None = None,
    smtp_text: str | None = None,
    dry_run: bool = False,
) -> list[AckResult]:
    """mailq.MarkSent: record the mails as sent (all or none: fenced by the token;
    repeating the call with the same token after a dropped connection is safe)."""
    return _acks(
        _call(
            conn,
            MARK_SENT_SQL,
            [id_list(ids), _token(lock_token), smtp_code, smtp_text, 1 if dry_run else 0],
        )
    )


MARK_FAILED_SQL = (
    "EXEC mailq.MarkFailed @IDList = ?, @LockToken = ?, @Disposition = ?, @Error = ?, "
    "@RetryAfterSeconds = ?, @SmtpCode = ?, @PossibleDuplicate = ?;"
)

DISPOSITIONS = ("Retry", "Wait", "Stop")


def mark_failed(
    conn: Any,
    *,
    ids: Iterable[int],
    lock_token: uuid.UUID | str,
    disposition: str,
    error: str,
    retry_after_seconds: int | None = None,
    smtp_code: int | None = None,
    possible_duplicate: bool = False,
) -> list[AckResult]:
    """mailq.MarkFailed: Retry (backoff, attempt consumed), Wait (account blocked,
    attempt refunded) or Stop (Failed at once); ``possible_duplicate``: the server may
    have the mail (no reply after the final dot), so it is flagged PossibleDuplicate."""
    return _acks(
        _call(
            conn,
            MARK_FAILED_SQL,
            [id_list(ids), _token(lock_token), disposition, error, retry_after_seconds, smtp_code,
             1 if possible_duplicate else 0],
        )
    )



# Per-recipient outcomes ------------------

RECIPIENT_OUTCOMES = ("Delivered", "Deferred", "Refused")
RECORD_RECIPIENTS_SQL = "EXEC mailq.RecordRecipientOutcomes @ID = ?, @LockToken = ?, @Outcomes = ?;"


def record_recipient_outcomes(
    conn: Any,
    *,
    mail_id: int,
    lock_token: uuid.UUID | str,
    outcomes: Iterable[dict[str, Any]],
) -> None:
    """mailq.RecordRecipientOutcomes: which recipients of one held mail the server
    accepted (Delivered), deferred (4xx) or refused (5xx); fenced by the token.
    Each outcome is ``{"address", "outcome", "code", "text"}``."""
    items = [
        {"address": o["address"], "outcome": o["outcome"], "code": o.get("code"),
         "text": (o.get("text") or None) and str(o["text"])[:1000]}
        for o in outcomes
    ]
    _call(conn, RECORD_RECIPIENTS_SQL, [mail_id, _token(lock_token), json.dumps(items, ensure_ascii=False)]).close()


GET_RECIPIENTS_SQL = "EXEC mailq.GetRecipientOutcomes @IDList = ?, @LockToken = ?;"


def get_recipient_outcomes(
    conn: Any, *, ids: Iterable[int], lock_token: uuid.UUID | str
) -> dict[int, dict[str, str]]:
    """mailq.GetRecipientOutcomes: mail ID -> {address: outcome} recorded for the
    mails this token holds (mails without any recorded recipient are absent)."""
    cursor = _call(conn, GET_RECIPIENTS_SQL, [id_list(ids), _token(lock_token)])
    out: dict[int, dict[str, str]] = {}
    for row in _rows(cursor):
        out.setdefault(int(row.MailID), {})[row.Address] = row.Outcome
    return out


# --------------------------------------------------------------------------
# Administration (role MailqAdmin)
# --------------------------------------------------------------------------

REQUEUE_SQL = "EXEC mailq.RequeueMail @ID = ?, @MaxAttempts = ?, @DateToProcess = ?;"


def requeue_mail(
    conn: Any, *, mail_id: int, max_attempts: int | None = None,
    date_to_process: datetime | None = None,
) -> list[AckResult]:
    """mailq.RequeueMail: put a Failed, Cancelled, Expired or Stopped mail back in the queue."""
    return _acks(_call(conn, REQUEUE_SQL, [mail_id, max_attempts, date_to_process]))


CANCEL_SQL = "EXEC mailq.CancelMail @ID = ?;"


def cancel_mail(conn: Any, *, mail_id: int) -> list[AckResult]:
    """mailq.CancelMail: cancel a mail that is not being sent and not final."""
    return _acks(_call(conn, CANCEL_SQL, [mail_id]))


PURGE_SQL = "EXEC mailq.PurgeMail @OlderThanDays = ?, @BatchSize = ?;"


def purge_mail(conn: Any, *, older_than_days: int, batch_size: int | None = None) -> int:
    """mailq.PurgeMail: delete final mails older than N days in small batches; returns the count."""
    rows = _rows(_call(conn, PURGE_SQL, [older_than_days, batch_size]))
    return int(rows[0][0]) if rows else 0


UPSERT_ACCOUNT_SQL = (
    "EXEC mailq.UpsertSendingAccount @AccountName = ?, @DefaultFromAddress = ?, "
    "@DefaultFromName = ?, @PerMinuteLimit = ?, @PerHourLimit = ?, @PerDayLimit = ?, "
    "@IsDefault = ?, @MinLoginIntervalMs = ?, @Clear = ?;"
)

#: The settings mailq.UpsertSendingAccount @Clear removes.
CLEARABLE_ACCOUNT_SETTINGS = ("DefaultFromName", "PerMinuteLimit", "PerHourLimit", "PerDayLimit",
                              "MinLoginIntervalMs")


def upsert_sending_account(
    conn: Any,
    *,
    account_name: str,
    default_from_address: str | None = None,
    default_from_name: str | None = None,
    per_minute_limit: int | None = None,
    per_hour_limit: int | None = None,
    per_day_limit: int | None = None,
    is_default: bool | None = None,
    min_login_interval_ms: int | None = None,
    clear: Iterable[str] = (),
) -> None:
    """mailq.UpsertSendingAccount: create a sending account, or change only what
    is given (None keeps the stored value; ``default_from_address`` is needed to
    create one).  ``is_default``: True makes it the default account, False
    makes it no longer the default, None keeps it.  ``clear`` removes settings
    (names in CLEARABLE_ACCOUNT_SETTINGS: a limit, the login interval, the
    default From name)."""
    names = list(clear)
    unknown = sorted(set(names) - set(CLEARABLE_ACCOUNT_SETTINGS))
    if unknown:
        raise ValueError(f"cannot clear {', '.join(unknown)} (settings: {', '.join(CLEARABLE_ACCOUNT_SETTINGS)})")
    _call(
        conn,
        UPSERT_ACCOUNT_SQL,
        [account_name, default_from_address, default_from_name, per_minute_limit,
         per_hour_limit, per_day_limit, None if is_default is None else (1 if is_default else 0),
         min_login_interval_ms, ",".join(names) or None],
    ).close()


UNBLOCK_ACCOUNT_SQL = "EXEC mailq.UnblockSendingAccount @AccountName = ?;"


def unblock_sending_account(conn: Any, *, account_name: str) -> int:
    """mailq.UnblockSendingAccount: clear an account's blocked-until time and make
    the mails a Wait deferred visible now; returns how many mails it made visible."""
    rows = _rows(_call(conn, UNBLOCK_ACCOUNT_SQL, [account_name]))
    return int(rows[0][1]) if rows else 0


UPSERT_APPLICATION_SQL = "EXEC mailq.UpsertApplication @AppName = ?, @Description = ?, @DryRun = ?;"


def upsert_application(
    conn: Any, *, app_name: str, description: str | None = None, dry_run: bool | None = None
) -> None:
    """mailq.UpsertApplication: register an application name mails may carry.
    ``dry_run``: True = its mails are recorded as DryRun and reach no server,
    False = sent, None = unchanged (docs/run-modes.md)."""
    flag = None if dry_run is None else (1 if dry_run else 0)
    _call(conn, UPSERT_APPLICATION_SQL, [app_name, description, flag]).close()


BIND_APPLICATION_SQL = (
    "EXEC mailq.BindApplication @AppName = ?, @AccountName = ?, @FromAddress = ?, @PrincipalName = ?;"
)


def bind_application(conn: Any, *, app_name: str, account_name: str | None = None,
                     from_address: str | None = None, principal_name: str | None = None) -> None:
    """mailq.BindApplication: allow an application to send through ``account_name``
    and/or as ``from_address`` (one address, or a domain written ``@example.com``),
    and/or make database user ``principal_name`` always enqueue as this application."""
    _call(conn, BIND_APPLICATION_SQL, [app_name, account_name, from_address, principal_name]).close()


UNBIND_APPLICATION_SQL = (
    "EXEC mailq.UnbindApplication @AppName = ?, @AccountName = ?, @FromAddress = ?, @PrincipalName = ?;"
)


SET_ENQUEUE_POLICY_SQL = "EXEC mailq.SetEnqueuePolicy @AllowUnmappedEnqueuers = ?;"


def set_enqueue_policy(conn: Any, *, allow_unmapped_enqueuers: bool) -> None:
    """mailq.SetEnqueuePolicy (db_owner, MailqAdmin): False refuses database users
    that no application binding covers (50500, a new installation's setting);
    True is the opt-in that lets them enqueue unbound (docs/enqueue.md)."""
    _call(conn, SET_ENQUEUE_POLICY_SQL, [1 if allow_unmapped_enqueuers else 0]).close()


@dataclass(frozen=True)
class EnqueuePolicy:
    allow_unmapped_enqueuers: bool
    changed_at_utc: datetime | None
    changed_by: str | None
    membership_visible: bool                    # False: ``unmapped`` may be incomplete
    unmapped: list[tuple[str, str]]             # (user, the role or grant it enqueues through)


GET_ENQUEUE_POLICY_SQL = "EXEC mailq.GetEnqueuePolicy;"


def get_enqueue_policy(conn: Any) -> EnqueuePolicy:
    """mailq.GetEnqueuePolicy: the policy in force and the database users that may
    call an enqueue procedure without being mapped to an application."""
    cursor = _call(conn, GET_ENQUEUE_POLICY_SQL, [])
    try:
        policy = _rows(cursor)[0]
        unmapped = [(str(r[0]), str(r[1])) for r in _rows(cursor)] if _next(cursor) else []
    finally:
        cursor.close()
    return EnqueuePolicy(bool(policy[0]), policy[1], policy[2], bool(policy[3]), unmapped)


def unbind_application(conn: Any, *, app_name: str, account_name: str | None = None,
                       from_address: str | None = None, principal_name: str | None = None) -> None:
    """mailq.UnbindApplication: withdraw what :func:`bind_application` allowed."""
    _call(conn, UNBIND_APPLICATION_SQL, [app_name, account_name, from_address, principal_name]).close()


STATS_SQL = "EXEC mailq.GetQueueStats @RecentFailures = ?, @FinishedHours = ?;"


@dataclass
class QueueStats:
    """mailq.GetQueueStats' four result sets, each read by a bounded seek."""

    queued: list[dict[str, Any]]             # Status (UnSent, Sending), AccountName, MailCount
    oldest_due: list[dict[str, Any]]         # AccountName, OldestDueUtc, OldestDueAgeSeconds, DueCount
    finished_per_hour: list[dict[str, Any]]  # HourUtc, AccountName, Sent, Failed, Expired, Cancelled, Stopped
    failures: list[dict[str, Any]]           # the newest failed attempts of the last 7 days


def _dicts(cursor: Any) -> list[dict[str, Any]]:
    rows = _rows(cursor)
    names = [d[0] for d in cursor.description] if cursor.description else []
    return [dict(zip(names, row, strict=True)) for row in rows]


def get_queue_stats(conn: Any, *, recent_failures: int | None = None,
                    finished_hours: int | None = None) -> QueueStats:
    """mailq.GetQueueStats: mail queued now, oldest due, mail finished per hour
    over the last ``finished_hours`` (1-168, default 24), recent failures."""
    cursor = _call(conn, STATS_SQL, [recent_failures, finished_hours])
    sets = [_dicts(cursor)]
    while _next(cursor):
        sets.append(_dicts(cursor))
    sets += [[]] * (4 - len(sets))
    return QueueStats(*sets[:4])


HEALTH_SQL = "EXEC mailq.GetInstallationHealth;"


def get_installation_health(conn: Any) -> list[dict[str, Any]]:
    """mailq.GetInstallationHealth: one row per check (Area, CheckName, Status, Detail, Fix)."""
    return _dicts(_call(conn, HEALTH_SQL, []))


# --------------------------------------------------------------------------
# Finalization: expiry and out-of-attempts, off the claim path
# --------------------------------------------------------------------------

FINALIZE_SQL = "EXEC mailq.FinalizeMail @BatchSize = ?, @MaxBatches = ?;"


@dataclass
class FinalizeResult:
    failed: int
    expired: int
    more_left: bool
    #: another FinalizeMail held the finalizer lock: this call stopped there
    busy: bool = False


def finalize_mail(conn: Any, *, batch_size: int | None = None, max_batches: int | None = None) -> FinalizeResult:
    """mailq.FinalizeMail: move expired and out-of-attempts mail to Expired/Failed
    in small batches (outside a transaction); ``more_left``: call again."""
    rows = _rows(_call(conn, FINALIZE_SQL, [batch_size, max_batches]))
    if not rows:
        return FinalizeResult(0, 0, False)
    return FinalizeResult(int(rows[0][0]), int(rows[0][1]), bool(rows[0][2]), bool(rows[0][3]))


# --------------------------------------------------------------------------
# Delayed execution (sql/broker/; docs/delayed-execution.md)
# --------------------------------------------------------------------------
# One wrapper per public procedure of the delayed-execution half, so that
# tests/static/test_exec_contract.py checks them against sql/ like the rest.
# Errors 50300-50399 and 50540-50579 arrive as DelayExecutionError (mailq_db.errors).

INITIATE_DELAY_SQL = (
    "EXEC dbo.InitiateDelayExecution @F108211 = ?, @F108218 = ?, @F108212 = ?, @F108213 = ?, "
    "@F108214 = ?, @F108215 = ?, @F108216 = ?, @F108210 = ?, @IdempotencyKey = ?;"
)


def initiate_delay_execution(
    conn: Any,
    *,
    procedure: str,
    delay_seconds: int,
    params: Sequence[str | None] = (),
    description: str | None = None,
    idempotency_key: str | None = None,
) -> int:
    """dbo.InitiateDelayExecution: schedule an allow-listed procedure; returns the task ID.

    ``params`` are the target's ``@Param1`` ... ``@Param5`` (at most five, each
    at most 200 characters: longer values are refused, never cut).  Give an
    ``idempotency_key`` when the call may be resent (a reconnect after a lost
    reply): the same key returns the first call's task and schedules nothing.
    The call joins the connection's transaction if one is open; any error
    dooms it (the caller rolls back).
    """
    values = list(params)
    if len(values) > 5:
        raise ValueError(f"at most 5 target parameters; got {len(values)}")
    values += [None] * (5 - len(values))
    cursor = _call(
        conn, INITIATE_DELAY_SQL,
        [procedure, delay_seconds, *values, description, idempotency_key],
    )
    try:
        rows = _rows(cursor)
        while not rows and _next(cursor):
            rows = _rows(cursor)
    finally:
        cursor.close()
    if not rows:  # pragma: no cover - the procedure always returns one row
        raise RuntimeError("dbo.InitiateDelayExecution returned no TaskID")
    return int(rows[0][0])


CANCEL_DELAY_SQL = "EXEC dbo.CancelDelayExecution @TaskID = ?;"


def cancel_delay_execution(conn: Any, *, task_id: int) -> None:
    """dbo.CancelDelayExecution: cancel a Pending or Held task (receipt 4).

    Members of MailqDelayCaller cancel only the tasks their own login
    initiated (50342 otherwise); MailqAdmin and db_owner cancel any.  A task a
    reader has claimed (running or about to) cannot be cancelled (50321).
    """
    _call(conn, CANCEL_DELAY_SQL, [task_id]).close()


ALLOW_PROCEDURE_SQL = "EXEC delay.AllowProcedure @ProcedureName = ?, @AllowBareName = ?, @MaxReaders = ?;"


def allow_procedure(
    conn: Any, *, procedure: str, allow_bare_name: bool = False, max_readers: int | None = None,
) -> dict[str, Any]:
    """delay.AllowProcedure (db_owner): list a procedure, pinned to its current
    definition and granted to MailqRunner; its Held tasks run again (``Released``)."""
    cursor = _call(conn, ALLOW_PROCEDURE_SQL, [procedure, 1 if allow_bare_name else 0, max_readers])
    try:
        rows = _dicts(cursor)
    finally:
        cursor.close()
    return rows[0] if rows else {}


DISALLOW_PROCEDURE_SQL = "EXEC delay.DisallowProcedure @ProcedureName = ?;"


def disallow_procedure(conn: Any, *, procedure: str) -> int:
    """delay.DisallowProcedure (db_owner): take a procedure off the allow-list;
    returns how many of its Pending and Held tasks were refused."""
    cursor = _call(conn, DISALLOW_PROCEDURE_SQL, [procedure])
    try:
        rows = _rows(cursor)
    finally:
        cursor.close()
    return int(rows[0][0]) if rows else 0


MONITOR_DELAY_SQL = (
    "EXEC delay.Monitor @Apply = ?, @Raise = ?, @OverdueLimit = ?, @ScheduleMissing = ?, @MaxRows = ?;"
)


def monitor_delayed_execution(
    conn: Any, *, apply: bool = True, raise_on_critical: bool = False, overdue_limit: int = 0,
    schedule_missing: bool = False, max_rows: int = 1000,
) -> list[dict[str, Any]]:
    """delay.Monitor (MailqAdmin): one dict per finding (Finding, Severity,
    Detail, Fix).  ``apply`` repairs what it can (a lost dispatcher
    conversation, orphaned runs); ``schedule_missing`` schedules platform rows
    that have no task.  ``raise_on_critical`` makes a Critical finding raise
    50545 after the findings (what an Agent job step wants)."""
    cursor = _call(conn, MONITOR_DELAY_SQL, [
        1 if apply else 0, 1 if raise_on_critical else 0, overdue_limit, 1 if schedule_missing else 0, max_rows,
    ])
    try:
        return _dicts(cursor)
    finally:
        cursor.close()


ENABLE_THIS_DATABASE_SQL = "EXEC delay.EnableThisDatabase @Confirm = ?;"


def enable_this_database(conn: Any, *, confirm: bool) -> dict[str, Any]:
    """delay.EnableThisDatabase (db_owner): this database (a restored copy with a
    new broker identity, or the live one after NEW_BROKER) runs its tasks from now on."""
    cursor = _call(conn, ENABLE_THIS_DATABASE_SQL, [1 if confirm else 0])
    try:
        rows = _dicts(cursor)
    finally:
        cursor.close()
    return rows[0] if rows else {}


PURGE_DELAY_SQL = "EXEC delay.PurgeHistory @OlderThanDays = ?, @BatchSize = ?, @MaxBatches = ?;"


def purge_delay_history(
    conn: Any, *, older_than_days: int | None = None, batch_size: int = 1000, max_batches: int = 100,
) -> dict[str, Any]:
    """delay.PurgeHistory (MailqAdmin): delete final tasks and log rows older
    than the retention, in bounded batches (call on an autocommit connection)."""
    cursor = _call(conn, PURGE_DELAY_SQL, [older_than_days, batch_size, max_batches])
    try:
        rows = _dicts(cursor)
    finally:
        cursor.close()
    return rows[0] if rows else {}


# --------------------------------------------------------------------------
# Database Mail compatibility: SendDbMail (role MailqDbMailUser), profiles
# (role MailqAdmin), the query runner's claim and hand-back (role
# MailqDbMailRunner).
# --------------------------------------------------------------------------

SEND_DBMAIL_SQL = """\
SET NOCOUNT ON;
DECLARE @mailitem_id INT, @mailq_mail_id BIGINT;
EXEC mailq.SendDbMail
    @profile_name = ?, @recipients = ?, @copy_recipients = ?, @blind_copy_recipients = ?,
    @from_address = ?, @reply_to = ?, @subject = ?, @body = ?, @body_format = ?,
    @importance = ?, @sensitivity = ?, @query = ?, @execute_query_database = ?,
    @attach_query_result_as_file = ?, @query_attachment_filename = ?,
    @query_result_header = ?, @query_result_width = ?, @query_result_separator = ?,
    @exclude_query_output = ?, @append_query_error = ?, @query_no_truncate = ?,
    @query_result_no_padding = ?, @mailq_query_result_format = ?,
    @mailitem_id = @mailitem_id OUTPUT, @mailq_mail_id = @mailq_mail_id OUTPUT;
SELECT @mailitem_id AS MailItemID, @mailq_mail_id AS MailID;
"""


@dataclass(frozen=True)
class DbMailQueued:
    """What mailq.SendDbMail returned: msdb's ``@mailitem_id`` and the queue's mail ID."""

    mailitem_id: int
    mail_id: int


def send_db_mail(
    conn: Any,
    *,
    recipients: str | None = None,
    profile_name: str | None = None,
    copy_recipients: str | None = None,
    blind_copy_recipients: str | None = None,
    from_address: str | None = None,
    reply_to: str | None = None,
    subject: str | None = None,
    body: str | None = None,
    body_format: str | None = None,
    importance: str = "NORMAL",
    sensitivity: str = "NORMAL",
    query: str | None = None,
    execute_query_database: str | None = None,
    attach_query_result_as_file: bool = False,
    query_attachment_filename: str | None = None,
    query_result_header: bool = True,
    query_result_width: int = 256,
    query_result_separator: str = " ",
    exclude_query_output: bool = False,
    append_query_error: bool = False,
    query_no_truncate: bool = False,
    query_result_no_padding: bool = False,
    query_result_format: str = "TEXT",
) -> DbMailQueued:
    """mailq.SendDbMail: sp_send_dbmail's interface (defaults are msdb's: the
    procedure refuses NULL where msdb does).  A refusal is raised as
    :class:`DatabaseError` (msdb's number, or 50000 with this package's
    message); ``@file_attachments`` is not offered (the procedure refuses it).
    """
    cursor = _call(
        conn,
        SEND_DBMAIL_SQL,
        [
            profile_name, recipients, copy_recipients, blind_copy_recipients,
            from_address, reply_to, subject, body, body_format,
            importance, sensitivity, query, execute_query_database,
            int(attach_query_result_as_file), query_attachment_filename,
            int(query_result_header), query_result_width, query_result_separator,
            int(exclude_query_output), int(append_query_error), int(query_no_truncate),
            int(query_result_no_padding), query_result_format,
        ],
    )
    rows = _rows(cursor)
    while not rows and _next(cursor):
        rows = _rows(cursor)
    item, mail = rows[0]
    if item is None:  # pragma: no cover - a refusal raises its message first
        raise DatabaseError(None, "mailq.SendDbMail queued nothing")
    return DbMailQueued(mailitem_id=int(item), mail_id=int(mail))


CLAIM_DBMAIL_QUERY_SQL = "EXEC mailq.ClaimDbMailQuery @LockToken = ?, @LeaseSeconds = ?;"


@dataclass(frozen=True)
class DbMailQuery:
    """One waiting @query, as mailq.ClaimDbMailQuery hands it to a runner."""

    mailitem_id: int
    mail_id: int
    query: str
    database: str
    request_user: str
    request_user_sid: bytes | None
    attach_results: bool
    attachment_filename: str | None
    header: bool
    width: int
    separator: str
    exclude_query_output: bool
    append_query_error: bool
    no_truncate: bool
    no_padding: bool
    result_format: str
    attempts: int


def claim_db_mail_query(conn: Any, *, lock_token: uuid.UUID, lease_seconds: int = 300) -> DbMailQuery | None:
    """mailq.ClaimDbMailQuery: the oldest waiting query for this runner, or None."""
    cursor = _call(conn, CLAIM_DBMAIL_QUERY_SQL, [str(lock_token), lease_seconds])
    rows = _rows(cursor)
    cursor.close()
    if not rows:
        return None
    r = rows[0]
    return DbMailQuery(
        mailitem_id=int(r[0]), mail_id=int(r[1]), query=r[2], database=r[3], request_user=r[4],
        request_user_sid=bytes(r[5]) if r[5] is not None else None, attach_results=bool(r[6]),
        attachment_filename=r[7], header=bool(r[8]), width=int(r[9]), separator=r[10] or " ",
        exclude_query_output=bool(r[11]), append_query_error=bool(r[12]), no_truncate=bool(r[13]),
        no_padding=bool(r[14]), result_format=(r[15] or "TEXT").strip().upper(), attempts=int(r[16]),
    )


COMPLETE_DBMAIL_QUERY_SQL = """\
EXEC mailq.CompleteDbMailQuery @MailItemID = ?, @LockToken = ?, @Outcome = ?, @Text = ?,
    @Attachment = ?, @FileName = ?, @ContentType = ?, @Error = ?;
"""


def complete_db_mail_query(
    conn: Any,
    *,
    mailitem_id: int,
    lock_token: uuid.UUID,
    outcome: str,
    text: str | None = None,
    attachment: bytes | None = None,
    file_name: str | None = None,
    content_type: str | None = None,
    error: str | None = None,
) -> None:
    """mailq.CompleteDbMailQuery: hand back a claimed query (``outcome`` 'Done' or 'Failed')."""
    cursor = _call(conn, COMPLETE_DBMAIL_QUERY_SQL, [
        mailitem_id, str(lock_token), outcome, text, attachment, file_name, content_type, error,
    ])
    while _next(cursor):
        pass
    cursor.close()


UPSERT_DBMAIL_PROFILE_SQL = """\
SET NOCOUNT ON;
DECLARE @ProfileID INT;
EXEC mailq.UpsertDbMailProfile @ProfileName = ?, @Description = ?, @ProfileID = @ProfileID OUTPUT;
SELECT @ProfileID AS ProfileID;
"""


def upsert_db_mail_profile(conn: Any, *, profile_name: str, description: str | None = None) -> int:
    """mailq.UpsertDbMailProfile: create a profile or change its description; returns its ID."""
    rows = _rows(_call(conn, UPSERT_DBMAIL_PROFILE_SQL, [profile_name, description]))
    return int(rows[0][0])


DELETE_DBMAIL_PROFILE_SQL = "EXEC mailq.DeleteDbMailProfile @ProfileName = ?;"


def delete_db_mail_profile(conn: Any, *, profile_name: str) -> None:
    """mailq.DeleteDbMailProfile: delete a profile with its accounts list and grants."""
    _call(conn, DELETE_DBMAIL_PROFILE_SQL, [profile_name]).close()


UPSERT_DBMAIL_PROFILE_ACCOUNT_SQL = (
    "EXEC mailq.UpsertDbMailProfileAccount @ProfileName = ?, @AccountName = ?, @SequenceNumber = ?;"
)


def upsert_db_mail_profile_account(
    conn: Any, *, profile_name: str, account_name: str, sequence_number: int,
) -> None:
    """mailq.UpsertDbMailProfileAccount: add an account to a profile or move it in the failover order."""
    _call(conn, UPSERT_DBMAIL_PROFILE_ACCOUNT_SQL, [profile_name, account_name, sequence_number]).close()


DELETE_DBMAIL_PROFILE_ACCOUNT_SQL = "EXEC mailq.DeleteDbMailProfileAccount @ProfileName = ?, @AccountName = ?;"


def delete_db_mail_profile_account(conn: Any, *, profile_name: str, account_name: str) -> None:
    """mailq.DeleteDbMailProfileAccount: remove an account from a profile."""
    _call(conn, DELETE_DBMAIL_PROFILE_ACCOUNT_SQL, [profile_name, account_name]).close()


UPSERT_DBMAIL_PRINCIPAL_PROFILE_SQL = (
    "EXEC mailq.UpsertDbMailPrincipalProfile @ProfileName = ?, @PrincipalName = ?, @IsDefault = ?;"
)


def upsert_db_mail_principal_profile(
    conn: Any, *, profile_name: str, principal_name: str, is_default: bool = False,
) -> None:
    """mailq.UpsertDbMailPrincipalProfile: let a user, role or 'public' use a profile (optionally as default)."""
    _call(
        conn, UPSERT_DBMAIL_PRINCIPAL_PROFILE_SQL, [profile_name, principal_name, 1 if is_default else 0],
    ).close()


DELETE_DBMAIL_PRINCIPAL_PROFILE_SQL = (
    "EXEC mailq.DeleteDbMailPrincipalProfile @ProfileName = ?, @PrincipalName = ?;"
)


def delete_db_mail_principal_profile(conn: Any, *, profile_name: str, principal_name: str) -> None:
    """mailq.DeleteDbMailPrincipalProfile: withdraw a principal's use of a profile."""
    _call(conn, DELETE_DBMAIL_PRINCIPAL_PROFILE_SQL, [profile_name, principal_name]).close()


# --------------------------------------------------------------------------
# Event stream and StopMail (docs/events.md)
# --------------------------------------------------------------------------

#: EventType values mailq.MailEvent carries (docs/events.md); never renamed.
EVENT_TYPES = (
    "Enqueued", "Claimed", "Sent", "DryRun", "RetryScheduled", "AccountWaiting",
    "Released", "LeaseExpired", "Failed", "Cancelled", "Expired", "Stopped", "Requeued",
    # bounces, complaints, unsubscribes, suppression
    "Bounced", "BounceDelayed", "Complained", "Unsubscribed", "RecipientSuppressed",
)
#: The event types after which a mail changes no more (unless requeued).
TERMINAL_EVENT_TYPES = frozenset({"Sent", "DryRun", "Failed", "Cancelled", "Expired", "Stopped"})


@dataclass(frozen=True)
class MailEvent:
    """One row of mailq.GetMailEvents; ``event_id`` is the commit-safe cursor."""

    event_id: int
    mail_id: int
    app_name: str | None
    event_type: str
    status: str
    attempt_count: int
    smtp_code: int | None
    detail: str | None
    occurred_at_utc: datetime

    @property
    def terminal(self) -> bool:
        return self.event_type in TERMINAL_EVENT_TYPES


#: Attempts of a read that failed with a transient error keeping the session
#: (deadlock victim 1205, lock timeout, Azure throttling: connection.keeps_session)
#: before it is raised.
READ_DEADLOCK_ATTEMPTS = 3


def _call_read_retrying_deadlocks(conn: Any, sql: str, params: Sequence[Any], *,
                                  sleep: Callable[[float], None] | None = None) -> Any:
    """``_call`` for a read that may be chosen as deadlock victim (1205): a
    reader of mailq.GetMailEvents and a mailq.PurgeMail batch deleting the same
    events take their locks in opposite orders (docs/events.md).  The read is
    repeated with the same cursor, at most READ_DEADLOCK_ATTEMPTS times, after
    any transient error that keeps the session (the list of
    :mod:`mailq_db.connection`), but only on an autocommit connection: in a
    caller's transaction such an error has rolled that whole transaction back,
    and only the caller may decide what to do about it."""
    from .connection import keeps_session

    pause = time.sleep if sleep is None else sleep
    for attempt in range(1, READ_DEADLOCK_ATTEMPTS + 1):
        try:
            return _call(conn, sql, params)
        except DatabaseError as exc:
            if not keeps_session(exc) or attempt == READ_DEADLOCK_ATTEMPTS or not getattr(conn, "autocommit", False):
                raise
            pause(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


GET_MAIL_EVENTS_SQL = (
    "EXEC mailq.GetMailEvents @AppName = ?, @MailID = ?, @AfterEventID = ?, @MaxEvents = ?;"
)


def get_mail_events(
    conn: Any, *, app_name: str | None = None, mail_id: int | None = None,
    after_event_id: int = 0, max_events: int | None = None,
) -> list[MailEvent]:
    """mailq.GetMailEvents: the events of one application (``app_name``) or one
    mail (``mail_id``) after ``after_event_id``, in order, at most ``max_events``
    (1-5000, default 500).  Keep the last ``event_id`` and pass it back."""
    cursor = _call_read_retrying_deadlocks(
        conn, GET_MAIL_EVENTS_SQL, [app_name, mail_id, after_event_id, max_events]
    )
    return [
        MailEvent(
            int(r.EventID), int(r.MailID), r.AppName, r.EventType, r.Status,
            int(r.AttemptCount), None if r.SmtpCode is None else int(r.SmtpCode),
            r.Detail, r.OccurredAtUtc,
        )
        for r in _rows(cursor)
    ]


EVENT_STREAM_STALL_SQL = "EXEC mailq.GetEventStreamStall @MinOpenSeconds = ?;"


@dataclass(frozen=True)
class RowversionHolder:
    """An open transaction of the database that has written (a candidate for
    what holds the event stream back; the oldest is the usual one)."""

    session_id: int | None  # None: no session (e.g. an in-doubt MSDTC transaction)
    transaction_id: int
    transaction_name: str | None
    open_since_utc: datetime | None
    open_seconds: int | None
    state: str
    session_status: str | None
    program_name: str | None
    host_name: str | None
    login_name: str | None
    log_records: int | None

    def describe(self) -> str:
        who = f"session {self.session_id}" if self.session_id is not None else "no session"
        parts = [who, f"transaction {self.transaction_id}"]
        if self.transaction_name:
            parts.append(f"'{self.transaction_name}'")
        if self.open_seconds is not None:
            since = self.open_since_utc.strftime("%Y-%m-%d %H:%M:%S UTC") if self.open_since_utc else "?"
            parts.append(f"open since {since} ({self.open_seconds} s)")
        parts.append(self.state)
        for label, value in (("status", self.session_status), ("program", self.program_name),
                             ("host", self.host_name), ("login", self.login_name)):
            if value:
                parts.append(f"{label} {value!r}" if label == "program" else f"{label} {value}")
        return ", ".join(parts)


@dataclass(frozen=True)
class EventStreamStall:
    """mailq.GetEventStreamStall: is the event stream (and the hook dispatcher)
    held back now by an open rowversion writer, and by whom (when visible)."""

    held_back: bool
    min_active_rowversion: int
    next_rowversion: int
    can_see_transactions: bool
    permission: str
    oldest_open_seconds: int | None
    holders: list[RowversionHolder]


def get_event_stream_stall(conn: Any, *, min_open_seconds: int | None = None) -> EventStreamStall:
    """mailq.GetEventStreamStall: whether readers of the event stream are held
    back, and the open writing transactions open at least ``min_open_seconds``
    (visible with VIEW SERVER STATE, VIEW SERVER PERFORMANCE STATE or, on Azure
    SQL Database, VIEW DATABASE STATE)."""
    cursor = _call(conn, EVENT_STREAM_STALL_SQL, [min_open_seconds])
    head = _rows(cursor)[0]
    holders = []
    if _next(cursor):
        holders = [
            RowversionHolder(
                _int_or_none(r.SessionID), int(r.TransactionID), r.TransactionName, r.OpenSinceUtc,
                _int_or_none(r.OpenSeconds), r.State, r.SessionStatus, r.ProgramName, r.HostName,
                r.LoginName, _int_or_none(r.LogRecords),
            )
            for r in _rows(cursor)
        ]
    return EventStreamStall(
        bool(head.HeldBack), int(head.MinActiveRowversion), int(head.NextRowversion),
        bool(head.CanSeeTransactions), head.Permission, _int_or_none(head.OldestOpenSeconds), holders,
    )


STOP_MAIL_SQL = "EXEC mailq.StopMail @MailID = ?, @Reason = ?;"


def stop_mail(conn: Any, *, mail_id: int, reason: str) -> list[AckResult]:
    """mailq.StopMail: end an UnSent or Sending mail as Stopped with a reason (no
    more attempts; a worker's later acknowledgement is fenced out).  A final
    mail raises MailFinalError (50260)."""
    return _acks(_call(conn, STOP_MAIL_SQL, [mail_id, reason]))
# Minimum interval between two logins per account (docs/operator-guide.md,
# "Minimum interval between logins")
# --------------------------------------------------------------------------

ACQUIRE_LOGIN_SLOT_SQL = "EXEC mailq.AcquireLoginSlot @AccountName = ?;"


@dataclass(frozen=True)
class LoginSlot:
    granted: bool  # True: connect and log in now; False: do not connect
    wait_ms: int  # 0 when granted, else the milliseconds until the next login is allowed
    min_login_interval_ms: int | None  # None: the account has no interval
    last_login_utc: datetime | None  # the stamp now in force


def acquire_login_slot(conn: Any, *, account_name: str) -> LoginSlot:
    """mailq.AcquireLoginSlot: right before an SMTP connection, either take the
    account's login slot (stamped with the server's clock) or learn how long
    until the next login is allowed, across every worker."""
    rows = _rows(_call(conn, ACQUIRE_LOGIN_SLOT_SQL, [account_name]))
    granted, wait_ms, interval, last = rows[0]
    return LoginSlot(bool(granted), int(wait_ms), None if interval is None else int(interval), last)
# Mail templates (sql/procedures/mailq.*MailTemplate*.sql,
# docs/templates.md).  Rendering is mailq_db.templates; these only store and read.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MailTemplateRow:
    """One version of a template, as mailq.GetMailTemplate returns it."""

    template_name: str
    version: int
    latest_version: int
    subject_template: str
    html_template: str | None
    text_template: str | None
    description: str | None
    created_by: str
    created_at_utc: datetime
    retired_at_utc: datetime | None


ADD_MAIL_TEMPLATE_VERSION_SQL = """\
SET NOCOUNT ON;
DECLARE @Version INT, @Created BIT;
EXEC mailq.AddMailTemplateVersion @TemplateName = ?, @SubjectTemplate = ?, @HtmlTemplate = ?,
    @TextTemplate = ?, @Description = ?, @ExpectedLatestVersion = ?,
    @Version = @Version OUTPUT, @Created = @Created OUTPUT;
SELECT @Version AS Version, @Created AS Created;
"""


def add_mail_template_version(
    conn: Any,
    *,
    template_name: str,
    subject_template: str,
    html_template: str | None = None,
    text_template: str | None = None,
    description: str | None = None,
    expected_latest_version: int | None = None,
) -> tuple[int, bool]:
    """mailq.AddMailTemplateVersion: store a new version; returns (version, created).

    ``created`` is False when the texts equal the latest version's (nothing added).
    Check the texts first with :func:`mailq_db.templates.check_template`.
    """
    rows = _rows(_call(conn, ADD_MAIL_TEMPLATE_VERSION_SQL, [
        template_name, subject_template, html_template, text_template, description,
        expected_latest_version,
    ]))
    return int(rows[0][0]), bool(rows[0][1])


GET_MAIL_TEMPLATE_SQL = "EXEC mailq.GetMailTemplate @TemplateName = ?, @Version = ?;"


def get_mail_template(conn: Any, *, template_name: str, version: int | None = None) -> MailTemplateRow:
    """mailq.GetMailTemplate: one version (None: the latest, refused when retired, 50216)."""
    r = _rows(_call(conn, GET_MAIL_TEMPLATE_SQL, [template_name, version]))[0]
    return MailTemplateRow(
        template_name=r.TemplateName, version=int(r.Version), latest_version=int(r.LatestVersion),
        subject_template=r.SubjectTemplate, html_template=r.HtmlTemplate, text_template=r.TextTemplate,
        description=r.Description, created_by=r.CreatedBy, created_at_utc=r.CreatedAtUtc,
        retired_at_utc=r.RetiredAtUtc,
    )


LIST_MAIL_TEMPLATES_SQL = "EXEC mailq.ListMailTemplates @IncludeRetired = ?;"


def list_mail_templates(conn: Any, *, include_retired: bool = False) -> list[dict[str, Any]]:
    """mailq.ListMailTemplates: one dict per template (name, latest version, retirement)."""
    return _dicts(_call(conn, LIST_MAIL_TEMPLATES_SQL, [1 if include_retired else 0]))


LIST_MAIL_TEMPLATE_VERSIONS_SQL = "EXEC mailq.ListMailTemplateVersions @TemplateName = ?;"


def list_mail_template_versions(conn: Any, *, template_name: str) -> list[dict[str, Any]]:
    """mailq.ListMailTemplateVersions: one dict per version, newest first, without bodies."""
    return _dicts(_call(conn, LIST_MAIL_TEMPLATE_VERSIONS_SQL, [template_name]))


RETIRE_MAIL_TEMPLATE_SQL = "EXEC mailq.RetireMailTemplate @TemplateName = ?, @Retire = ?, @Reason = ?;"


def retire_mail_template(
    conn: Any, *, template_name: str, retire: bool = True, reason: str | None = None,
) -> dict[str, Any]:
    """mailq.RetireMailTemplate: retire (or, retire=False, bring back) a template; returns its row with Changed."""
    rows = _dicts(_call(conn, RETIRE_MAIL_TEMPLATE_SQL, [template_name, 1 if retire else 0, reason]))
    return rows[0]
# ==========================================================================
# Batch enqueue
# ==========================================================================
#
# mailq.EnqueueMailBatch takes the mails as a JSON array (@Mails) or as a
# table-valued parameter (@MailRows mailq.MailBatchRow).  The wrapper sends
# JSON by default: it works with every ODBC driver (FreeTDS included) and
# needs nothing but a string parameter.  ``use_tvp=True`` sends the TVP
# instead (pyodbc >= 4.0.32 with Microsoft's ODBC Driver 17/18: pyodbc takes
# the type name and schema as the first two items of the list); it is not
# exercised here (no SQL Server), and pyodbc issue #862 reports that a NULL in
# the first row's cells can make the driver refuse the binding.

#: enqueue_mail's keyword names -> the batch's field names (EnqueueMail's parameters).
BATCH_FIELDS: tuple[tuple[str, str], ...] = (
    ("to_address", "ToAddress"), ("subject", "Subject"), ("body", "Body"),
    ("body_format", "BodyFormat"), ("text_body", "TextBody"), ("cc", "CC"), ("bcc", "BCC"),
    ("from_address", "FromAddress"), ("from_name", "FromName"), ("reply_to", "ReplyTo"),
    ("headers", "Headers"), ("account_name", "AccountName"), ("app_name", "AppName"),
    ("priority", "Priority"), ("date_to_process", "DateToProcess"),
    ("expires_at_utc", "ExpiresAtUtc"), ("max_attempts", "MaxAttempts"),
    ("idempotency_key", "IdempotencyKey"), ("attachments", "Attachments"),
    ("run_mode", "RunMode"),
    ("template_name", "TemplateName"), ("template_version", "TemplateVersion"), ("template_model", "TemplateModel"),
)
BATCH_MAX_ROWS = 10000


@dataclass(frozen=True)
class BatchEnqueued:
    row_no: int      # 1-based position in the list given
    mail_id: int
    message_id: str
    created: bool    # False when an existing idempotency key returned an earlier mail


@dataclass(frozen=True)
class BatchRejected:
    row_no: int
    field: str
    error_number: int  # the number EnqueueMail raises for the rule (or 50223)
    message: str


@dataclass(frozen=True)
class BatchResult:
    enqueued: list[BatchEnqueued]
    rejected: list[BatchRejected]  # empty unless reject_invalid=True

    @property
    def mail_ids(self) -> list[int]:
        return [r.mail_id for r in self.enqueued]


def _utc_naive(value: datetime) -> datetime:
    """Naive UTC (the procedures' convention); an aware datetime is converted."""
    if value.tzinfo is None:
        return value
    from datetime import timezone

    return value.astimezone(timezone.utc).replace(tzinfo=None)


def _batch_time(value: datetime | None) -> str | None:
    """A datetime as the ISO 8601 text the procedure converts (CONVERT style 127)."""
    return None if value is None else _utc_naive(value).isoformat(timespec="microseconds")


def batch_row(mail: dict[str, Any]) -> dict[str, Any]:
    """One mail (enqueue_mail's keyword arguments) as a batch row.

    Headers and attachments become the same strings enqueue_mail sends, so a
    mail sent through either path has the same content hash (idempotency)."""
    known = {name for name, _ in BATCH_FIELDS}
    unknown = sorted(set(mail) - known)
    if unknown:
        raise ValueError(f"not a field of a mail: {', '.join(unknown)} (fields: {', '.join(sorted(known))})")
    row: dict[str, Any] = {}
    for name, field_name in BATCH_FIELDS:
        value = mail.get(name)
        if name == "headers" and value is not None:
            value = json.dumps(value, ensure_ascii=False)
        elif name == "attachments":
            value = attachments_json(value or ())
        elif name == "template_model":
            value = _model_json(value)
        elif name in ("date_to_process", "expires_at_utc"):
            value = _batch_time(value)
        if value is not None:
            row[field_name] = value
    return row


def batch_json(mails: Iterable[dict[str, Any]]) -> str:
    """The JSON array mailq.EnqueueMailBatch's @Mails takes."""
    return json.dumps([batch_row(m) for m in mails], ensure_ascii=False)


def _batch_tvp(mails: Sequence[dict[str, Any]]) -> list[Any]:
    """pyodbc's TVP value: type name, schema, then one tuple per row in the
    column order of mailq.MailBatchRow (RowNo first); times as datetimes."""
    rows: list[Any] = ["MailBatchRow", "mailq"]
    for no, mail in enumerate(mails, start=1):
        r = batch_row(mail)
        values = []
        for name, field_name in BATCH_FIELDS:
            value = r.get(field_name)
            if name in ("date_to_process", "expires_at_utc") and mail.get(name) is not None:
                value = _utc_naive(mail[name])
            values.append(value)
        rows.append((no, *values))
    return rows


ENQUEUE_BATCH_SQL = "EXEC mailq.EnqueueMailBatch @Mails = ?, @RejectInvalid = ?;"
ENQUEUE_BATCH_TVP_SQL = "EXEC mailq.EnqueueMailBatch @MailRows = ?, @RejectInvalid = ?;"


def enqueue_mail_batch(
    conn: Any,
    mails: Sequence[dict[str, Any]],
    *,
    reject_invalid: bool = False,
    use_tvp: bool = False,
) -> BatchResult:
    """mailq.EnqueueMailBatch: queue many mails in one call.

    ``mails`` is a list of dicts with enqueue_mail's keyword names.  All or
    nothing by default: an invalid row raises BatchRowError (``.row``,
    ``.field``, ``.rule``) and nothing is queued.  With ``reject_invalid`` the
    valid rows are queued and the invalid ones come back in ``rejected``.
    Like enqueue_mail, it works inside the connection's open transaction and
    does not commit."""
    mails = list(mails)
    if not 1 <= len(mails) <= BATCH_MAX_ROWS:
        raise ValueError(f"a batch takes 1-{BATCH_MAX_ROWS} mails, got {len(mails)}")
    flag = 1 if reject_invalid else 0
    if use_tvp:
        return _batch_result(_call(conn, ENQUEUE_BATCH_TVP_SQL, [_batch_tvp(mails), flag]))
    return _batch_result(_call(conn, ENQUEUE_BATCH_SQL, [batch_json(mails), flag]))


def enqueue_mail_batch_json(conn: Any, mails_json: str, *, reject_invalid: bool = False) -> BatchResult:
    """mailq.EnqueueMailBatch with @Mails as given: a JSON array of objects
    whose fields are the procedure's (ToAddress, Subject, ...), e.g. a file
    an application or `mailq-db enqueue --batch` hands over unchanged."""
    return _batch_result(_call(conn, ENQUEUE_BATCH_SQL, [mails_json, 1 if reject_invalid else 0]))


def _batch_result(cursor: Any) -> BatchResult:
    try:
        enqueued = [BatchEnqueued(int(r[0]), int(r[1]), r[2], bool(r[3])) for r in _rows(cursor)]
        rejected = [BatchRejected(int(r[0]), r[1], int(r[2]), r[3]) for r in _rows(cursor)] if _next(cursor) else []
    finally:
        cursor.close()
    return BatchResult(enqueued, rejected)


# ==========================================================================
# Per-application hooks (docs/hooks.md)
# ==========================================================================

#: The documented hook signature, in the order docs/hooks.md gives it
#: (mailq.SetApplicationHook checks it against sys.parameters).
HOOK_SIGNATURE = (
    ("@EventID", "BIGINT"), ("@MailID", "BIGINT"), ("@AppName", "NVARCHAR(128)"),
    ("@EventType", "NVARCHAR(32)"), ("@Status", "NVARCHAR(16)"), ("@SmtpCode", "INT"),
    ("@Detail", "NVARCHAR(4000)"), ("@StopMail", "BIT OUTPUT"), ("@StopReason", "NVARCHAR(4000) OUTPUT"),
)


@dataclass(frozen=True)
class HookRegistration:
    """The row mailq.SetApplicationHook returns (``hook_procedure`` None after a removal)."""

    app_name: str
    hook_procedure: str | None
    object_id: int | None
    cursor_event_id: int | None
    max_attempts: int | None
    changed: bool


@dataclass(frozen=True)
class HookRun:
    """One row of mailq.RunApplicationHooks (``app_name`` None and state 'Busy':
    another dispatcher is running)."""

    app_name: str | None
    hook_procedure: str | None
    calls: int
    succeeded: int
    failed_calls: int
    given_up: int
    cursor_event_id: int | None
    state: str


SET_APPLICATION_HOOK_SQL = (
    "EXEC mailq.SetApplicationHook @AppName = ?, @HookProcedure = ?, @MaxAttempts = ?, @ResetCursorTo = ?;"
)


def set_application_hook(
    conn: Any, *, app_name: str, hook_procedure: str | None, max_attempts: int = 3,
    reset_cursor_to: int | None = None,
) -> HookRegistration:
    """mailq.SetApplicationHook (db_owner): register, re-register (re-pin) or,
    with ``hook_procedure=None``, remove an application's hook."""
    rows = _rows(_call(conn, SET_APPLICATION_HOOK_SQL, [app_name, hook_procedure, max_attempts, reset_cursor_to]))
    r = rows[0]
    return HookRegistration(
        r.AppName, r.HookProcedure, None if r.ObjectId is None else int(r.ObjectId),
        None if r.CursorEventID is None else int(r.CursorEventID),
        None if r.MaxAttempts is None else int(r.MaxAttempts), bool(r.Changed),
    )


RUN_APPLICATION_HOOKS_SQL = "EXEC mailq.RunApplicationHooks @MaxEvents = ?, @Quiet = 0;"


def run_application_hooks(conn: Any, *, max_events: int = 500) -> list[HookRun]:
    """mailq.RunApplicationHooks: one dispatcher run (call it on an autocommit
    connection: inside a transaction it refuses, 50296)."""
    return [
        HookRun(
            r.AppName, r.HookProcedure, int(r.Calls), int(r.Succeeded), int(r.FailedCalls), int(r.GivenUp),
            None if r.CursorEventID is None else int(r.CursorEventID), r.State,
        )
        for r in _rows(_call(conn, RUN_APPLICATION_HOOKS_SQL, [max_events]))
    ]


LIST_APPLICATION_HOOKS_SQL = "EXEC mailq.ListApplicationHooks @AppName = ?;"


def list_application_hooks(conn: Any, *, app_name: str | None = None) -> list[dict[str, Any]]:
    """mailq.ListApplicationHooks: one dict per hook (pin state, cursor, retry state, failures)."""
    return _dicts(_call(conn, LIST_APPLICATION_HOOKS_SQL, [app_name]))


START_HOOK_DISPATCHER_SQL = "EXEC mailq.StartHookDispatcher @IntervalSeconds = ?, @Enabled = ?;"


def start_hook_dispatcher(conn: Any, *, interval_seconds: int = 30, enabled: bool = True) -> dict[str, Any]:
    """mailq.StartHookDispatcher (delayed execution installed only): start,
    re-time or (``enabled=False``) stop the hook run of delayed execution's readers;
    returns Enabled, IntervalSeconds, NextRunAtUtc, LastRunAtUtc, LastError."""
    return _dicts(_call(conn, START_HOOK_DISPATCHER_SQL, [interval_seconds, 1 if enabled else 0]))[0]


# --------------------------------------------------------------------------
# Bounces, complaints, unsubscribes and suppression (docs/bounces.md)
# Roles: MailqBounceReader records; MailqAdmin also lists, adds, removes, purges.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class BounceRecorded:
    """One row of mailq.RecordBounce's result."""

    address: str
    kind: str  # Hard | Soft | Delayed | Complaint
    mail_id: int | None  # the mail the report was tied to, if any
    recorded: bool  # False: this report was already recorded for this address
    suppressed: bool  # True: this call suppressed the address


RECORD_BOUNCE_SQL = (
    "EXEC mailq.RecordBounce @ReportKey = ?, @Recipients = ?, @Source = ?, @AccountName = ?, "
    "@MailID = ?, @RecipientNo = ?, @HardBounceLimit = ?, @SoftBounceLimit = ?;"
)


def record_bounce(
    conn: Any, *, report_key: bytes, recipients: Iterable[dict[str, Any]], source: str,
    account_name: str | None = None, mail_id: int | None = None, recipient_no: int | None = None,
    hard_bounce_limit: int = 1, soft_bounce_limit: int | None = None,
) -> list[BounceRecorded]:
    """mailq.RecordBounce: what one report says about its recipients, once per
    (report, recipient); suppresses the addresses that reached their limit.
    Each recipient is ``{"address", "kind", "action", "status", "code", "detail"}``
    (``address`` may be left out when ``recipient_no`` names the recipient)."""
    items = [{k: v for k, v in r.items() if v is not None} for r in recipients]
    cursor = _call(conn, RECORD_BOUNCE_SQL, [
        bytes(report_key), json.dumps(items, ensure_ascii=False), source, account_name, mail_id,
        recipient_no, hard_bounce_limit, soft_bounce_limit,
    ])
    return [BounceRecorded(r.Address, r.Kind, None if r.MailID is None else int(r.MailID), bool(r.Recorded),
                           bool(r.Suppressed)) for r in _rows(cursor)]


RECORD_UNSUBSCRIBE_SQL = "EXEC mailq.RecordUnsubscribe @MailID = ?, @RecipientNo = ?, @Source = ?;"


def record_unsubscribe(conn: Any, *, mail_id: int, recipient_no: int, source: str) -> dict[str, Any]:
    """mailq.RecordUnsubscribe: the recipient (from a verified token) leaves the
    mail's stream; returns MailID, AccountName, AppName, Address, Recorded."""
    return _dicts(_call(conn, RECORD_UNSUBSCRIBE_SQL, [mail_id, recipient_no, source]))[0]


ADD_SUPPRESSION_SQL = (
    "EXEC mailq.AddSuppression @AccountName = ?, @Address = ?, @Source = ?, @Reason = ?, @AppName = ?, "
    "@Detail = ?, @ExpiresAtUtc = ?;"
)


def add_suppression(
    conn: Any, *, account_name: str, address: str, source: str, reason: str = "Manual",
    app_name: str | None = None, detail: str | None = None, expires_at_utc: datetime | None = None,
) -> dict[str, Any]:
    """mailq.AddSuppression: suppress (or renew) an address and sweep the queued
    mail; returns AccountName, AppName, Address, Reason, SweptMails, StoppedMails."""
    return _dicts(_call(conn, ADD_SUPPRESSION_SQL, [account_name, address, source, reason, app_name, detail,
                                                    expires_at_utc]))[0]


REMOVE_SUPPRESSION_SQL = (
    "EXEC mailq.RemoveSuppression @AccountName = ?, @Address = ?, @Source = ?, @AppName = ?, @Detail = ?;"
)


def remove_suppression(conn: Any, *, account_name: str, address: str, source: str,
                       app_name: str | None = None, detail: str | None = None) -> int:
    """mailq.RemoveSuppression: the number of rows removed (0 or 1)."""
    return int(_dicts(_call(conn, REMOVE_SUPPRESSION_SQL, [account_name, address, source, app_name,
                                                           detail]))[0]["Removed"])


LIST_SUPPRESSIONS_SQL = (
    "EXEC mailq.ListSuppressions @AccountName = ?, @Address = ?, @Reason = ?, @IncludeExpired = ?, @MaxRows = ?;"
)


def list_suppressions(conn: Any, *, account_name: str | None = None, address: str | None = None,
                      reason: str | None = None, include_expired: bool = False,
                      max_rows: int | None = None) -> list[dict[str, Any]]:
    """mailq.ListSuppressions: one dict per suppression, newest change first."""
    return _dicts(_call(conn, LIST_SUPPRESSIONS_SQL, [account_name, address, reason, 1 if include_expired else 0,
                                                      max_rows]))


@dataclass
class SuppressionStats:
    suppressed: list[dict[str, Any]]  # AccountName, Reason, Suppressed
    reports: list[dict[str, Any]]  # AccountName, Kind, Reports, Mails, LastAtUtc
    sent: list[dict[str, Any]] = field(default_factory=list)  # AccountName, Sent (same window)


GET_SUPPRESSION_STATS_SQL = "EXEC mailq.GetSuppressionStats @Days = ?;"


def get_suppression_stats(conn: Any, *, days: int | None = None) -> SuppressionStats:
    """mailq.GetSuppressionStats: active suppressions, and reports of the last ``days`` days."""
    cursor = _call(conn, GET_SUPPRESSION_STATS_SQL, [days])
    sets = [_dicts(cursor)]
    while _next(cursor):
        sets.append(_dicts(cursor))
    sets += [[]] * (3 - len(sets))
    return SuppressionStats(*sets[:3])


PURGE_BOUNCE_REPORTS_SQL = "EXEC mailq.PurgeBounceReports @OlderThanDays = ?, @BatchSize = ?;"


def purge_bounce_reports(conn: Any, *, older_than_days: int, batch_size: int | None = None) -> int:
    """mailq.PurgeBounceReports: deletes reports older than ``older_than_days`` (the
    suppressions stay); returns how many."""
    return int(_rows(_call(conn, PURGE_BOUNCE_REPORTS_SQL, [older_than_days, batch_size]))[0][0])


# --------------------------------------------------------------------------
# Monitoring (docs/monitoring/): the exporter's and the dashboard's reads
# --------------------------------------------------------------------------

QUEUE_METRICS_SQL = "EXEC mailq.GetQueueMetrics @WindowMinutes = ?;"


@dataclass
class QueueMetrics:
    """mailq.GetQueueMetrics' result sets (rows as dicts keyed by column name)."""

    measured_at_utc: datetime | None
    window_start_utc: datetime | None
    window_end_utc: datetime | None
    caller_is_admin: bool
    depth: list[dict[str, Any]]
    sendable: list[dict[str, Any]]
    accounts: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    #: the sixth result set, suppressions in force (AccountName, Reason, Suppressed); None if absent
    suppressions: list[dict[str, Any]] | None = None


def get_queue_metrics(conn: Any, *, window_minutes: int | None = None) -> QueueMetrics:
    """mailq.GetQueueMetrics: depth, sendable age, accounts and the attempts of
    the last ``window_minutes`` complete minutes (1-60, default 5) in one call."""
    cursor = _call(conn, QUEUE_METRICS_SQL, [window_minutes])
    sets = [_dicts(cursor)]
    while _next(cursor):
        sets.append(_dicts(cursor))
    info = sets[0][0] if sets and sets[0] else {}
    sets += [[]] * (5 - len(sets))
    return QueueMetrics(
        info.get("MeasuredAtUtc"), info.get("WindowStartUtc"), info.get("WindowEndUtc"),
        bool(info.get("CallerIsMailqAdmin")), sets[1], sets[2], sets[3], sets[4],
        sets[5] if len(sets) > 5 else None,
    )


DELAY_TASK_METRICS_SQL = "EXEC delay.GetTaskMetrics;"


def get_delay_task_metrics(conn: Any) -> dict[str, Any]:
    """delay.GetTaskMetrics: PendingTasks, OverdueTasks, HeldTasks, FailedTasks,
    QueueReceiveEnabled (None: not visible to this login), BrokerEnabled.
    Raises DatabaseError 2812 where delayed execution is not deployed."""
    rows = _dicts(_call(conn, DELAY_TASK_METRICS_SQL, []))
    return rows[0] if rows else {}


MAIL_HISTORY_SQL = "EXEC mailq.GetMailHistory @MailID = ?;"


@dataclass
class MailHistory:
    mail: dict[str, Any] | None  # None: no such mail
    attempts: list[dict[str, Any]]
    recipients: list[dict[str, Any]]


def get_mail_history(conn: Any, *, mail_id: int) -> MailHistory:
    """mailq.GetMailHistory: the mail, its attempts and its recipients' outcomes."""
    cursor = _call(conn, MAIL_HISTORY_SQL, [mail_id])
    sets = [_dicts(cursor)]
    while _next(cursor):
        sets.append(_dicts(cursor))
    sets += [[]] * (3 - len(sets))
    return MailHistory(sets[0][0] if sets[0] else None, sets[1], sets[2])


FIND_MAIL_SQL = "EXEC mailq.FindMail @Status = ?, @AccountName = ?, @RunMode = ?, @MaxRows = ?;"


def find_mail(
    conn: Any, *, status: str, account_name: str | None = None, run_mode: str | None = None,
    max_rows: int | None = None,
) -> list[dict[str, Any]]:
    """mailq.FindMail: the mails of one status (UnSent, Failed, Cancelled,
    Expired, Stopped), optionally of one account and run mode, at most
    ``max_rows`` (1-1000, default 100): what a bulk action would touch."""
    return _dicts(_call(conn, FIND_MAIL_SQL, [status, account_name, run_mode, max_rows]))
