"""``mailq-db template``: render mail templates offline (previews, CI of templates)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigurationError
from ..templates import MailTemplate, TemplateError, check_template, render_mail

HELP = """\
Render a mail template with a JSON model, the way the sender worker will
(Jinja2's sandbox, undefined variables are errors, HTML autoescaped), with no
database.  For previews, and for CI: the exit code is 1 with one clear line
on standard error when the template or the model is wrong (syntax error,
undefined variable, a refused construct, broken JSON, over a size limit).

--file is the body: HTML with --html (autoescaped), text otherwise.
--text-file adds the text alternative of an HTML mail.  --subject (or
--subject-file) is the subject template; without one, "(no subject)".
--check compiles the parts without a model (what to run before
mailq.AddMailTemplateVersion).

examples:
  mailq-db template render --file welcome.html --html --text-file welcome.txt \\
      --subject 'Welcome, {{ user.name }}' --model model.json
  mailq-db template render --file reminder.txt --model model.json --json
  mailq-db template render --file welcome.html --html --check
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("template", help="render mail templates offline (previews, CI)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="template_command", metavar="SUBCOMMAND")
    r = sub.add_parser("render", help="render a template file with a JSON model",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--file", required=True, metavar="TEMPLATE", help="the body template (HTML with --html)")
    r.add_argument("--html", action="store_true", help="--file is HTML: autoescape it")
    r.add_argument("--text-file", metavar="TEMPLATE", help="the text alternative (with --html)")
    subject = r.add_mutually_exclusive_group()
    subject.add_argument("--subject", metavar="TEMPLATE", help="the subject template (one line)")
    subject.add_argument("--subject-file", metavar="FILE", help="read the subject template from a file")
    r.add_argument("--model", metavar="MODEL.json", help="the model: a JSON object ('-': standard input)")
    r.add_argument("--check", action="store_true", help="only compile the parts (no model needed)")
    r.add_argument("--name", default=None, help="the template name to show in messages (default: the file name)")
    r.add_argument("--json", action="store_true", help="print the rendered parts as one JSON object")
    r.set_defaults(func=run_render, parser=r)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{what} {path} is not UTF-8 (byte {exc.start})") from exc


def run_render(args: argparse.Namespace) -> int:
    if args.text_file and not args.html:
        args.parser.error("--text-file is the text alternative of an HTML body: give --html too")
    if not args.check and not args.model:
        args.parser.error("give --model MODEL.json (or --check to compile without a model)")
    body = _read(args.file, "template")
    subject = args.subject if args.subject is not None else (
        _read(args.subject_file, "subject template").strip("\r\n") if args.subject_file else "(no subject)")
    template = MailTemplate(
        name=args.name or Path(args.file).name,
        subject=subject,
        html=body if args.html else None,
        text=_read(args.text_file, "template") if args.text_file else (None if args.html else body),
    )
    try:
        if args.check:
            check_template(template)
            print(f"{template.name}: every part compiles")
            return 0
        model = _read(args.model, "model")
        rendered = render_mail(template, model)
    except TemplateError as exc:
        print(f"mailq-db template render: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"subject": rendered.subject, "html": rendered.html, "text": rendered.text},
                         ensure_ascii=False, indent=2))
        return 0
    print(f"Subject: {rendered.subject}")
    for label, part in (("html", rendered.html), ("text", rendered.text)):
        if part is not None:
            print(f"--- {label} ---")
            sys.stdout.write(part if part.endswith("\n") else part + "\n")
    return 0
