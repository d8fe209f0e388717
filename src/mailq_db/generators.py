"""Lazy attachments: content produced at send time by a named generator.

An attachment may name a *generator* instead of carrying its bytes: an entry
point in the group ``mailq_db.attachment_generators`` that the worker's
installation provides (its own package's ``pyproject.toml``)::

    [project.entry-points."mailq_db.attachment_generators"]
    invoice-pdf = "billing.mail:invoice_pdf"

The generator is called with one argument, the attachment's JSON arguments
as a dict, and returns the content: ``bytes``, ``str`` (encoded UTF-8), an
iterable of ``bytes`` chunks (counted as they come, so an oversized output is
stopped early), or a :class:`Generated` to choose the content type or file
name as well.  The output is held to the same limits as any attachment
(:class:`mailq_db.templates.Limits`: 10 MiB each, 25 MiB and 10 per mail,
the numbers mailq.EnqueueMail enforces).

Built in: ``csv`` (:func:`csv_from_rows`), CSV from JSON rows.

Every failure is an :class:`AttachmentError` naming the generator and what
went wrong, never a traceback.  Use::

    att = generate_attachment("csv", row.arguments_json, file_name=row.file_name)
    check_attachments([*stored, att])     # the per-mail limits
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterable, Mapping

from .errors import MailqError
from .procedures import Attachment
from .templates import DEFAULT_LIMITS, Limits

GROUP = "mailq_db.attachment_generators"
#: what the worker's message builder accepts (worker/message.py: type/subtype, RFC 2045 tokens)
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+$")


class AttachmentError(MailqError):
    """A lazy attachment could not be produced; ``str()`` names the generator and the cause."""

    def __init__(self, detail: str, *, generator: str | None = None, file_name: str | None = None,
                 transient: bool = False):
        self.generator = generator
        self.file_name = file_name
        #: True when the generator itself raised (a service it calls timed out,
        #: a file was locked ...): the same call may succeed later.  False for
        #: what no retry can change (unknown generator, bad arguments, output
        #: over the limits, a bad file name or content type).
        self.transient = transient
        self.detail = " ".join(str(detail).split())[:600]
        where = ", ".join(b for b in (
            f"attachment {file_name!r}" if file_name else "",
            f"generator {generator!r}" if generator else "",
        ) if b)
        super().__init__(f"{where}: {self.detail}" if where else self.detail)

    def reason(self, limit: int = 4000) -> str:
        return str(self)[:limit]


@dataclass(frozen=True)
class Generated:
    """What a generator may return to choose more than the bytes."""

    content: bytes | str | Iterable[bytes]
    content_type: str | None = None
    file_name: str | None = None


def installed_generators() -> dict[str, Callable[..., Any] | metadata.EntryPoint]:
    """The generators this installation provides, by name (entry points, not yet loaded)."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def _resolve(name: str, registry: Mapping[str, Any] | None) -> Callable[[dict[str, Any]], Any]:
    available = installed_generators() if registry is None else dict(registry)
    if name not in available:
        names = ", ".join(sorted(available)) or "none"
        raise AttachmentError(f"no generator of this name is installed (group {GROUP!r}; installed: {names})",
                              generator=name)
    target = available[name]
    if isinstance(target, metadata.EntryPoint):
        try:
            target = target.load()
        except Exception as exc:  # noqa: BLE001 - an installation problem, said plainly
            raise AttachmentError(f"cannot load {target.value}: {type(exc).__name__}: {exc}", generator=name) from None
    if not callable(target):
        raise AttachmentError("the entry point is not callable", generator=name)
    return target


def _arguments(arguments: str | bytes | Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        raise AttachmentError(f"the arguments are not valid JSON: {exc}", generator=name) from None
    if not isinstance(value, dict):
        raise AttachmentError("the arguments must be a JSON object ({...})", generator=name)
    return value


def _collect(content: Any, limit: int, name: str, file_name: str | None) -> bytes:
    def over() -> AttachmentError:
        return AttachmentError(f"the output is over {limit:,} bytes, the limit per attachment",
                               generator=name, file_name=file_name)

    if isinstance(content, str):
        content = content.encode("utf-8")
    if isinstance(content, (bytes, bytearray, memoryview)):
        data = bytes(content)
        if len(data) > limit:
            raise over()
        return data
    if isinstance(content, Iterable):
        out = bytearray()
        for chunk in content:
            if isinstance(chunk, str):
                chunk = chunk.encode("utf-8")
            if not isinstance(chunk, (bytes, bytearray, memoryview)):
                raise AttachmentError(f"an iterable output must yield bytes, got {type(chunk).__name__}",
                                      generator=name, file_name=file_name)
            out += chunk
            if len(out) > limit:
                raise over()
        return bytes(out)
    raise AttachmentError(f"a generator must return bytes, str, an iterable of bytes or Generated, "
                          f"got {type(content).__name__}", generator=name, file_name=file_name)


def generate_attachment(
    generator: str,
    arguments: str | bytes | Mapping[str, Any] | None,
    *,
    file_name: str | None = None,
    content_type: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    registry: Mapping[str, Any] | None = None,
) -> Attachment:
    """Run ``generator`` with ``arguments`` (a JSON object) and return the attachment.

    ``file_name``/``content_type`` given here win over the generator's own;
    the file name must be a bare name (as mailq.MailAttachment requires).
    ``registry`` replaces the installed entry points (tests, embedding).
    """
    func = _resolve(generator, registry)
    args = _arguments(arguments, generator)
    try:
        result = func(args)
        produced_type = produced_name = None
        if isinstance(result, Generated):
            produced_type, produced_name = result.content_type, result.file_name
            result = result.content
        data = _collect(result, limits.max_attachment_bytes, generator, file_name or produced_name)
    except AttachmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - the generator's own failure: class and message, no traceback
        raise AttachmentError(f"failed: {type(exc).__name__}: {exc}", generator=generator,
                              file_name=file_name, transient=True) from None
    name = file_name or produced_name or f"{generator}.bin"
    if not name.strip() or any(c in name for c in "/\\:\r\n") or len(name) > 255:
        raise AttachmentError("the file name must be a bare name of 1-255 characters without / \\ :",
                              generator=generator, file_name=name)
    ctype = content_type or produced_type or "application/octet-stream"
    if not _CONTENT_TYPE.match(ctype):
        raise AttachmentError(f"bad content type {ctype!r}: write type/subtype, e.g. text/csv, without parameters",
                              generator=generator, file_name=name)
    return Attachment(file_name=name, content=data, content_type=ctype)


def check_attachments(attachments: Iterable[Attachment], *, limits: Limits = DEFAULT_LIMITS) -> None:
    """The per-mail limits (count, each, total) over stored and generated attachments together."""
    items = list(attachments)
    if len(items) > limits.max_attachments:
        raise AttachmentError(f"{len(items)} attachments; the limit is {limits.max_attachments} per mail")
    for a in items:
        if len(a.content) > limits.max_attachment_bytes:
            raise AttachmentError(f"{len(a.content):,} bytes; the limit is {limits.max_attachment_bytes:,} "
                                  "per attachment", file_name=a.file_name)
    total = sum(len(a.content) for a in items)
    if total > limits.max_mail_attachment_bytes:
        raise AttachmentError(f"the attachments total {total:,} bytes; the limit is "
                              f"{limits.max_mail_attachment_bytes:,} per mail")


# --------------------------------------------------------------------------
# Built-in generator: CSV from JSON rows
# --------------------------------------------------------------------------

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any, neutralize: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    if neutralize and text.startswith(_FORMULA_START) and not _is_number(text):
        # OWASP "CSV injection": a spreadsheet runs a cell starting with = + - @
        # as a formula; a leading apostrophe makes it text.
        text = "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_from_rows(args: dict[str, Any]) -> Generated:
    """CSV from JSON rows.  Arguments (a JSON object):

    ``rows``       required: a list of objects (columns from ``columns`` or the
                   keys in first-seen order) or a list of lists
    ``columns``    optional: the column names (and order) to write
    ``header``     default true: write the column names first
    ``delimiter``  default ``","``: one character
    ``excel``      default false: start with a UTF-8 byte-order mark, so Excel
                   reads non-Latin text (Chinese names) correctly
    ``neutralize_formulas`` default true: prefix ``'`` to a text cell that
                   starts with = + - @ (OWASP CSV injection)
    """
    rows = args.get("rows")
    if not isinstance(rows, list):
        raise ValueError("'rows' must be a list of objects or of lists")
    columns = args.get("columns")
    if columns is not None and not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        raise ValueError("'columns' must be a list of strings")
    delimiter = args.get("delimiter", ",")
    if not (isinstance(delimiter, str) and len(delimiter) == 1 and delimiter not in "\"\r\n"):
        raise ValueError("'delimiter' must be one character (not a quote or a line break)")
    header = bool(args.get("header", True))
    neutralize = bool(args.get("neutralize_formulas", True))

    if rows and all(isinstance(r, dict) for r in rows):
        if columns is None:
            columns = list(dict.fromkeys(k for r in rows for k in r))
        table = [[r.get(c) for c in columns] for r in rows]
    elif all(isinstance(r, list) for r in rows):
        table = rows
    else:
        raise ValueError("'rows' must be all objects or all lists")

    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator="\r\n")  # RFC 4180 line ends
    if header and columns:
        writer.writerow([_cell(c, neutralize) for c in columns])
    for row in table:
        writer.writerow([_cell(v, neutralize) for v in row])
    text = buf.getvalue()
    bom = "\ufeff" if args.get("excel") else ""
    return Generated(content=(bom + text).encode("utf-8"), content_type="text/csv",
                     file_name="data.csv")
