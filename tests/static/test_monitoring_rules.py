"""docs/monitoring/: the alert rules pass promtool (checked and unit-tested),
the exposition passes promtool's linter, and the Grafana dashboard and the
rules query only names the exporter and the worker register.

promtool comes from Debian's `prometheus` package (.ci/run installs it); in
CI these tests fail rather than skip when it is missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from mailq_db.worker.metrics import QUEUE_FAMILIES, Metrics, QueueMetricsCache, queue_registry

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "docs/monitoring"
#: names Prometheus itself makes (the scrape's health), allowed in queries
PROMETHEUS_NAMES = {"up"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                "group_right", "inf", "nan", "atan2"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
    return path


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=MONITORING, input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_checks_the_rules():
    result = run("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_promtool_unit_tests_every_alert():
    result = run("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((MONITORING / "alerts.test.yml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for t in tests for c in t["alert_rule_test"] if not c["exp_alerts"]}
    assert alerts == fired == quiet, (alerts - fired, alerts - quiet)


def test_promtool_rejects_a_broken_rules_test(tmp_path):
    """The unit test can fail: an alert expected at the wrong severity is reported."""
    text = (MONITORING / "alerts.test.yml").read_text()
    expected = '{severity: warning, job: mailq-exporter, instance: "db1:9469", account: bulk}'
    assert expected in text
    broken = text.replace(expected, expected.replace("warning", "critical"))
    (tmp_path / "alerts.yml").write_text((MONITORING / "alerts.yml").read_text())
    (tmp_path / "alerts.test.yml").write_text(broken)
    result = subprocess.run([promtool(), "test", "rules", "alerts.test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode != 0 and "MailqAccountBlockedLong" in result.stdout + result.stderr


def exposition() -> str:
    sys.path.insert(0, str(ROOT / "tests/unit"))
    from fake_dashboard import delay_row, queue_metrics

    m = Metrics(process_metrics=True)
    for name in ("sent", "failed", "retried", "waited", "smtp_connections", "login_sleeps", "claims"):
        m.inc(name, account="default", code=250)
    m.observe_send(0.3, "default")
    m.observe_claim(0.01)
    m.set_blocked("default", True)
    cache = QueueMetricsCache(queue_metrics, delay_row, 30)
    return m.render() + generate_latest(queue_registry(cache)).decode()


def test_promtool_lints_the_exposition():
    text = exposition()
    assert "mailq_queue_oldest_sendable_age_seconds" in text and "mailq_worker_sent_total" in text
    result = run("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr


def registered_names() -> set[str]:
    names = set(PROMETHEUS_NAMES)
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    for name, (kind, _, _) in QUEUE_FAMILIES.items():
        names.add(name + "_total" if kind == "counter" else name)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)  # Grafana variables
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    found = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[m.end():].lstrip().startswith("(") or m.group(0) in PROMQL_WORDS:
            continue
        found.add(m.group(0))
    return found


def test_the_name_parser():
    assert metric_names('sum by (le, account) (rate(a_b_bucket{x="y(z)"}[5m])) / on() b > 0.2 and c offset 5m') \
        == {"a_b_bucket", "b", "c"}
    assert metric_names('(sum(up{job="w"}) or vector(0)) == 0') == {"up"}
    assert metric_names("histogram_quantile(0.95, x_bucket) > 1e3") == {"x_bucket"}


def dashboard_exprs() -> list[str]:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        inner = re.fullmatch(r"label_values\(([^,]+),\s*\w+\)", text or "")
        if inner:
            exprs.append(inner.group(1))
    return exprs


def test_the_grafana_dashboard_queries_only_exported_names():
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    known = registered_names()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= known, (expr, names - known)


def test_the_alert_rules_query_only_exported_names():
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    known = registered_names()
    for group in rules["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names and names <= known, (rule["alert"], names - known)


def test_a_misspelt_name_is_caught():
    assert not metric_names("mailq_queue_oldest_age_seconds > 900") <= registered_names()


def test_every_alert_has_its_runbook_section():
    readme = (MONITORING / "README.md").read_text(encoding="utf-8")
    anchors = {line[4:].strip().lower() for line in readme.splitlines() if line.startswith("### ")}
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/monitoring/README.md#{rule['alert'].lower()}", runbook
        assert rule["alert"].lower() in anchors, rule["alert"]


def realistic_series() -> dict[str, str]:
    """promtool input series (selector -> values) from what the worker and the
    exporter really expose, with the reply codes a relay really gives (a Retry's
    451 is not a Wait's 421): counters and histograms grow, gauges stay."""
    from prometheus_client.parser import text_string_to_metric_families

    sys.path.insert(0, str(ROOT / "tests/unit"))
    from fake_dashboard import delay_row, queue_metrics

    m = Metrics()
    for name, code in (("sent", 250), ("failed", 550), ("retried", 451), ("waited", 421)):
        m.inc(name, 3, account="default", code=code)
    for name in ("smtp_connections", "claims", "claimed", "lease_lost", "errors"):
        m.inc(name, account="default")
    m.observe_send(0.3, "default")
    m.observe_claim(0.01)
    m.set_blocked("default", False)
    exporter = generate_latest(queue_registry(QueueMetricsCache(queue_metrics, delay_row, 30))).decode()
    series = {'up{job="mailq-worker",instance="w1:9464"}': "1x20", 'up{job="mailq-exporter",instance="db1:9469"}': "1x20"}
    for text, job, instance in ((m.render(), "mailq-worker", "w1:9464"), (exporter, "mailq-exporter", "db1:9469")):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = {"job": job, "instance": instance, **sample.labels}
                selector = sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                grows = family.type in ("counter", "histogram")
                value = sample.value
                series[selector] = f"{value:g}+{max(value, 1):g}x20" if grows else f"{value:g}x20"
    return series


def test_every_grafana_query_returns_data_from_what_is_exported(tmp_path):
    """Each panel's query (and each variable's) has at least one sample over the
    series a worker and an exporter really expose: a query that matches nothing
    (a misspelt label, or a + between series whose labels differ) fails here."""
    exprs = [re.sub(r"\$\w+", ".*", e) for e in dashboard_exprs()]
    tests = {"interval": "1m", "input_series": [{"series": k, "values": v} for k, v in realistic_series().items()],
             "promql_expr_test": [{"expr": f"count({e}) > bool 0", "eval_time": "10m",
                                   "exp_samples": [{"labels": "{}", "value": 1}]} for e in exprs]}
    (tmp_path / "none.yml").write_text("groups: []\n")
    (tmp_path / "queries.test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["none.yml"], "evaluation_interval": "1m", "tests": [tests]}, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", "queries.test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
