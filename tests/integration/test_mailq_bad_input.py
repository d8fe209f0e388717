"""Bad input to the mail-queue procedures, against SQL Server 2022.

Every case of issue 3's "Bad input" list: the call is refused with the THROW
number documented in the procedure's header (checked through the package's
exception classes and ``.number``), and it writes nothing: every mutable
column of every mail-queue table is read before and after the call
(``mailq_helpers.fingerprint``) and must be identical.

Calls go through ``EXEC proc @Name = ?`` with exactly the parameters of the
case (``mailq_helpers.exec_proc``), because most of this input is what the
Python wrappers would never send.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Callable

import pytest

from mailq_helpers import (
    assert_unchanged,
    claim,
    enqueue,
    exec_proc,
    expect_error,
    fingerprint,
    new_account,
    new_app,
    result_sets,
    scalar,
)
from mailq_db import procedures
from mailq_db.errors import InvalidInputError, LeaseLostError, MailStateError, UnknownMailError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "bad")


@pytest.fixture(scope="module")
def app(conn) -> str:
    return new_app(conn, "bad")


def refused(conn, number: int, cls: type, call: Callable[[], Any]):
    """``call()`` raises ``cls`` with THROW ``number`` and changes no row of any mail-queue table."""
    before = fingerprint(conn)
    err = expect_error(number, call, cls=cls)
    assert_unchanged(before, fingerprint(conn))
    return err


# --------------------------------------------------------------------------
# mailq.EnqueueMail
# --------------------------------------------------------------------------


def attachments(*items: tuple[str, int]) -> Callable[[], str]:
    """@Attachments with files (name, size in bytes); built lazily (some are 25 MiB)."""
    return lambda: procedures.attachments_json(
        [procedures.Attachment(name, b"\x00" * size) for name, size in items]
    )


def addresses(n: int, width: int = 0) -> str:
    return ";".join(f"user{i:03d}{'x' * width}@example.com" for i in range(n))


MIB = 1024 * 1024

#: (case id, parameter overrides, THROW number).  A value may be a callable
#: (evaluated in the test) so that large values are built only when needed.
ENQUEUE_CASES: list[tuple[str, dict[str, Any], int]] = [
    # recipients
    ("to-null", {"ToAddress": None}, 50101),
    ("to-empty", {"ToAddress": ""}, 50101),
    ("to-only-separators-and-blanks", {"ToAddress": " ; ;  "}, 50101),
    ("to-no-domain", {"ToAddress": "user@"}, 50102),
    ("to-no-at", {"ToAddress": "user.example.com"}, 50102),
    ("to-no-local-part", {"ToAddress": "@example.com"}, 50102),
    ("to-space-inside", {"ToAddress": "first last@example.com"}, 50102),
    ("to-cr", {"ToAddress": "a@example.com\rBcc: victim@example.net"}, 50102),
    ("to-lf", {"ToAddress": "a@example.com\nBcc: victim@example.net"}, 50102),
    ("to-crlf-second-address", {"ToAddress": "a@example.com; b@example.com\r\n"}, 50102),
    # Only the control-character rule of mailq.ParseAddressList catches these
    # (no space, one @, no other forbidden character).
    ("to-cr-only", {"ToAddress": "a@exam\rple.com"}, 50102),
    ("to-lf-only", {"ToAddress": "a@example.com\n"}, 50102),
    ("to-crlf-only", {"ToAddress": "a@example.com\r\nX-Injected:1"}, 50102),
    ("to-tab", {"ToAddress": "a@exam\tple.com"}, 50102),
    ("to-nul", {"ToAddress": "a@exam\x00ple.com"}, 50102),
    ("to-unit-separator", {"ToAddress": "a@exam\x1fple.com"}, 50102),
    ("to-address-over-254", {"ToAddress": "a" * 250 + "@example.com"}, 50102),
    # display names ('Name <address>' is accepted since revision 0003)
    ("to-display-name-unclosed", {"ToAddress": "Bob <bob@example.com"}, 50102),
    ("to-display-name-over-200", {"ToAddress": "N" * 201 + " <bob@example.com>"}, 50102),
    ("to-display-name-with-angle", {"ToAddress": "B>ob <bob@example.com>"}, 50102),
    ("to-display-name-bad-address", {"ToAddress": "Bob <bob@>"}, 50102),
    # Header injection through a display name: spaces are legal there, so only
    # the control-character rule of mailq.ParseAddressList stands in the way.
    ("to-display-name-crlf", {"ToAddress": "Bob\r\nBcc: victim@example.net <bob@example.com>"}, 50102),
    ("to-display-name-lf", {"ToAddress": "Bob\nBcc: victim@example.net <bob@example.com>"}, 50102),
    ("cc-display-name-cr", {"CC": "Carol\rX-Injected: 1 <carol@example.com>"}, 50102),
    ("from-address-with-display-name", {"FromAddress": "Ops <ops@example.org>"}, 50102),
    ("to-two-at", {"ToAddress": "a@b@example.com"}, 50102),
    ("to-list-over-column-4000", {"ToAddress": addresses(90, width=30)}, 50103),
    ("cc-no-domain", {"CC": "copy@"}, 50102),
    ("bcc-space", {"BCC": "blind copy@example.com"}, 50102),
    ("cc-lf", {"CC": "c@example.com\nX-Evil: 1"}, 50102),
    ("too-many-recipients-to", {"ToAddress": addresses(101)}, 50104),
    ("too-many-recipients-across-to-cc-bcc",
     {"ToAddress": addresses(50), "CC": addresses(30), "BCC": addresses(21)}, 50104),
    # header injection and sizes of header values
    ("subject-cr", {"Subject": "Hello\rBcc: victim@example.net"}, 50105),
    ("subject-lf", {"Subject": "Hello\nBcc: victim@example.net"}, 50105),
    ("from-name-crlf", {"FromName": "Ops\r\nBcc: victim@example.net"}, 50105),
    ("reply-to-crlf", {"ReplyTo": "r@example.com\r\nBcc: victim@example.net"}, 50105),
    ("reply-to-two-addresses", {"ReplyTo": "r@example.com; s@example.com"}, 50102),
    ("reply-to-no-domain", {"ReplyTo": "r@"}, 50102),
    ("from-address-invalid", {"FromAddress": "sender at example.com"}, 50102),
    ("subject-over-900", {"Subject": "s" * 901}, 50103),
    ("from-name-over-200", {"FromName": "n" * 201}, 50103),
    ("reply-to-over-320", {"ReplyTo": "r" * 310 + "@example.com"}, 50103),
    ("idempotency-key-over-200", {"IdempotencyKey": "k" * 201}, 50103),
    # business headers
    ("headers-not-json", {"Headers": "X-Order-Id: 42"}, 50106),
    ("headers-json-array", {"Headers": '["X-Order-Id", "42"]'}, 50106),
    ("headers-json-string", {"Headers": '"X-Order-Id"'}, 50106),
    ("headers-number-value", {"Headers": '{"X-Order-Id": 42}'}, 50106),
    ("headers-null-value", {"Headers": '{"X-Order-Id": null}'}, 50106),
    ("headers-object-value", {"Headers": '{"X-Order": {"Id": "42"}}'}, 50106),
    ("headers-array-value", {"Headers": '{"X-Order-Id": ["42"]}'}, 50106),
    ("headers-same-name-twice", {"Headers": '{"X-Order-Id": "1", "x-order-id": "2"}'}, 50106),
    ("headers-over-50", {"Headers": json.dumps({f"X-H{i}": "v" for i in range(51)})}, 50106),
    ("header-name-with-space", {"Headers": '{"X Order": "42"}'}, 50107),
    ("header-name-with-colon", {"Headers": '{"X-Order:": "42"}'}, 50107),
    ("header-name-empty", {"Headers": '{"": "42"}'}, 50107),
    ("header-name-non-ascii", {"Headers": '{"X-Bestellnr-\u00e9": "42"}'}, 50107),
    ("header-name-over-76", {"Headers": json.dumps({"X-" + "a" * 75: "42"})}, 50107),
    *[
        (f"header-overrides-{name.lower()}", {"Headers": json.dumps({name: "x@example.com"})}, 50108)
        for name in ("From", "To", "Cc", "Subject", "Message-ID", "Date", "message-id", "BCC", "Reply-To")
    ],
    ("header-value-cr", {"Headers": json.dumps({"X-Order-Id": "42\rBcc: victim@example.net"})}, 50105),
    ("header-value-lf", {"Headers": json.dumps({"X-Order-Id": "42\nBcc: victim@example.net"})}, 50105),
    ("header-value-over-900", {"Headers": json.dumps({"X-Long": "v" * 901})}, 50103),
    # priority, expiry, attempts, format
    ("priority-negative", {"Priority": -1}, 50109),
    ("priority-over-9", {"Priority": 10}, 50109),
    ("priority-way-out", {"Priority": 256}, 50109),
    ("expiry-before-due", {"DateToProcess": datetime(2099, 1, 2), "ExpiresAtUtc": datetime(2099, 1, 1)}, 50110),
    ("expiry-equal-to-due", {"DateToProcess": datetime(2099, 1, 1), "ExpiresAtUtc": datetime(2099, 1, 1)}, 50110),
    ("expiry-before-default-due-now", {"ExpiresAtUtc": datetime(2000, 1, 1)}, 50110),
    ("max-attempts-0", {"MaxAttempts": 0}, 50119),
    ("max-attempts-21", {"MaxAttempts": 21}, 50119),
    ("body-format-unknown", {"BodyFormat": "Markdown"}, 50118),
    ("body-null", {"Body": None}, 50120),
    ("subject-null", {"Subject": None}, 50121),
    # sizes of body and attachments
    ("body-over-2000000", {"Body": lambda: "b" * 2_000_001}, 50111),
    ("text-body-over-2000000", {"BodyFormat": "Html", "TextBody": lambda: "t" * 2_000_001}, 50111),
    ("attachment-over-10-mib", {"Attachments": attachments(("big.bin", 10 * MIB + 1))}, 50112),
    ("attachments-total-over-25-mib",
     {"Attachments": attachments(("a.bin", 10 * MIB), ("b.bin", 10 * MIB), ("c.bin", 5 * MIB + 1))}, 50112),
    ("attachments-more-than-10", {"Attachments": attachments(*[(f"f{i}.txt", 10) for i in range(11)])}, 50112),
    ("attachment-name-empty", {"Attachments": attachments(("", 10))}, 50113),
    ("attachment-name-blank", {"Attachments": attachments(("   ", 10))}, 50113),
    ("attachment-name-dotdot-path", {"Attachments": attachments(("../etc/passwd", 10))}, 50113),
    ("attachment-name-slash", {"Attachments": attachments(("dir/report.pdf", 10))}, 50113),
    ("attachment-name-backslash", {"Attachments": attachments(("dir\\report.pdf", 10))}, 50113),
    ("attachment-name-drive", {"Attachments": attachments(("C:report.pdf", 10))}, 50113),
    ("attachment-name-dotdot", {"Attachments": attachments(("..", 10))}, 50113),
    ("attachment-name-control-char", {"Attachments": attachments(("a\nb.txt", 10))}, 50113),
    ("attachments-not-array", {"Attachments": '{"FileName": "a.txt", "ContentBase64": "AA=="}'}, 50117),
    ("attachment-not-base64", {"Attachments": '[{"FileName": "a.txt", "ContentBase64": "***"}]'}, 50117),
    ("attachment-without-content", {"Attachments": '[{"FileName": "a.txt"}]'}, 50117),
    # references
    ("unknown-account", {"AccountName": "no_such_account"}, 50114),
    ("unknown-application", {"AppName": "no_such_application"}, 50115),
]


def enqueue_params(account: str, overrides: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {"ToAddress": "rcpt@example.com", "Subject": "hello", "Body": "body",
                              "AccountName": account}
    for key, value in overrides.items():
        params[key] = value() if callable(value) else value
    return params


def test_the_base_mail_of_the_bad_input_cases_is_accepted(conn, account):
    """Guards every case below: without its one bad value, the mail would be queued."""
    before = scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;")
    result_sets(exec_proc(conn, "mailq.EnqueueMail", **enqueue_params(account, {})))
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue;") == before + 1


@pytest.mark.parametrize(("overrides", "number"), [c[1:] for c in ENQUEUE_CASES], ids=[c[0] for c in ENQUEUE_CASES])
def test_enqueue_refuses_bad_input_and_writes_nothing(conn, account, overrides, number):
    params = enqueue_params(account, overrides)
    err = refused(conn, number, InvalidInputError, lambda: exec_proc(conn, "mailq.EnqueueMail", **params))
    assert err.message, "the error names the parameter and the rule"


def test_enqueue_message_names_the_parameter(conn, account):
    err = refused(conn, 50105, InvalidInputError,
                  lambda: exec_proc(conn, "mailq.EnqueueMail", **enqueue_params(account, {"FromName": "a\nb"})))
    assert "@FromName" in err.message
    err = refused(conn, 50109, InvalidInputError,
                  lambda: exec_proc(conn, "mailq.EnqueueMail", **enqueue_params(account, {"Priority": 12})))
    assert "@Priority" in err.message and "12" in err.message


def test_idempotency_key_reused_with_different_content_is_refused(conn, account):
    key = f"order-{uuid.uuid4()}"
    first = procedures.enqueue_mail(conn, to_address="a@example.com", subject="Invoice 1", body="one",
                                    account_name=account, idempotency_key=key)
    assert first.created
    err = refused(conn, 50116, InvalidInputError, lambda: procedures.enqueue_mail(
        conn, to_address="a@example.com", subject="Invoice 1", body="ANOTHER BODY", account_name=account,
        idempotency_key=key))
    assert str(first.mail_id) in err.message
    # Another recipient, another priority or another attachment is other content too.
    for change in ({"to_address": "b@example.com"}, {"priority": 9},
                   {"attachments": [procedures.Attachment("a.txt", b"x")]}):
        kwargs = dict(to_address="a@example.com", subject="Invoice 1", body="one", account_name=account,
                      idempotency_key=key)
        kwargs.update(change)
        refused(conn, 50116, InvalidInputError, lambda: procedures.enqueue_mail(conn, **kwargs))
    assert scalar(conn, "SELECT COUNT_BIG(*) FROM mailq.MailQueue WHERE IdempotencyKey = ?;", key) == 1


# --------------------------------------------------------------------------
# mailq.ClaimMail
# --------------------------------------------------------------------------

CLAIM_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("batch-size-0", {"BatchSize": 0}, 50130),
    ("batch-size-negative", {"BatchSize": -5}, 50130),
    ("batch-size-1001", {"BatchSize": 1001}, 50130),
    ("lock-token-null", {"LockToken": None}, 50131),
    ("lease-0", {"LeaseSeconds": 0}, 50132),
    ("lease-negative", {"LeaseSeconds": -1}, 50132),
    ("lease-3601", {"LeaseSeconds": 3601}, 50132),
    ("app-name-unknown", {"AppName": "no_such_application"}, 50115),
    ("app-name-over-128", {"AppName": "a" * 129}, 50103),
    ("worker-name-over-128", {"WorkerName": "w" * 129}, 50103),
    ("account-names-not-json", {"AccountNames": "default,overseas"}, 50148),
    ("account-names-object", {"AccountNames": '{"name": "default"}'}, 50148),
    ("account-names-number-element", {"AccountNames": '["default", 7]'}, 50148),
]


@pytest.mark.parametrize(("overrides", "number"), [c[1:] for c in CLAIM_CASES], ids=[c[0] for c in CLAIM_CASES])
def test_claim_refuses_bad_input_and_claims_nothing(conn, account, overrides, number):
    # A due mail is waiting, so a claim that wrongly went ahead would change state.
    enqueue(conn, account, None, 1)
    params = {"BatchSize": 10, "LockToken": str(uuid.uuid4()), "LeaseSeconds": 300}
    params.update(overrides)
    refused(conn, number, InvalidInputError, lambda: exec_proc(conn, "mailq.ClaimMail", **params))


# --------------------------------------------------------------------------
# Acknowledgements: MarkSent, MarkFailed, ExtendLease, ReleaseMail
# --------------------------------------------------------------------------

ACK_PROCS: dict[str, dict[str, Any]] = {
    "mailq.MarkSent": {"SmtpCode": 250},
    "mailq.MarkFailed": {"Disposition": "Retry", "Error": "451 4.3.0 try again later"},
    "mailq.ExtendLease": {"LeaseSeconds": 60},
    "mailq.ReleaseMail": {},
}


@pytest.fixture
def leased(conn, account):
    """One mail leased under ``token``, one already Sent, one UnSent (never claimed)."""
    app = new_app(conn, "ack")
    leased_mail, sent_mail = enqueue(conn, account, app, 2)
    token, mails = claim(conn, app, batch_size=10)
    assert {m.id for m in mails} == {leased_mail.mail_id, sent_mail.mail_id}
    procedures.mark_sent(conn, ids=[sent_mail.mail_id], lock_token=token, smtp_code=250)
    (unsent_mail,) = enqueue(conn, account, app, 1)
    max_id = scalar(conn, "SELECT MAX(ID) FROM mailq.MailQueue;")
    return {"token": token, "leased": leased_mail.mail_id, "sent": sent_mail.mail_id,
            "unsent": unsent_mail.mail_id, "unknown": int(max_id) + 1_000_000}


#: (case, which mail, which token, THROW number, exception class)
FENCE_CASES = [
    ("unknown-id", "unknown", "own", 50201, UnknownMailError),
    ("wrong-token", "leased", "other", 50202, LeaseLostError),
    ("not-sending-never-claimed", "unsent", "own", 50203, LeaseLostError),
    ("not-sending-already-sent", "sent", "own", 50203, LeaseLostError),
]


@pytest.mark.parametrize("form", ["ID", "IDList"])
@pytest.mark.parametrize(("mail", "token", "number", "cls"), [c[1:] for c in FENCE_CASES],
                         ids=[c[0] for c in FENCE_CASES])
@pytest.mark.parametrize("proc", list(ACK_PROCS))
def test_acknowledgements_are_fenced_and_write_nothing(conn, leased, proc, mail, token, number, cls, form):
    mail_id = leased[mail]
    lock = leased["token"] if token == "own" else uuid.uuid4()
    params = dict(ACK_PROCS[proc])
    params[form] = mail_id if form == "ID" else json.dumps([mail_id])
    params["LockToken"] = str(lock)
    if proc == "mailq.MarkSent" and mail == "sent" and token == "own":
        # MarkSent is repeatable by its token (revision 0003): a repeat after a lost
        # reply is accepted, answers as the first call did, and changes nothing.
        before = fingerprint(conn)
        (rows,) = result_sets(exec_proc(conn, proc, **params))
        assert [(int(r[0]), r[1], r[2]) for r in rows] == [(mail_id, "Sent", None)]
        assert_unchanged(before, fingerprint(conn))
        return
    refused(conn, number, cls, lambda: exec_proc(conn, proc, **params))


@pytest.mark.parametrize("proc", list(ACK_PROCS))
def test_acknowledgement_wrappers_are_fenced_too(conn, leased, proc):
    """The Python wrappers (always @IDList) surface 50202 as LeaseLostError."""
    call = {
        "mailq.MarkSent": lambda: procedures.mark_sent(conn, ids=[leased["leased"]], lock_token=uuid.uuid4()),
        "mailq.MarkFailed": lambda: procedures.mark_failed(conn, ids=[leased["leased"]], lock_token=uuid.uuid4(),
                                                           disposition="Stop", error="550 no such user"),
        "mailq.ExtendLease": lambda: procedures.extend_lease(conn, ids=[leased["leased"]], lock_token=uuid.uuid4(),
                                                             lease_seconds=60),
        "mailq.ReleaseMail": lambda: procedures.release_mail(conn, ids=[leased["leased"]], lock_token=uuid.uuid4()),
    }[proc]
    refused(conn, 50202, LeaseLostError, call)


ACK_INPUT_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("lock-token-null", {"ID": "leased", "LockToken": None}, 50131),
    ("id-and-idlist", {"ID": "leased", "IDList": "[1]"}, 50136),
    ("neither-id-nor-idlist", {}, 50136),
    ("idlist-not-json", {"IDList": "1,2,3"}, 50137),
    ("idlist-object", {"IDList": '{"ID": 1}'}, 50137),
    ("idlist-empty", {"IDList": "[]"}, 50137),
    ("idlist-string-element", {"IDList": '[1, "2"]'}, 50137),
    ("idlist-fraction", {"IDList": "[1.5]"}, 50137),
    ("idlist-over-1000", {"IDList": json.dumps(list(range(1, 1002)))}, 50137),
]


@pytest.mark.parametrize(("overrides", "number"), [c[1:] for c in ACK_INPUT_CASES],
                         ids=[c[0] for c in ACK_INPUT_CASES])
@pytest.mark.parametrize("proc", list(ACK_PROCS))
def test_acknowledgements_refuse_bad_id_input(conn, leased, proc, overrides, number):
    params = dict(ACK_PROCS[proc])
    params["LockToken"] = str(leased["token"])
    for key, value in overrides.items():
        params[key] = leased[value] if value in ("leased",) else value
    refused(conn, number, InvalidInputError, lambda: exec_proc(conn, proc, **params))


MARK_FAILED_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("disposition-unknown", {"Disposition": "Later"}, 50133),
    ("disposition-null", {"Disposition": None}, 50133),
    ("disposition-empty", {"Disposition": ""}, 50133),
    ("retry-after-negative", {"RetryAfterSeconds": -1}, 50134),
    ("retry-after-over-7-days", {"RetryAfterSeconds": 604801}, 50134),
    ("error-null", {"Error": None}, 50139),
    ("error-blank", {"Error": "   "}, 50139),
    ("smtp-code-199", {"SmtpCode": 199}, 50147),
    ("smtp-code-600", {"SmtpCode": 600}, 50147),
]


@pytest.mark.parametrize(("overrides", "number"), [c[1:] for c in MARK_FAILED_CASES],
                         ids=[c[0] for c in MARK_FAILED_CASES])
def test_mark_failed_refuses_bad_input(conn, leased, overrides, number):
    params = {"ID": leased["leased"], "LockToken": str(leased["token"]), "Disposition": "Retry",
              "Error": "451 try again later"}
    params.update(overrides)
    refused(conn, number, InvalidInputError, lambda: exec_proc(conn, "mailq.MarkFailed", **params))


@pytest.mark.parametrize("code", [0, 199, 600])
def test_mark_sent_refuses_smtp_code_out_of_range(conn, leased, code):
    refused(conn, 50147, InvalidInputError, lambda: exec_proc(
        conn, "mailq.MarkSent", ID=leased["leased"], LockToken=str(leased["token"]), SmtpCode=code))


@pytest.mark.parametrize("lease", [0, -1, 3601])
def test_extend_lease_refuses_lease_out_of_range(conn, leased, lease):
    refused(conn, 50132, InvalidInputError, lambda: exec_proc(
        conn, "mailq.ExtendLease", ID=leased["leased"], LockToken=str(leased["token"]), LeaseSeconds=lease))


# --------------------------------------------------------------------------
# Administration
# --------------------------------------------------------------------------

PURGE_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("older-than-negative", {"OlderThanDays": -1}, 50135),
    ("older-than-null", {"OlderThanDays": None}, 50135),
    ("batch-size-0", {"OlderThanDays": 30, "BatchSize": 0}, 50140),
    ("batch-size-1001", {"OlderThanDays": 30, "BatchSize": 1001}, 50140),
]


@pytest.mark.parametrize(("params", "number"), [c[1:] for c in PURGE_CASES], ids=[c[0] for c in PURGE_CASES])
def test_purge_refuses_bad_input(conn, params, number):
    refused(conn, number, InvalidInputError, lambda: exec_proc(conn, "mailq.PurgeMail", **params))


def test_purge_refuses_to_run_inside_a_transaction(conn):
    before = fingerprint(conn)
    cursor = conn.cursor()
    cursor.execute("BEGIN TRANSACTION;")
    try:
        expect_error(50141, lambda: exec_proc(conn, "mailq.PurgeMail", OlderThanDays=0), cls=InvalidInputError)
    finally:
        cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;")
        cursor.close()
    assert_unchanged(before, fingerprint(conn))


def test_cancel_and_requeue_refuse_bad_input(conn, leased):
    refused(conn, 50136, InvalidInputError, lambda: exec_proc(conn, "mailq.CancelMail", ID=None))
    refused(conn, 50136, InvalidInputError, lambda: exec_proc(conn, "mailq.RequeueMail", ID=None))
    refused(conn, 50201, UnknownMailError, lambda: procedures.cancel_mail(conn, mail_id=leased["unknown"]))
    refused(conn, 50201, UnknownMailError, lambda: procedures.requeue_mail(conn, mail_id=leased["unknown"]))
    for attempts in (0, 21):
        refused(conn, 50119, InvalidInputError,
                lambda: procedures.requeue_mail(conn, mail_id=leased["sent"], max_attempts=attempts))
    refused(conn, 50204, MailStateError, lambda: procedures.cancel_mail(conn, mail_id=leased["leased"]))
    refused(conn, 50205, MailStateError, lambda: procedures.requeue_mail(conn, mail_id=leased["unsent"]))


ACCOUNT_CASES: list[tuple[str, dict[str, Any], int]] = [
    ("account-name-null", {"AccountName": None}, 50142),
    ("account-name-blank", {"AccountName": "  "}, 50142),
    ("account-name-over-128", {"AccountName": "a" * 129}, 50103),
    ("from-address-null-new-account", {"DefaultFromAddress": None}, 50503),
    ("from-address-invalid", {"DefaultFromAddress": "noreply"}, 50102),
    ("from-address-two", {"DefaultFromAddress": "a@example.org; b@example.org"}, 50102),
    ("from-address-with-display-name", {"DefaultFromAddress": "Ops <ops@example.org>"}, 50102),
    ("from-name-crlf", {"DefaultFromName": "Ops\r\nBcc: victim@example.net"}, 50105),
    ("per-minute-0", {"PerMinuteLimit": 0}, 50143),
    ("per-hour-negative", {"PerHourLimit": -1}, 50143),
    ("per-day-0", {"PerDayLimit": 0}, 50143),
    ("clear-unknown-setting", {"Clear": "DefaultFromAddress"}, 50504),
    ("clear-and-set-one-setting", {"Clear": "PerDayLimit", "PerDayLimit": 10}, 50504),
]


@pytest.mark.parametrize(("overrides", "number"), [c[1:] for c in ACCOUNT_CASES],
                         ids=[c[0] for c in ACCOUNT_CASES])
def test_upsert_sending_account_refuses_bad_input(conn, overrides, number):
    params = {"AccountName": f"acct_{uuid.uuid4().hex[:8]}", "DefaultFromAddress": "noreply@example.org"}
    params.update(overrides)
    refused(conn, number, InvalidInputError, lambda: exec_proc(conn, "mailq.UpsertSendingAccount", **params))


def test_other_admin_procedures_refuse_bad_input(conn):
    refused(conn, 50145, InvalidInputError, lambda: exec_proc(conn, "mailq.UpsertApplication", AppName=""))
    refused(conn, 50145, InvalidInputError, lambda: exec_proc(conn, "mailq.UpsertApplication", AppName=None))
    refused(conn, 50103, InvalidInputError, lambda: exec_proc(conn, "mailq.UpsertApplication", AppName="a" * 129))
    refused(conn, 50142, InvalidInputError, lambda: exec_proc(conn, "mailq.UnblockSendingAccount", AccountName=""))
    refused(conn, 50114, InvalidInputError,
            lambda: procedures.unblock_sending_account(conn, account_name="no_such_account"))
    for n in (0, 1001):
        refused(conn, 50146, InvalidInputError, lambda: procedures.get_queue_stats(conn, recent_failures=n))
