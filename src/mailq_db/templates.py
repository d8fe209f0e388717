"""Mail templates rendered in a Jinja2 sandbox (issue 16, point 2; docs/templates.md).

A template has a subject part and an HTML part, a text part or both; the
model is a JSON object whose keys are the template's variables.  Rendering:

* runs in Jinja2's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment`
  (no attribute starting with ``_``, no unsafe callables, no mutation of
  lists and dicts, ``str.format`` checked), with :class:`~jinja2.StrictUndefined`
  (a variable missing from the model is an error, never an empty string);
* autoescapes the HTML part only (``{{ name }}`` with ``<b>`` in it becomes
  ``&lt;b&gt;``; ``{{ x|safe }}`` opts out, on purpose and visibly);
* refuses, before anything runs, what has no place in a mail template: an
  attribute written ``x._y`` or ``x|attr('_y')`` (the server-side
  template-injection payloads all go through one), ``{% include %}``,
  ``{% import %}`` and ``{% extends %}`` (templates are self-contained);
* keeps only ``range`` (with a budget of iterations per render) and ``dict``
  as globals: ``cycler``, ``joiner``, ``lipsum`` and ``namespace`` are gone;
* refuses ``*`` and ``**`` whose result would be huge (``'x' * 10**9``);
* streams the output and stops at the size limit (a template cannot build
  a gigabyte before being refused).

Every failure is a :class:`TemplateError` that says what is wrong and where
(template name and version, part, line), never a traceback and never the
internals it was refused.

The API the worker and EnqueueMail's caller use (second wave):

    tpl = MailTemplate.from_row(procedures.get_mail_template(conn, template_name=n, version=v))
    check_template(tpl)                       # before AddMailTemplateVersion
    rendered = render_mail(tpl, model_json)   # -> RenderedMail (subject, html, text)
    body, body_format, text_body = rendered.enqueue_body()
    # on TemplateError: stop the mail with err.reason() (<= 4000 characters)
"""

from __future__ import annotations

import contextvars
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

from jinja2 import StrictUndefined, nodes
from jinja2.exceptions import (
    SecurityError,
    TemplateError as JinjaTemplateError,
    TemplateSyntaxError,
    UndefinedError,
)
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import MailqError

PARTS = ("subject", "html", "text")


# --------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Size limits of rendering and of attachments.

    The defaults are the database's (the worker has no limits of its own: it
    sends what mailq.EnqueueMail accepted): ``mailq.MailQueue.Subject`` is
    NVARCHAR(900); EnqueueMail refuses a body over 2,000,000 characters
    (50111), more than 10 attachments, one over 10 MiB or a mail's over
    25 MiB (50112; ``CK_MailAttachment_Size``).  tests/unit/test_templates.py
    reads those numbers out of sql/ so the two cannot drift apart.
    """

    max_subject_chars: int = 900
    max_body_chars: int = 2_000_000
    max_model_chars: int = 2_000_000
    max_attachments: int = 10
    max_attachment_bytes: int = 10 * 1024 * 1024
    max_mail_attachment_bytes: int = 25 * 1024 * 1024
    #: iterations of ``range()`` one render may consume (all calls together)
    max_range_items: int = 1_000_000
    #: wall-clock seconds one render may take (checked at every output chunk,
    #: attribute or item lookup, call and range(): see _check_deadline)
    max_render_seconds: float = 10.0


DEFAULT_LIMITS = Limits()


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

KINDS = {
    "syntax": "syntax error",
    "undefined": "undefined variable",
    "security": "refused",
    "unsupported": "not supported",
    "model": "model error",
    "limit": "over a limit",
    "render": "rendering failed",
}

_MAX_DETAIL = 600


class TemplateError(MailqError):
    """A template or model that cannot be rendered; ``str()`` says what and where.

    ``kind`` is one of :data:`KINDS` (``syntax``, ``undefined``, ``security``,
    ``unsupported``, ``model``, ``limit``, ``render``); ``template``,
    ``version``, ``part`` (``subject``, ``html``, ``text``, or ``model``) and
    ``line`` (1-based, within the part) locate it when known.
    """

    def __init__(self, kind: str, detail: str, *, template: str | None = None,
                 version: int | None = None, part: str | None = None,
                 line: int | None = None, column: int | None = None):
        self.kind = kind
        self.detail = _clip(detail)
        self.template = template
        self.version = version
        self.part = part
        self.line = line
        self.column = column
        super().__init__(self._text())

    def where(self) -> str:
        bits = []
        if self.template is not None:
            bits.append(f"template {self.template!r}"
                        + (f" version {self.version}" if self.version is not None else ""))
        if self.part is not None:
            bits.append(f"{self.part} part" if self.part in PARTS else self.part)
        if self.line is not None:
            bits.append(f"line {self.line}" + (f", column {self.column}" if self.column is not None else ""))
        return ", ".join(bits)

    def _text(self) -> str:
        where = self.where()
        return f"{where}: {KINDS.get(self.kind, self.kind)}: {self.detail}" if where else \
            f"{KINDS.get(self.kind, self.kind)}: {self.detail}"

    def reason(self, limit: int = 4000) -> str:
        """The message, cut to ``limit`` characters: the reason to stop a mail with."""
        return _clip(str(self), limit)

    def located(self, *, template: str | None, version: int | None) -> "TemplateError":
        """The same error with the template's name and version filled in."""
        return TemplateError(self.kind, self.detail, template=template, version=version,
                             part=self.part, line=self.line, column=self.column)


def _clip(text: str, limit: int = _MAX_DETAIL) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------
# Templates and results
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MailTemplate:
    """The texts of one template version (from the database or from files)."""

    name: str
    subject: str
    html: str | None = None
    text: str | None = None
    version: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> "MailTemplate":
        """From :class:`mailq_db.procedures.MailTemplateRow` (mailq.GetMailTemplate)."""
        return cls(name=row.template_name, subject=row.subject_template,
                   html=row.html_template, text=row.text_template, version=row.version)

    def parts(self) -> list[tuple[str, str]]:
        return [(p, s) for p, s in (("subject", self.subject), ("html", self.html), ("text", self.text))
                if s is not None]


@dataclass(frozen=True)
class RenderedMail:
    subject: str
    html: str | None
    text: str | None
    template_name: str
    template_version: int | None

    def enqueue_body(self) -> tuple[str, str, str | None]:
        """(Body, BodyFormat, TextBody) as mailq.EnqueueMail takes them: the HTML
        part as the body with the text part as its alternative, else the text."""
        if self.html is not None:
            return self.html, "Html", self.text
        return self.text or "", "Text", None


# --------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------


class _Budget:
    """Iterations of range() left in one render."""

    def __init__(self, items: int):
        self.left = items

    def range(self, *args: int) -> range:
        _check_deadline()
        r = range(*args)
        if len(r) > self.left:
            raise SecurityError(f"range() over the budget of iterations for one render "
                                f"({len(r)} asked, {self.left} left)")
        self.left -= len(r)
        return r


#: the monotonic time the current render must end by (None: no render running)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("mailq_template_deadline", default=None)


class _TimeLimit(Exception):
    pass


def _check_deadline() -> None:
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise _TimeLimit()


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox with ``*`` and ``**`` checked (Jinja2 lets a sandbox
    intercept binary operators: ``intercepted_binops`` + ``call_binop``), and
    the render's deadline checked at every lookup and call."""

    intercepted_binops = frozenset({"*", "**"})
    max_sequence = DEFAULT_LIMITS.max_body_chars

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_deadline()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_deadline()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's signature)
        _check_deadline()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(left, (int, float)) and isinstance(right, (int, float)):
                if abs(right) > 1000 or (isinstance(left, int) and isinstance(right, int) and right > 0
                                         and abs(left) > 1 and right * math.log2(abs(left)) > 4096):
                    raise SecurityError("the power is too large")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.max_sequence:
                    raise SecurityError("repeating a string or list that many times is over the output limit")
        return super().call_binop(context, operator, left, right)


def _environment(html: bool) -> _Sandbox:
    env = _Sandbox(undefined=StrictUndefined, autoescape=html, keep_trailing_newline=True,
                   auto_reload=False, cache_size=0)
    env.globals.clear()  # range is added per render (with its budget)
    env.globals["dict"] = dict
    return env


_ENV = {True: _environment(True), False: _environment(False)}


def _filename(part: str) -> str:
    return f"<mailq-template:{part}>"


#: filters that take an attribute name (``map(attribute='a.b')``, ``sort``...)
_ATTRIBUTE_FILTERS = frozenset({"map", "sort", "groupby", "selectattr", "rejectattr", "sum", "unique",
                                "min", "max", "dictsort"})


def _refuse_internals(tree: nodes.Template, part: str) -> None:
    """Refuse, before anything runs, what only template injection needs."""
    for node in tree.find_all((nodes.Getattr, nodes.Filter, nodes.Include, nodes.Import,
                               nodes.FromImport, nodes.Extends)):
        line = getattr(node, "lineno", None)
        if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
            raise TemplateError("security", f"access to the attribute {node.attr!r} is refused: "
                                "attributes starting with '_' are not available in templates "
                                "(a model key starting with '_' reads as x['_key'])", part=part, line=line)
        if isinstance(node, nodes.Filter) and node.name == "attr":
            arg = node.args[0] if node.args else None
            if not isinstance(arg, nodes.Const) or not isinstance(arg.value, str) or arg.value.startswith("_"):
                raise TemplateError("security", "the 'attr' filter is refused with a computed name or a name "
                                    "starting with '_'", part=part, line=line)
        if isinstance(node, nodes.Filter) and node.name in _ATTRIBUTE_FILTERS:
            for value in [*node.args, *(kw.value for kw in node.kwargs)]:
                if (isinstance(value, nodes.Const) and isinstance(value.value, str)
                        and any(seg.startswith("_") for seg in value.value.split("."))):
                    raise TemplateError("security", f"the {node.name!r} filter is refused an attribute "
                                        f"starting with '_' ({value.value!r})", part=part, line=line)
        if isinstance(node, (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
            tag = {nodes.Include: "include", nodes.Import: "import", nodes.FromImport: "from ... import",
                   nodes.Extends: "extends"}[type(node)]
            raise TemplateError("unsupported", f"{{% {tag} %}} is not available: a mail template is "
                                "self-contained (use a macro inside it)", part=part, line=line)


def _compile(part: str, source: str) -> Any:
    env = _ENV[part == "html"]
    try:
        tree = env.parse(source, name=part, filename=_filename(part))
        _refuse_internals(tree, part)
        return env.compile(tree, name=part, filename=_filename(part))
    except TemplateError:
        raise
    except TemplateSyntaxError as exc:
        raise TemplateError("syntax", exc.message or str(exc), part=part, line=exc.lineno) from None
    except RecursionError:
        raise TemplateError("syntax", "the template is nested too deeply", part=part) from None
    except Exception as exc:  # never a traceback
        raise TemplateError("syntax", f"{type(exc).__name__}: {exc}", part=part) from None


def _line_of(exc: BaseException, part: str) -> int | None:
    """The template line of a runtime error: Jinja2 rewrites the traceback so
    that the template's frames carry its file name and line numbers."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _filename(part):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _undefined_detail(exc: UndefinedError) -> str:
    text = exc.message or str(exc)
    if text.endswith(" is undefined"):
        return f"{text}: the model has no such key, and every variable must be in the model"
    return text


def _render_part(part: str, code: Any, model: Mapping[str, Any], limit: int, budget: _Budget) -> str:
    env = _ENV[part == "html"]
    template = env.template_class.from_code(env, code, {**env.globals, "range": budget.range})
    out: list[str] = []
    size = 0
    try:
        for chunk in template.generate(dict(model)):
            _check_deadline()
            size += len(chunk)
            if size > limit:
                raise TemplateError("limit", f"the output is over {limit:,} characters", part=part)
            out.append(chunk)
    except TemplateError:
        raise
    except _TimeLimit as exc:
        raise TemplateError("limit", "rendering took longer than the time limit", part=part,
                            line=_line_of(exc, part)) from None
    except UndefinedError as exc:
        raise TemplateError("undefined", _undefined_detail(exc), part=part, line=_line_of(exc, part)) from None
    except SecurityError as exc:
        raise TemplateError("security", f"{exc}", part=part, line=_line_of(exc, part)) from None
    except JinjaTemplateError as exc:
        raise TemplateError("render", exc.message or str(exc), part=part, line=_line_of(exc, part)) from None
    except RecursionError as exc:
        raise TemplateError("render", "recursion too deep (a macro calling itself?)", part=part,
                            line=_line_of(exc, part)) from None
    except MemoryError:
        raise TemplateError("limit", "out of memory while rendering", part=part) from None
    except Exception as exc:  # never a traceback: the class and message only
        raise TemplateError("render", f"{type(exc).__name__}: {exc}", part=part, line=_line_of(exc, part)) from None
    return "".join(out)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def parse_model(model: str | bytes | Mapping[str, Any] | None, *, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The model as a dict: a JSON object (text or bytes) or a mapping.

    Refused (``TemplateError`` kind ``model``, with line and column where the
    JSON is broken): text that is not JSON, NaN/Infinity, a key twice in one
    object, a top level that is not an object, more than ``max_model_chars``.
    """
    if model is None:
        return {}
    if isinstance(model, Mapping):
        return dict(model)
    if isinstance(model, bytes):
        try:
            model = model.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise TemplateError("model", f"the model is not UTF-8 (byte {exc.start})", part="model") from None
    if len(model) > limits.max_model_chars:
        raise TemplateError("model", f"the model is over {limits.max_model_chars:,} characters", part="model")
    try:
        value = json.loads(model, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise TemplateError("model", f"not valid JSON: {exc.msg}", part="model",
                            line=exc.lineno, column=exc.colno) from None
    except ValueError as exc:
        raise TemplateError("model", str(exc), part="model") from None
    except RecursionError:
        raise TemplateError("model", "the model is nested too deeply", part="model") from None
    if not isinstance(value, dict):
        raise TemplateError("model", f"the model must be a JSON object ({{...}}), not {type(value).__name__}",
                            part="model")
    return value


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def _compile_all(template: MailTemplate) -> dict[str, Any]:
    if not template.subject:
        raise TemplateError("syntax", "the subject part is empty", part="subject")
    if template.html is None and template.text is None:
        raise TemplateError("syntax", "the template has neither an HTML nor a text part")
    return {part: _compile(part, source) for part, source in template.parts()}


def check_template(template: MailTemplate) -> None:
    """Compile every part (syntax, refused constructs); raise TemplateError.

    Call it before mailq.AddMailTemplateVersion: the database stores texts
    without parsing them.
    """
    try:
        _compile_all(template)
    except TemplateError as exc:
        raise exc.located(template=template.name, version=template.version) from None


def render_mail(template: MailTemplate, model: str | bytes | Mapping[str, Any] | None,
                *, limits: Limits = DEFAULT_LIMITS) -> RenderedMail:
    """Render the subject and the body part(s) of ``template`` with ``model``.

    The subject is stripped of surrounding white space and must be one line of
    at most ``max_subject_chars``; each body at most ``max_body_chars``.
    """
    try:
        codes = _compile_all(template)
        values = parse_model(model, limits=limits)
        budget = _Budget(limits.max_range_items)
        out: dict[str, str | None] = {"subject": None, "html": None, "text": None}
        token = _DEADLINE.set(time.monotonic() + limits.max_render_seconds)
        try:
            for part, code in codes.items():
                limit = limits.max_subject_chars * 4 if part == "subject" else limits.max_body_chars
                out[part] = _render_part(part, code, values, limit, budget)
        finally:
            _DEADLINE.reset(token)
        subject = (out["subject"] or "").strip()
        if "\r" in subject or "\n" in subject:
            raise TemplateError("limit", "the rendered subject has a line break (a header is one line)",
                                part="subject")
        if not subject:
            raise TemplateError("limit", "the rendered subject is empty", part="subject")
        if len(subject) > limits.max_subject_chars:
            raise TemplateError("limit", f"the rendered subject is {len(subject)} characters; "
                                f"the limit is {limits.max_subject_chars}", part="subject")
    except TemplateError as exc:
        raise exc.located(template=template.name, version=template.version) from None
    return RenderedMail(subject=subject, html=out["html"], text=out["text"],
                        template_name=template.name, template_version=template.version)
