"""``mailq-db classify``: what the worker does with an SMTP reply, and which rule decided."""

from __future__ import annotations

import argparse
import json
import sys

from ..worker import classify as engine

HELP = """\
Classify one SMTP reply the way the sender worker does: the disposition
(Retry / Wait / Stop), its scope (recipient, mail, sender, account, connection), the
suggested wait, and the rule of the table (src/mailq_db/worker/smtp_rules.toml)
that decided, with the public document it comes from. Nothing is sent and no
database is needed.

The reply is given as the server wrote it, code first ("550 5.1.1 ..."); a
multi-line reply ("550-5.7.26 ..." lines) may be passed as one argument, or
"-" to read it from standard input. Without a code in the text, give --code.

examples:
  mailq-db classify "550 5.1.1 <bob@example.com>: Recipient address rejected: User unknown"
  mailq-db classify "450 4.7.1 Error: too much mail from 192.0.2.1" --stage mail
  mailq-db classify "550 Ip frequency limited" --stage mail --provider qq
  mailq-db classify "421 4.7.0 Try again later, closing connection." --provider smtp.gmail.com
  mailq-db classify "Mailbox unavailable or access denied" --code 550 --provider qq --json
"""

SCOPE_MEANING = {
    engine.RECIPIENT: "this recipient only: the mail goes on to the other recipients",
    engine.MAIL: "this mail",
    engine.SENDER: "this sender address (the mail's From): a Stop fails the mail, a Retry pauses that "
                   "From address; never the whole account",
    engine.ACCOUNT: "every mail of the account: the account is blocked",
    engine.CONNECTION: "this SMTP session: reconnect and send the mail again",
}
DISPOSITION_MEANING = {
    engine.RETRY: "try again later (the attempt is consumed)",
    engine.WAIT: "the account waits (the attempt is refunded)",
    engine.STOP: "permanent: fail it now",
}


def register(subparsers) -> None:
    p = subparsers.add_parser("classify", help="what the worker does with an SMTP reply, and why",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reply", help='the reply as the server wrote it, e.g. "550 5.1.1 User unknown" ("-": stdin)')
    p.add_argument("--stage", default="rcpt", choices=engine.STAGES,
                   help="the command the reply answered (default: rcpt)")
    p.add_argument("--provider", metavar="NAME",
                   help="provider id or alias (qq, gmail, netease, ...) or the server's host name, "
                        "greeting or EHLO domain (default: recognised from the reply)")
    p.add_argument("--code", type=_code, metavar="NNN", help="reply code when the text has none")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run, parser=p)


def _code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 200 <= value <= 599:
        raise argparse.ArgumentTypeError(f"must be 200-599, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    reply = sys.stdin.read() if args.reply == "-" else args.reply
    code, text = engine.split_reply(reply)
    if args.code is not None:
        if code is not None and code != args.code:
            args.parser.error(f"--code {args.code} contradicts the reply's code {code}")
        code = args.code
    if code is None:
        args.parser.error("the reply has no leading code (e.g. \"550 ...\"); give --code")
        raise AssertionError("argparse's error() exits")  # pragma: no cover
    outcome = engine.classify_reply(code, text, args.stage, args.provider)
    rule = engine.TABLE.by_id(outcome.rule)
    provider = engine.resolve_provider(args.provider) if args.provider else None
    how = "given" if provider else ""
    if not provider:
        provider = engine.resolve_provider(" ".join(text.split()))
        how = "recognised from the reply" if provider else ""
    status = engine.enhanced_status(text)
    result = {
        "disposition": outcome.disposition,
        "scope": outcome.scope,
        "wait_seconds": outcome.retry_after_seconds,
        "rule": outcome.rule,
        "tier": rule.tier if rule else None,
        "why": rule.why if rule else "",
        "source": outcome.source,
        "provider": provider,
        "stage": args.stage,
        "code": code,
        "status": ".".join(map(str, status)) if status else None,
        "reason": outcome.reason,
    }
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
        return 0
    wait = (f"{outcome.retry_after_seconds} s" if outcome.retry_after_seconds is not None
            else "the database's default backoff")
    lines = [
        ("disposition", f"{outcome.disposition} - {DISPOSITION_MEANING[outcome.disposition]}"),
        ("scope", f"{outcome.scope} - {SCOPE_MEANING[outcome.scope]}"),
        ("wait", wait),
        ("rule", f"{outcome.rule} ({rule.tier} table)" if rule else outcome.rule),
        ("why", result["why"] or "-"),
        ("source", outcome.source or "-"),
        ("provider", f"{provider} ({how})" if provider else "not recognised"),
        ("stage", f"{args.stage.upper()}, code {code}, enhanced status {result['status'] or '-'}"),
    ]
    for name, value in lines:
        print(f"{name + ':':<13}{value}")
    return 0
