"""``mailq-db enqueue``: queue one mail through mailq.EnqueueMail, or many
from a JSON file through mailq.EnqueueMailBatch (``--batch``)."""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import sys
from datetime import datetime, timezone

from .. import procedures
from ..connection import connect
from ..errors import ConfigurationError
from ..procedures import Attachment

HELP = """\
Queue one mail (mailq.EnqueueMail). The worker sends it when it is due.

Recipients may be repeated or ';'-separated. Bodies come from UTF-8 files
('-' reads standard input); with both --html-file and --text-file the text is
the plain alternative of the HTML. Times are ISO 8601; without an offset they
are UTC.

examples:
  mailq-db enqueue --to a@example.com --subject "Hi" --text-file body.txt
  mailq-db enqueue --to "张三 <zhang@example.com>" --cc b@example.com --subject "季度报告" \\
      --html-file report.html --text-file report.txt --attach report.pdf --account billing
  echo "nightly run done" | mailq-db enqueue --to ops@example.com --subject done --text-file - \\
      --priority 9 --send-at 2030-01-01T08:00:00+08:00 --idempotency-key nightly-2030-01-01
  mailq-db enqueue --batch mails.json            # one call, all or nothing (docs/batch-enqueue.md)
  mailq-db enqueue --batch mails.json --reject-invalid
  mailq-db enqueue --to qa@example.com --subject "Test" --text-file body.txt --run-mode staging

--batch FILE takes a JSON array of mails whose fields are mailq.EnqueueMailBatch's
(ToAddress, Subject, Body, ...: docs/batch-enqueue.md); '-' reads standard input.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("enqueue", help="queue one mail (or a JSON batch: --batch FILE)", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--to", action="append", metavar="ADDRESS",
                   help="recipient (repeat, or separate with ';'); at least one of --to, --cc, --bcc")
    p.add_argument("--cc", action="append", default=[], metavar="ADDRESS")
    p.add_argument("--bcc", action="append", default=[], metavar="ADDRESS", help="envelope only, never a header")
    p.add_argument("--subject")
    p.add_argument("--text-file", metavar="FILE", help="plain-text body (or the HTML's text alternative)")
    p.add_argument("--html-file", metavar="FILE", help="HTML body")
    p.add_argument("--from", dest="from_address", metavar="ADDRESS", help="default: the account's address")
    p.add_argument("--from-name")
    p.add_argument("--reply-to", metavar="ADDRESS")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="extra header (repeat)")
    p.add_argument("--attach", action="append", default=[], metavar="FILE", help="attachment (repeat)")
    p.add_argument("--account", help="sending account (default: the default account)")
    p.add_argument("--app", help="application name (for isolated workers)")
    p.add_argument("--run-mode", metavar="NAME",
                   help="run mode of the mail (default prod): only workers serving it send it (docs/run-modes.md)")
    p.add_argument("--priority", type=_priority, help="0 (lowest) to 9 (highest)")
    p.add_argument("--send-at", type=_when, metavar="TIME", help="not before this time (ISO 8601)")
    p.add_argument("--expires-at", type=_when, metavar="TIME", help="give up after this time (ISO 8601)")
    p.add_argument("--max-attempts", type=_positive)
    p.add_argument("--idempotency-key", help="a second enqueue with the same key returns the first mail")
    p.add_argument("--template", metavar="NAME",
                   help="render subject and body from this stored template at send time (instead of "
                        "--subject and a body; docs/templates.md)")
    p.add_argument("--template-version", type=_positive, metavar="N", help="pin a version of --template")
    p.add_argument("--model", metavar="FILE", help="the template's JSON model ('-' for stdin; default {})")
    p.add_argument("--batch", metavar="FILE", help="queue every mail of a JSON array in one call")
    p.add_argument("--reject-invalid", action="store_true",
                   help="with --batch: queue the valid mails and list the invalid ones (default: all or nothing)")
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.set_defaults(func=run, parser=p)


def _priority(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 9:
        raise argparse.ArgumentTypeError(f"must be 0-9, got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _when(text: str) -> datetime:
    """ISO 8601 -> naive UTC (the procedures' convention)."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r} (e.g. 2030-01-01T08:00:00+08:00)") from None
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _joined(values: list[str]) -> str | None:
    items = [v.strip() for value in values for v in value.split(";") if v.strip()]
    return ";".join(items) or None


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from exc


def _attachment(path: str) -> Attachment:
    try:
        with open(path, "rb") as fh:
            content = fh.read()
    except OSError as exc:
        raise ConfigurationError(f"cannot read attachment {path}: {exc.strerror}") from exc
    content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return Attachment(os.path.basename(path), content, content_type)


def _headers(items: list[str]) -> dict[str, str] | None:
    headers = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigurationError(f"--header takes NAME=VALUE, got {item!r}")
        headers[name.strip()] = value
    return headers or None


def run(args) -> int:
    if args.batch:
        return run_batch(args)
    if args.template is None and (args.template_version is not None or args.model is not None):
        args.parser.error("--template-version and --model go with --template")
    if not (args.to or args.cc or args.bcc):
        args.parser.error("give at least one recipient: --to, --cc or --bcc")
    if args.subject is None and not args.template:
        args.parser.error("the following arguments are required: --subject")
    if args.reject_invalid:
        args.parser.error("--reject-invalid goes with --batch")
    if args.template and (args.subject is not None or args.text_file or args.html_file):
        raise ConfigurationError("--template renders the subject and the body: leave out --subject, "
                                 "--text-file and --html-file")
    if not args.template and not args.text_file and not args.html_file:
        raise ConfigurationError("give a body: --text-file FILE and/or --html-file FILE ('-' for stdin)")
    if args.text_file == "-" and args.html_file == "-":
        raise ConfigurationError("only one of --text-file/--html-file can read standard input")
    text = _read(args.text_file) if args.text_file else None
    html = _read(args.html_file) if args.html_file else None
    request = dict(
        to_address=_joined(args.to or []), cc=_joined(args.cc), bcc=_joined(args.bcc),
        subject=args.subject, body=html if html is not None else text,
        body_format="Html" if html is not None else "Text",
        text_body=text if html is not None else None,
        from_address=args.from_address, from_name=args.from_name, reply_to=args.reply_to,
        headers=_headers(args.header), account_name=args.account, app_name=args.app,
        priority=args.priority, date_to_process=args.send_at, expires_at_utc=args.expires_at,
        max_attempts=args.max_attempts, idempotency_key=args.idempotency_key,
        attachments=[_attachment(p) for p in args.attach],
        run_mode=args.run_mode,
    )
    if args.template:  # rendered by the worker
        request.update(subject=None, body=None, body_format=None, text_body=None,
                       template_name=args.template, template_version=args.template_version,
                       template_model=_read(args.model) if args.model else None)
    if not (request["to_address"] or request["cc"] or request["bcc"]):
        raise ConfigurationError("--to, --cc and --bcc name no address: give at least one recipient")
    conn = connect(args.db)
    try:
        result = procedures.enqueue_mail(conn, **request)
    finally:
        conn.close()
    state = "queued" if result.created else "already queued (same idempotency key)"
    print(f"mail {result.mail_id} {state}; Message-ID {result.message_id}")
    return 0


#: Single-mail options that --batch leaves to the file.
_SINGLE_ONLY = ("to", "cc", "bcc", "subject", "text_file", "html_file", "from_address", "from_name", "reply_to",
                "header", "attach", "account", "app", "priority", "send_at", "expires_at", "max_attempts",
                "idempotency_key", "run_mode")


def run_batch(args) -> int:
    given = [name for name in _SINGLE_ONLY if getattr(args, name) not in (None, [])]
    if given:
        args.parser.error("--batch takes every field from the file; leave out "
                          + ", ".join("--" + name.replace("_", "-") for name in given))
    text = _read(args.batch)
    try:
        mails = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{args.batch} is not JSON: {exc}") from exc
    if not isinstance(mails, list) or not all(isinstance(m, dict) for m in mails):
        raise ConfigurationError(f"{args.batch} must hold a JSON array of objects (one per mail)")
    conn = connect(args.db)
    try:
        result = procedures.enqueue_mail_batch_json(conn, text, reject_invalid=args.reject_invalid)
    finally:
        conn.close()
    created = sum(1 for r in result.enqueued if r.created)
    again = len(result.enqueued) - created
    print(f"{created} mails queued" + (f", {again} already queued (same idempotency key)" if again else "")
          + (f"; {len(result.rejected)} rejected" if result.rejected else ""))
    for r in result.rejected:
        print(f"row {r.row_no}: {r.field} [{r.error_number}] {r.message}")
    return 1 if result.rejected else 0
