"""The Grafana dashboard (docs/grafana/edge-appliance.json) loads, every query names metrics the daemon exports,
every exported family is on it, and (where promtool is installed) every query is valid PromQL. The alert rules
(docs/prometheus/alerts.yml) name only exported metrics and pass promtool's checks and their own rule tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from appliance.serving.metrics import Metrics
from tests.support import REPO

DASHBOARD = REPO / "docs" / "grafana" / "edge-appliance.json"
SCRAPE_CONFIG = REPO / "docs" / "prometheus" / "prometheus.yml"
ALERTS = REPO / "docs" / "prometheus" / "alerts.yml"
ALERTS_TEST = REPO / "docs" / "prometheus" / "alerts_test.yml"
NOT_ON_DASHBOARD = {"appliance_frames"}  # per-frame final states: a debugging series, shown by `appliance health`
STANDARD = ("process_", "python_")  # prometheus_client's own collectors: the alert rules use them, not the dashboard
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "info": ("_info",),
    "gauge": ("",),
}


def exported() -> dict[str, set[str]]:
    """family name -> the series names Prometheus sees for it (from the daemon's own registry)."""
    families = {}
    for family in Metrics().registry.collect():
        families[family.name] = {family.name + suffix for suffix in SUFFIXES[family.type]}
    return families


def queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], t["expr"]) for panel in dashboard["panels"] for t in panel["targets"]]


def test_dashboard_is_valid_json_with_unique_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "edge-appliance" and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert names == {"datasource", "instance"}


def test_every_query_names_exported_metrics() -> None:
    series = set().union(*exported().values())
    for title, expr in queries():
        used = set(re.findall(r"\b(appliance_[a-z0-9_]+)\b", expr))
        assert used, f"{title}: {expr} names no appliance metric"
        unknown = used - series
        assert not unknown, f"{title}: {sorted(unknown)} are not exported (exported: {sorted(series)})"
        assert 'instance=~"$instance"' in expr, f"{title}: not filtered by the instance variable"


def test_every_exported_family_is_on_the_dashboard() -> None:
    text = " ".join(expr for _, expr in queries())
    missing = [name for name, series in exported().items()
               if not name.startswith(STANDARD) and not any(s in text for s in series)]
    assert set(missing) <= NOT_ON_DASHBOARD, missing


def test_the_daemon_exports_its_process_metrics() -> None:
    """Ops review, session 14: no process_* series, so neither a slow leak nor a restart loop showed anywhere."""
    series = set().union(*exported().values())
    assert {"process_resident_memory_bytes", "process_start_time_seconds", "process_cpu_seconds_total",
            "process_open_fds"} <= series


def test_every_alert_names_exported_metrics() -> None:
    series = set().union(*exported().values())
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert len(rules) >= 8
    for rule in rules:
        used = set(re.findall(r"\b((?:appliance|process|python)_[a-z0-9_]+)\b", rule["expr"]))
        assert used or "up{" in rule["expr"], rule["alert"]
        assert not used - series, f"{rule['alert']}: {sorted(used - series)} are not exported"
        assert rule["labels"]["severity"] in ("page", "ticket") and rule["annotations"]["summary"], rule["alert"]


def test_alert_rules_pass_promtool_and_their_own_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for args in (["check", "rules", str(ALERTS)], ["test", "rules", str(ALERTS_TEST)]):
        proc = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_queries_are_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "1m").replace("$instance", ".*")}
        for i, (_, expr) in enumerate(queries())
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scrape_config_targets_the_default_endpoint() -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9400"]
    promtool = shutil.which("promtool")
    if promtool is not None:
        proc = subprocess.run([promtool, "check", "config", str(SCRAPE_CONFIG)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
