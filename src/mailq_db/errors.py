"""Exceptions raised by the Python layer, mapped from the THROW numbers of sql/.

Every number is documented once in docs/errors.md; a static test checks that
every number mapped here exists there.  Blocks:

* 50100-50199  mail-queue input            -> InvalidInputError
* 50200-50299  mail state and fencing      -> MailStateError (LeaseLostError for fencing)
* 50300-50399  delayed execution           -> DelayExecutionError (and 50540-50579)
* 50400-50499  deployment checks           -> DeploymentCheckError
* 50500-50519  who may send as whom, sending accounts -> InvalidInputError
"""

from __future__ import annotations

import re


class MailqError(Exception):
    """Base class of every error this package raises."""


class ConfigurationError(MailqError):
    """A configuration file, URL or option is invalid; the message says how to fix it."""


class DriverNotFoundError(MailqError):
    """No usable ODBC driver was found; the message lists what was tried and how to install each."""


class DatabaseError(MailqError):
    """An error raised by SQL Server.

    ``number`` is the SQL Server error number (the THROW number for ours),
    ``message`` the server's message text without the driver's prefixes.
    """

    def __init__(self, number: int | None, message: str):
        super().__init__(f"[{number}] {message}" if number is not None else message)
        self.number = number
        self.message = message


class InvalidInputError(DatabaseError):
    """Bad input refused by a procedure (50100-50199); nothing was written."""


class MailStateError(DatabaseError):
    """The mail is not in a state that allows the operation (50200-50299)."""


class LeaseLostError(MailStateError):
    """The lock token no longer matches: the lease expired and another worker
    may hold the mail (50202), or the mail is no longer leased (50203)."""


class UnknownMailError(MailStateError):
    """No mail has the given ID (50201)."""


class SenderNotAllowedError(InvalidInputError):
    """The application may not send through this account (50160) or as this
    From address (50161), the database user is mapped to another application
    (50168) or to none while the installation refuses unmapped enqueuers
    (50500): see mailq.BindApplication; or mailq.SetEnqueuePolicy was called
    by a user who is neither db_owner nor MailqAdmin (50502)."""


class IdempotencyKeyBusyError(InvalidInputError):
    """Another open transaction is enqueueing the same idempotency key (50162);
    nothing was written: retry once it ended."""


class MailFinalError(MailStateError):
    """mailq.StopMail: the mail is already final (Sent, Failed, Cancelled,
    Expired or Stopped); nothing was changed (50260)."""


class BatchRowError(InvalidInputError):
    """A row of mailq.EnqueueMailBatch is invalid (50220) and the batch was
    all-or-nothing: nothing was queued.  ``row``, ``field`` and ``rule`` (the
    EnqueueMail error number of the broken rule) are parsed from the message
    ("Row 17, field ToAddress, rule 50102: ..."); None if it has another shape."""

    _SHAPE = re.compile(r"Row (?P<row>-?\d+), field (?P<field>\w+), rule (?P<rule>\d+):")

    @property
    def row(self) -> int | None:
        m = self._SHAPE.search(str(self))
        return int(m.group("row")) if m else None

    @property
    def field(self) -> str | None:
        m = self._SHAPE.search(str(self))
        return m.group("field") if m else None

    @property
    def rule(self) -> int | None:
        m = self._SHAPE.search(str(self))
        return int(m.group("rule")) if m else None


class DelayExecutionError(DatabaseError):
    """Delayed-execution input or state error (50300-50399, 50540-50579)."""


class DeploymentCheckError(DatabaseError):
    """A deployment pre-condition failed (50400-50499), e.g. Service Broker disabled."""


#: Specific numbers that map to a more specific class than their block's.
SPECIFIC: dict[int, type[DatabaseError]] = {
    50201: UnknownMailError,
    50202: LeaseLostError,
    50203: LeaseLostError,
    # queue helper
    50160: SenderNotAllowedError,
    50161: SenderNotAllowedError,
    50168: SenderNotAllowedError,
    50162: IdempotencyKeyBusyError,
    # event stream
    50260: MailFinalError,
    # batch enqueue
    50220: BatchRowError,
    50221: InvalidInputError,
    50222: InvalidInputError,
    50224: InvalidInputError,
    50225: IdempotencyKeyBusyError,
    50226: InvalidInputError,
}

_BLOCKS: list[tuple[range, type[DatabaseError]]] = [
    (range(50100, 50200), InvalidInputError),
    (range(50220, 50240), InvalidInputError),  # batch enqueue input
    (range(50240, 50243), InvalidInputError),  # run modes input
    (range(50290, 50299), InvalidInputError),  # hooks: registration and dispatcher input
    (range(50520, 50540), InvalidInputError),  # queue reporting and event-stream stall input
    (range(50200, 50300), MailStateError),
    (range(50300, 50400), DelayExecutionError),
    (range(50400, 50500), DeploymentCheckError),
    (range(50540, 50580), DelayExecutionError),  # delayed execution, third design
]

# pyodbc messages look like:
#   [42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]@BatchSize must be ... (50130) (SQLExecDirectW)
_NATIVE = re.compile(r"\((\d+)\)\s*\(SQL\w+\)\s*$")
_PREFIX = re.compile(r"^(?:\[[^\]]*\]\s*)+")


def class_for(number: int | None) -> type[DatabaseError]:
    """The exception class for a SQL Server error number."""
    if number is None:
        return DatabaseError
    if number in SPECIFIC:
        return SPECIFIC[number]
    for block, cls in _BLOCKS:
        if number in block:
            return cls
    return DatabaseError


def parse_driver_message(text: str) -> tuple[int | None, str]:
    """Split a pyodbc/ODBC error text into (native error number, message)."""
    number = None
    match = _NATIVE.search(text)
    if match:
        number = int(match.group(1))
        text = text[: match.start()]
    return number, _PREFIX.sub("", text.strip()).strip()


def from_driver_error(exc: BaseException) -> DatabaseError:
    """Translate a pyodbc.Error into the matching DatabaseError subclass."""
    args: tuple[object, ...] = getattr(exc, "args", ())
    text = str(args[1]) if len(args) > 1 else str(exc)
    number, message = parse_driver_message(text)
    return class_for(number)(number, message)


# Mail templates (docs/templates.md).  50210-50214 are bad
# input although they sit in the 50200 block (the block assigned to templates).
class TemplateInputError(InvalidInputError):
    """A template procedure refused its input (50210-50214); nothing was written."""


class UnknownTemplateError(MailStateError):
    """No template has this name, or it has no such version (50215)."""


class TemplateStateError(MailStateError):
    """The template is retired (50216), its latest version is not the expected
    one (50217), or a version row was to be changed (50218: versions are immutable)."""


SPECIFIC.update({n: TemplateInputError for n in range(50210, 50215)})
SPECIFIC.update({50215: UnknownTemplateError, 50216: TemplateStateError,
                 50217: TemplateStateError, 50218: TemplateStateError})


# Templates and lazy attachments wired into enqueue (docs/templates.md,
# "Enqueueing with a template").  Bad input of EnqueueMail / EnqueueMailBatch,
# nothing written: InvalidInputError (50280, 50281, 50284-50286), unknown template or
# version UnknownTemplateError (50282), retired TemplateStateError (50283).  50289
# refuses a downgrade below 0016 (MailStateError, its block's class).
SPECIFIC.update({50280: InvalidInputError, 50281: InvalidInputError, 50282: UnknownTemplateError,
                 50283: TemplateStateError, 50284: InvalidInputError, 50285: InvalidInputError,
                 50286: InvalidInputError})


# Deployment: a downgrade that would drop tables holding rows
# (50420) or a column holding values (50422), and a database at a revision
# this package does not know (50421, deployed by a newer mailq-db).
SPECIFIC.update({50420: DeploymentCheckError, 50421: DeploymentCheckError, 50422: DeploymentCheckError})
# Who may send as whom and sending accounts (docs/enqueue.md): 50500
# (an unmapped enqueuer refused) and 50502 (SetEnqueuePolicy by a non-admin) are
# SenderNotAllowedError; the other numbers of 50500-50519 are bad input.
_BLOCKS.insert(0, (range(50500, 50520), InvalidInputError))
SPECIFIC.update({50500: SenderNotAllowedError, 50502: SenderNotAllowedError})
# Monitoring procedures (docs/monitoring/): bad input only, nothing written.
_BLOCKS.append((range(50580, 50600), InvalidInputError))


# Bounces, complaints, unsubscribes and suppression (docs/bounces.md).
class SuppressedRecipientError(InvalidInputError):
    """Every recipient of the mail is suppressed for its account or application
    (bounced, complained or unsubscribed): nothing was queued (50600)."""


class UnknownUnsubscribeError(MailStateError):
    """mailq.RecordUnsubscribe: the link names a mail that no longer exists
    (50611) or a recipient it does not have (50612)."""


SPECIFIC.update({50600: SuppressedRecipientError, 50611: UnknownUnsubscribeError,
                 50612: UnknownUnsubscribeError})
_BLOCKS.append((range(50600, 50640), InvalidInputError))  # suppression input
