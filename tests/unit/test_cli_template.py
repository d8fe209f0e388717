"""``mailq-db template render``: previews and CI of templates (issue 16, point 2)."""

from __future__ import annotations

import json
import subprocess
import sys

from mailq_db.cli import main


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_renders_html_with_text_alternative(tmp_path, capsys):
    html = write(tmp_path, "w.html", "<p>Hello {{ user.name }}</p>\n")
    text = write(tmp_path, "w.txt", "Hello {{ user.name }}\n")
    model = write(tmp_path, "m.json", '{"user": {"name": "<\u5f20\u4e09>"}}')
    rc = main(["template", "render", "--file", html, "--html", "--text-file", text,
               "--subject", "Hi {{ user.name }}", "--model", model, "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"subject": "Hi <\u5f20\u4e09>", "html": "<p>Hello &lt;\u5f20\u4e09&gt;</p>\n",
                   "text": "Hello <\u5f20\u4e09>\n"}


def test_errors_exit_1_with_one_clear_line(tmp_path, capsys):
    model = write(tmp_path, "m.json", '{"a": 1}')
    cases = {
        "undefined.txt": ("x\n{{ b }}", "undefined.txt', text part, line 2: undefined variable"),
        "ssti.txt": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "refused"),
        "syntax.html": ("<p>\n{% if a %}", "line 2: syntax error"),
    }
    for name, (body, expected) in cases.items():
        path = write(tmp_path, name, body)
        args = ["template", "render", "--file", path, "--model", model] + (["--html"] if name.endswith(".html") else [])
        assert main(args) == 1
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1 and "Traceback" not in err, err
    bad_model = write(tmp_path, "bad.json", '{"a": }')
    assert main(["template", "render", "--file", write(tmp_path, "ok.txt", "{{ a }}"), "--model", bad_model]) == 1
    assert "model, line 1, column 7: model error" in capsys.readouterr().err


def test_check_compiles_without_a_model(tmp_path, capsys):
    ok = write(tmp_path, "ok.html", "<p>{{ anything }}</p>")
    assert main(["template", "render", "--file", ok, "--html", "--check"]) == 0
    assert "every part compiles" in capsys.readouterr().out
    bad = write(tmp_path, "bad.html", "{% include 'x' %}")
    assert main(["template", "render", "--file", bad, "--html", "--check"]) == 1


def test_usage_errors_exit_2(tmp_path):
    body = write(tmp_path, "b.txt", "x")
    run = [sys.executable, "-m", "mailq_db", "template", "render", "--file", body]
    assert subprocess.run(run, capture_output=True).returncode == 2  # no --model
    assert subprocess.run(run + ["--model", body, "--text-file", body], capture_output=True).returncode == 2
