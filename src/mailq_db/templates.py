"""Mail templates rendered in a Jinja2 sandbox (docs/templates.md).

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
* refuses, before the memory is spent, any operation whose result would be
  over the body limit: ``*`` and ``**`` (``'x' * 10**9``), ``+`` and ``~``,
  format widths and precisions (``'{0:>1000000000}'.format(1)``, ``'%09999999d'
  % 1``, the ``format`` filter), the widths of ``center``, ``indent``,
  ``wordwrap``, ``ljust``/``rjust``/``zfill``/``expandtabs``, ``replace`` and
  ``join`` (``(['x' * 2000000] * 1000)|join``), and printing a value that
  would be that large; sizes are estimated from the operands, never built;
* streams the output and stops at the size limit.

Every failure is a :class:`TemplateError` that says what is wrong and where
(template name and version, part, line), never a traceback and never the
internals it was refused.

The API the worker and EnqueueMail's caller use:

    tpl = MailTemplate.from_row(procedures.get_mail_template(conn, template_name=n, version=v))
    check_template(tpl)                       # before AddMailTemplateVersion
    rendered = render_mail(tpl, model_json)   # -> RenderedMail (subject, html, text)
    body, body_format, text_body = rendered.enqueue_body()
    # on TemplateError: stop the mail with err.reason() (<= 4000 characters)
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import re
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import (
    SecurityError,
    TemplateError as JinjaTemplateError,
    TemplateSyntaxError,
    UndefinedError,
)
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import _PassArg
from markupsafe import Markup

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

    def __repr__(self) -> str:
        return "range"

    def __call__(self, *args: int) -> range:
        return self.range(*args)

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


# --------------------------------------------------------------------------
# Sizes, checked before anything is built
# --------------------------------------------------------------------------

#: The largest string one operation of a template may make: the body limit.
_LIMIT = DEFAULT_LIMITS.max_body_chars
#: Sizes counted per number (a number prints in a few characters; big ints are bounded by **)
_NUMBER_SIZE = 24
_OTHER_SIZE = 64


def _size(obj: Any, budget: int = _LIMIT) -> int:
    """About how many characters ``str(obj)`` (or joining ``obj``) makes, counted
    without building it; stops counting once over ``budget``."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            total += len(o)
        elif isinstance(o, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(o)
            if total <= budget:
                stack.extend(o)
        elif isinstance(o, dict):
            total += 2 + 4 * len(o)
            if total <= budget:
                stack.extend(o.keys())
                stack.extend(o.values())
        elif isinstance(o, bool) or o is None:
            total += 5
        elif isinstance(o, int):
            total += max(1, o.bit_length() // 3 + 2)
        elif isinstance(o, float):
            total += _NUMBER_SIZE
        else:
            total += _OTHER_SIZE
        if total > budget:
            return total
    return total


def _refuse_if_over(size: int, what: str) -> None:
    if size > _LIMIT:
        raise SecurityError(f"{what} would make over {_LIMIT:,} characters (the output limit)")


#: The numbers in a format specification (width, precision; "{:>{}}" nests them: resolved first).
_SPEC_NUMBERS = re.compile(r"\d+")
#: A printf-style conversion: %[(key)][flags][width][.precision][length]type
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")


def _check_spec(spec: str) -> None:
    if any(int(n) > _LIMIT for n in _SPEC_NUMBERS.findall(spec)):
        raise SecurityError("a format width or precision over the output limit")


def _check_printf(fmt: str, args: Any) -> None:
    """``fmt % args`` would stay within the limit: widths, precisions and the arguments' sizes."""
    stars = 0
    for m in _PRINTF.finditer(fmt):
        for group in (m.group(1), m.group(2)):
            if group == "*":
                stars += 1
            elif group and int(group) > _LIMIT:
                raise SecurityError("a % format width or precision over the output limit")
    values = args if isinstance(args, tuple) else (args,)
    if stars and any(isinstance(v, int) and not isinstance(v, bool) and v > _LIMIT for v in values):
        raise SecurityError("a % format width or precision (*) over the output limit")
    _refuse_if_over(len(fmt) + _size(args), "this % formatting")


class _CheckedFormatter(SandboxedFormatter):
    """str.format in the sandbox with each field's spec and the total size checked."""

    made = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        _check_spec(format_spec)
        self.made += _size(value)
        _refuse_if_over(self.made, "this str.format")
        return super().format_field(value, format_spec)


class _CheckedEscapeFormatter(SandboxedEscapeFormatter, _CheckedFormatter):
    pass


#: str methods whose result can be far larger than the string, with how large.
_STR_GROWTH: dict[str, Callable[[str, tuple[Any, ...]], int]] = {
    "center": lambda s, a: max(len(s), _int_arg(a, 0)),
    "ljust": lambda s, a: max(len(s), _int_arg(a, 0)),
    "rjust": lambda s, a: max(len(s), _int_arg(a, 0)),
    "zfill": lambda s, a: max(len(s), _int_arg(a, 0)),
    "expandtabs": lambda s, a: len(s) + s.count("\t") * (_int_arg(a, 0) if a else 8),
    "replace": lambda s, a: _replaced_size(s, *a[:3]) if len(a) >= 2 else len(s),
    "join": lambda s, a: _size(list(a[0]) if a and not isinstance(a[0], str) else (a[0] if a else ""))
    + len(s) * (len(a[0]) if a and hasattr(a[0], "__len__") else 0),
}


def _int_arg(args: tuple[Any, ...], index: int) -> int:
    value = args[index] if len(args) > index else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _replaced_size(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    s, old, new = str(s), str(old), str(new)
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _filter_growth(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The size of a filter's result, for the filters whose result can outgrow their input."""
    if name == "center":
        return max(_size(value), int(kwargs.get("width", _int_arg(args, 0) or 80)))
    if name == "indent":
        width = kwargs.get("width", args[0] if args else 4)
        pad = len(width) if isinstance(width, str) else (width if isinstance(width, int) else 4)
        return _size(value) + (str(value).count("\n") + 1) * max(0, pad)
    if name == "wordwrap":
        width = max(1, int(kwargs.get("width", _int_arg(args, 0) or 79)))
        wrap = kwargs.get("wrapstring") or (args[3] if len(args) > 3 else "\n") or "\n"
        return _size(value) * (1 + len(str(wrap)) // width + 1)
    if name == "replace" and len(args) >= 2:
        return _replaced_size(value, *args[:3])
    if name == "format":
        _check_printf(str(value), args or tuple(kwargs.values()))
    if name == "join":
        sep = kwargs.get("d", args[0] if args else "")
        items = list(value) if not isinstance(value, str) else [value]
        return _size(items) + len(str(sep)) * len(items)
    return _size(value)


def _guarded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the size of its result checked before it runs."""
    passes = _PassArg.from_obj(func)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        lead = 1 if passes is not None else 0
        if len(args) > lead:
            _refuse_if_over(_filter_growth(name, args[lead], args[lead + 1:], kwargs), f"the {name!r} filter")
        return func(*args, **kwargs)

    return guarded


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~`` (Concat) sized before it joins."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.sized_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("), context.eval_ctx.autoescape)")


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox with ``*``, ``**``, ``+`` and ``%`` checked (Jinja2 lets a
    sandbox intercept binary operators: ``intercepted_binops`` + ``call_binop``),
    str.format, the growing str methods, filters, ``~`` and printed values
    sized before they run, and the render's deadline checked at every lookup
    and call."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CodeGenerator
    max_sequence = DEFAULT_LIMITS.max_body_chars

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_deadline()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_deadline()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's signature)
        _check_deadline()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and isinstance(__obj, types.BuiltinMethodType):
            growth = _STR_GROWTH.get(__obj.__name__)
            if growth is not None:
                _refuse_if_over(growth(owner, args), f"str.{__obj.__name__}")
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(left, (int, float)) and isinstance(right, (int, float)):
                if abs(right) > 1000 or (isinstance(left, int) and isinstance(right, int) and right > 0
                                         and abs(left) > 1 and right * math.log2(abs(left)) > 4096):
                    raise SecurityError("the power is too large")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and _size(seq) * n > self.max_sequence:
                    raise SecurityError("repeating a string or list that many times is over the output limit")
        elif operator == "+" and isinstance(left, (str, list, tuple)):
            _refuse_if_over(_size(left) + _size(right), "this +")
        elif operator == "%" and isinstance(left, str):
            _check_printf(left, right)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """str.format / format_map with the checked formatters (Jinja's own wrapper,
        with each field's width, precision and size checked)."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or \
                value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str):
            return None
        f_self: str = value.__self__
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            formatter: _CheckedFormatter = (
                _CheckedEscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup)
                else _CheckedFormatter(self))
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            return type(f_self)(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)

    @staticmethod
    def sized_concat(values: tuple[Any, ...], autoescape: bool) -> str:
        _refuse_if_over(_size(list(values)), "this ~ concatenation")
        return markup_join(values) if autoescape else str_join(values)


def _finalize(value: Any) -> Any:
    """Every printed value is sized before it is turned into text."""
    if not isinstance(value, str):
        _refuse_if_over(_size(value), "printing this value")
    return value


def _environment(html: bool) -> _Sandbox:
    env = _Sandbox(undefined=StrictUndefined, autoescape=html, keep_trailing_newline=True,
                   auto_reload=False, cache_size=0, finalize=_finalize)
    env.globals.clear()  # range is added per render (with its budget)
    env.globals["dict"] = dict
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
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
    except Exception as exc:  # noqa: BLE001 - never a traceback
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
    template = env.template_class.from_code(env, code, {**env.globals, "range": budget})
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
    except Exception as exc:  # noqa: BLE001 - never a traceback: the class and message only
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
