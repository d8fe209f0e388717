"""mailq_db.templates: sandboxed rendering (issue 16, point 2; docs/templates.md).

* a corpus of server-side template-injection payloads: each is refused with a
  TemplateError (kind security / undefined / unsupported), never rendered into
  internals, never another exception;
* undefined variables are errors with the part and line;
* syntax errors say the line; model JSON errors say line and column;
* HTML is autoescaped, text and subject are not;
* the size limits (subject, body, repetition, range budget) hold, and the
  defaults equal the database's limits in sql/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mailq_db.templates import (
    DEFAULT_LIMITS,
    Limits,
    MailTemplate,
    RenderedMail,
    TemplateError,
    check_template,
    parse_model,
    render_mail,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"user": {"name": "Bob", "tags": ["a", "b"]}, "items": [3, 1, 2], "text": "hi", "n": 5}


def text_tpl(body: str, subject: str = "s") -> MailTemplate:
    return MailTemplate(name="t", version=7, subject=subject, text=body)


def render_error(body: str, model=MODEL, **kw) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        render_mail(text_tpl(body, **kw), model)
    return info.value


# The usual SSTI payloads (PayloadsAllTheThings "Jinja2", HackTricks "Jinja2 SSTI",
# PortSwigger's research), plus variants through filters and format strings.
SSTI = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{{ [].__class__.__base__.__subclasses__() }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ range.__init__.__globals__ }}",
    "{{ dict.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ config }}",
    "{{ config.items() }}",
    "{{ config.__class__.__init__.__globals__['os'] }}",
    "{{ request.application.__globals__.__builtins__.__import__('os') }}",
    "{{ request['application']['__globals__'] }}",
    "{{ url_for.__globals__ }}",
    "{{ get_flashed_messages.__globals__ }}",
    "{{ ''|attr('__class__') }}",
    "{{ ''|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ ''|attr(['_','_class_','_']|join) }}",
    "{{ ''['__class__'] }}",
    "{{ ''['\\x5f\\x5fclass\\x5f\\x5f'] }}",
    "{{ items['__class__'] }}",
    "{{ user['__class__'] }}",
    "{{ '{0.__class__}'.format(text) }}",
    "{{ '{0.__class__.__mro__}'.format(1) }}",
    "{{ '{x.__class__}'.format_map({'x': 1}) }}",
    "{{ '%s'.__mod__.__self__ }}",
    "{{ items|map(attribute='__class__')|list }}",
    "{{ items|sort(attribute='__class__') }}",
    "{{ items|selectattr('__class__')|list }}",
    "{{ items|groupby('__class__') }}",
    "{{ items.pop() }}",
    "{{ user.update({'x': 1}) }}",
    "{{ items.append(4) }}",
    "{{ text.__len__() }}",
    "{% for c in ''.__class__.__mro__ %}{{ c }}{% endfor %}",
    "{% set x = ''.__class__ %}{{ x }}",
    "{% include '/etc/passwd' %}",
    "{% import 'os' as os %}",
    "{% from 'x' import y %}",
    "{% extends 'base.html' %}",
    "{{ 'a' * 100000000 }}",
    "{{ [1] * 100000000 }}",
    "{{ 10 ** 100000 }}",
    "{% for i in range(10000000) %}{% endfor %}",
]


@pytest.mark.parametrize("payload", SSTI)
def test_ssti_payloads_are_refused_clearly(payload):
    err = render_error(payload)
    assert err.kind in ("security", "undefined", "unsupported"), str(err)
    text = str(err)
    assert text.startswith("template 't' version 7, text part, line 1: ")
    # never the internals: no module, class list, function or traceback in the message
    for leak in ("<class", "<module", "<function", "built-in", "Traceback", "popen", "subprocess", "posix"):
        assert leak not in text, text


def test_payload_never_renders_internals_when_reached_through_the_model():
    # a model value that looks like a payload is data, rendered as text
    out = render_mail(text_tpl("{{ p }}"), {"p": "{{ ''.__class__ }}"})
    assert out.text == "{{ ''.__class__ }}"


def test_format_with_safe_fields_still_works():
    out = render_mail(text_tpl("{{ '{0} and {1}'.format(user.name, n) }} {{ '%s-%d'|format(text, n) }}"), MODEL)
    assert out.text == "Bob and 5 hi-5"


def test_model_key_starting_with_underscore_reads_by_subscript():
    assert render_mail(text_tpl("{{ m['_id'] }}"), {"m": {"_id": 9}}).text == "9"
    err = render_error("{{ m._id }}", {"m": {"_id": 9}})
    assert err.kind == "security" and "'_id'" in str(err)


def test_undefined_variable_names_it_with_part_and_line():
    tpl = MailTemplate(name="welcome", version=3, subject="Hi", html="<p>\n\n{{ user.name }} {{ missing }}</p>")
    with pytest.raises(TemplateError) as info:
        render_mail(tpl, MODEL)
    err = info.value
    assert (err.kind, err.template, err.version, err.part, err.line) == ("undefined", "welcome", 3, "html", 3)
    assert "'missing' is undefined" in str(err)
    assert str(err).startswith("template 'welcome' version 3, html part, line 3: undefined variable:")


def test_undefined_attribute_and_use_in_a_condition_are_errors():
    assert render_error("{{ user.age }}").kind == "undefined"
    assert render_error("x\n{% if nothing %}y{% endif %}").line == 2
    assert render_mail(text_tpl("{{ missing|default('x') }}"), {}).text == "x"


def test_syntax_error_says_the_line():
    with pytest.raises(TemplateError) as info:
        check_template(MailTemplate(name="t", subject="ok", text="line 1\nline 2\n{% for x in items %}\n{{ x }}"))
    err = info.value
    assert (err.kind, err.part, err.line) == ("syntax", "text", 4)
    assert "endfor" in str(err)


def test_syntax_error_in_the_subject_and_unknown_filter():
    err = render_error("ok", subject="Hi {{ user.name ")
    assert (err.kind, err.part, err.line) == ("syntax", "subject", 1)
    err = render_error("a\n{{ text|nosuchfilter }}")
    assert (err.kind, err.line) == ("syntax", 2) and "nosuchfilter" in str(err)


def test_model_errors_say_line_and_column():
    with pytest.raises(TemplateError) as info:
        render_mail(text_tpl("x"), '{\n  "a": 1,\n  "b": \n}')
    err = info.value
    assert (err.kind, err.part, err.line, err.column) == ("model", "model", 4, 1)
    for bad, words in [("[1, 2]", "JSON object"), ('{"a": 1, "a": 2}', "twice"), ('{"a": NaN}', "NaN"),
                       (b'{"a": "\xff"}', "UTF-8"), ("[" * 100000 + "]" * 100000, "")]:
        with pytest.raises(TemplateError) as info:
            parse_model(bad)
        assert info.value.kind == "model" and words in str(info.value)
    assert parse_model(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a BOM is fine
    with pytest.raises(TemplateError, match="over 10 characters"):
        parse_model('{"a": "0123456789"}', limits=Limits(max_model_chars=10))


def test_html_is_autoescaped_text_and_subject_are_not():
    tpl = MailTemplate(name="t", subject="{{ v }}", html="<p>{{ v }}</p><p>{{ v|safe }}</p>", text="{{ v }}")
    out = render_mail(tpl, {"v": "<b>A & B</b>"})
    assert out.html == "<p>&lt;b&gt;A &amp; B&lt;/b&gt;</p><p><b>A & B</b></p>"
    assert out.text == "<b>A & B</b>" and out.subject == "<b>A & B</b>"


def test_attribute_injection_through_html_escaping():
    out = render_mail(MailTemplate(name="t", subject="s", html='<a href="{{ u }}">x</a>'), {"u": '" onclick="x'})
    assert out.html == '<a href="&#34; onclick=&#34;x">x</a>'


def test_subject_is_one_line_within_its_limit():
    assert render_error("x", {"a": "1\n2"}, subject="{{ a }}").part == "subject"
    err = render_error("x", {"a": "y" * 901}, subject="{{ a }}")
    assert err.kind == "limit" and "900" in str(err)
    assert render_error("x", {"a": ""}, subject="{{ a }}").kind == "limit"
    assert render_mail(text_tpl("x", subject="  Hi {{ n }}\n"), MODEL).subject == "Hi 5"


def test_output_is_capped_while_streaming():
    limits = Limits(max_body_chars=1000)
    with pytest.raises(TemplateError) as info:
        render_mail(text_tpl("{% for i in range(100000) %}0123456789{% endfor %}"), {}, limits=limits)
    assert info.value.kind == "limit" and "1,000" in str(info.value)
    # nested loops hit the range budget
    err = render_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}")
    assert err.kind == "security" and "budget" in str(err)


def test_runtime_errors_are_template_errors_with_the_line():
    err = render_error("a\nb\n{{ n / 0 }}")
    assert (err.kind, err.line) == ("render", 3) and "ZeroDivisionError" in str(err)
    err = render_error("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}")
    assert err.kind == "render" and "recursion" in str(err)


def test_macros_loops_and_filters_work():
    body = ("{% macro li(x) %}<li>{{ x }}</li>{% endmacro %}"
            "{% for i in items|sort %}{{ li(i) }}{% endfor %}|{{ user.tags|join(',') }}|{{ items|sum }}"
            "|{{ range(3)|list|length }}|{{ dict(a=1)['a'] }}|{{ user.name|upper }}")
    out = render_mail(MailTemplate(name="t", subject="s", html=body), MODEL)
    assert out.html == "<li>1</li><li>2</li><li>3</li>|a,b|6|3|1|BOB"


def test_enqueue_body_mapping():
    both = RenderedMail("s", "<p>x</p>", "x", "t", 1)
    assert both.enqueue_body() == ("<p>x</p>", "Html", "x")
    assert RenderedMail("s", None, "x", "t", 1).enqueue_body() == ("x", "Text", None)


def test_template_needs_a_subject_and_a_body():
    with pytest.raises(TemplateError):
        check_template(MailTemplate(name="t", subject="s"))
    with pytest.raises(TemplateError):
        check_template(MailTemplate(name="t", subject="", text="x"))


def test_reason_fits_a_stop_reason():
    err = render_error("{{ nope }}")
    assert err.reason(50).endswith("...") and len(err.reason(50)) == 50
    assert "\n" not in str(render_error("x\n{% if %}"))


def test_default_limits_are_the_database_limits():
    sql = ROOT / "sql"
    queue = (sql / "tables/mailq.MailQueue.sql").read_text(encoding="utf-8")
    assert re.search(rf"\bSubject NVARCHAR\({DEFAULT_LIMITS.max_subject_chars}\) NOT NULL", queue)
    enqueue = (sql / "functions/mailq.EnqueueMailCheck.sql").read_text(encoding="utf-8")  # the enqueue rules
    assert f"LEN(@Body) > {DEFAULT_LIMITS.max_body_chars}" in enqueue
    assert f"more than {DEFAULT_LIMITS.max_attachments} attachments" in enqueue
    assert f"more than {DEFAULT_LIMITS.max_mail_attachment_bytes} bytes" in enqueue
    attachment = (sql / "tables/mailq.MailAttachment.sql").read_text(encoding="utf-8")
    assert f"DATALENGTH(Content) <= {DEFAULT_LIMITS.max_attachment_bytes}" in attachment
    version = (sql / "tables/mailq.MailTemplateVersion.sql").read_text(encoding="utf-8")
    assert f"LEN(HtmlTemplate) <= {DEFAULT_LIMITS.max_body_chars}" in version


def test_jinja2_is_in_the_pinned_range():
    import jinja2

    major, minor, patch = (int(x) for x in jinja2.__version__.split(".")[:3])
    assert (3, 1, 6) <= (major, minor, patch) < (3, 2, 0)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"Jinja2>=3.1.6,<3.2"' in pyproject


def test_render_time_is_bounded():
    # nested loops over model data: no range() to budget, so the deadline stops them
    tpl = text_tpl("{% for a in xs %}{% for b in xs %}{{ b.v }}{% endfor %}{% endfor %}")
    with pytest.raises(TemplateError) as info:
        render_mail(tpl, {"xs": [{"v": ""}] * 20000}, limits=Limits(max_render_seconds=0.2))
    assert info.value.kind == "limit" and "time limit" in str(info.value)
