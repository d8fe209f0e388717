"""The template sandbox refuses, before the memory is spent, what would build a huge string.

Each payload (the reviewer's, and the ways around them) is rendered in a child
process that measures its peak allocation with tracemalloc and runs under a CPU
limit (RLIMIT_CPU: 2 s per payload over what the process used before it): a
payload that allocates more than 64 MB fails the assertion, one that spins the
CPU for 2 s is killed by SIGXCPU and fails the run.  Nothing here is timed; the
child prints each payload's peak and elapsed time as figures (``pytest -s``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("resource")

BIG = "b"  # a model value of 2,000,000 characters (the model's own limit)
PAYLOADS = {
    "format width": "{{ '{0:>1000000000}'.format(1) }}",
    "format width 99999999": "{{ '{0:>99999999}'.format(1) }}",
    "format width 9e9": "{{ '{0:>9000000000}'.format(1) }}",
    "format precision": "{{ '{0:.900000000f}'.format(1.5) }}",
    "nested format width": "{{ '{0:>{1}}'.format(1, 999999999) }}",
    "format_map": "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
    "format repeats a big value": "{{ ('{0}' * 2000).format(b) }}",
    "percent width": "{{ '%01000000000d' % 1 }}",
    "percent star": "{{ '%*d' % (999999999, 1) }}",
    "percent repeats a big value": "{{ ('%s' * 1000) % ([b] * 1000)|list|batch(1000)|first|list|join }}",
    "format filter": "{{ '%0999999999d'|format(1) }}",
    "center filter": "{{ 'x'|center(99999999) }}",
    "indent filter": "{{ 'a\\nb'|indent(99999999) }}",
    "wordwrap filter": "{{ b|wordwrap(1, wrapstring='----------') }}",
    "replace filter": "{{ b|replace('b', 'bbbbbbbbbbbbbbbbbbbb') }}",
    "join of repeated list": "{{ (['x' * 2000000] * 1000)|join }}",
    "join of a list literal": "{{ [b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b]|join }}",
    "print a list literal": "{{ [b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b] }}",
    "str.center": "{{ 'x'.center(999999999) }}",
    "str.ljust": "{{ 'x'.ljust(999999999) }}",
    "str.zfill": "{{ '1'.zfill(999999999) }}",
    "str.replace": "{{ b.replace('b', 'bbbbbbbbbbbbbbbbbbbb') }}",
    "str.join": "{{ b.join([b, b, b]) }}",
    "concatenation doubling": "{% set a = b %}" + "{% set a = a ~ a %}" * 12 + "{{ a|length }}",
    "plus doubling": "{% set a = b %}" + "{% set a = a + a %}" * 12 + "{{ a|length }}",
}

CHILD = textwrap.dedent("""
    import json, resource, sys, time, tracemalloc
    from mailq_db.templates import MailTemplate, TemplateError, render_mail

    payloads = json.loads(sys.stdin.read())
    model = {"b": "b" * 2000000}
    out = {}
    for name, (part, text) in payloads.items():
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft = int(used) + 3  # whole CPU seconds: at least 2 s for this payload
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        tpl = MailTemplate(name="t", subject="s", **{part: text})
        tracemalloc.start()
        started = time.monotonic()
        try:
            render_mail(tpl, model)
            kind = "rendered"
        except TemplateError as exc:
            kind = exc.kind
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[name + " (" + part + ")"] = {"kind": kind, "peak": peak, "seconds": time.monotonic() - started}
    print(json.dumps(out))
""")

MAX_BYTES = 64 * 1024 * 1024


def test_resource_payloads_are_refused_before_the_memory_is_spent():
    payloads = {name: ("text", text) for name, text in PAYLOADS.items()}
    payloads.update({f"{name} html": ("html", text) for name, text in PAYLOADS.items()
                     if name in ("format width", "join of repeated list", "concatenation doubling")})
    proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(payloads), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"the child died (SIGXCPU: a payload spun the CPU): {proc.returncode} {proc.stderr}"
    results = json.loads(proc.stdout)
    print()
    for name, r in results.items():
        print(f"  {name:45s} {r['kind']:10s} peak {r['peak'] / 1e6:7.1f} MB  {r['seconds']:.3f} s")
    assert len(results) == len(payloads)
    for name, r in results.items():
        assert r["kind"] in ("limit", "security"), (name, r)
        assert r["peak"] < MAX_BYTES, (name, r)


def test_ordinary_templates_still_render():
    from mailq_db.templates import MailTemplate, render_mail

    text = ("{{ '{0:>8}|{1:.2f}'.format(name, total) }} {{ '%05d' % n }} {{ name|center(12) }}"
            "{{ ['a', 'b']|join(', ') }} {{ 'x'.ljust(3) }}|{{ name ~ '!' }} {{ items|join(';') }}")
    out = render_mail(MailTemplate(name="t", subject="Hi {{ name }}", text=text),
                      {"name": "Ann", "total": 12.5, "n": 42, "items": [1, 2]})
    assert out.text == "     Ann|12.50 00042     Ann     a, b x  |Ann! 1;2"
