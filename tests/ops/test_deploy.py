"""The files in deploy/ are what an operator installs: Debian's HAProxy and Prometheus must accept them as
they are (only certificate and secret paths swapped for this machine's), the alert rules must fire when
they should, and every metric the alerts and the dashboard name must be one the processes export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from terminals import metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: `make services` installs it (scripts/ensure-services.sh)"
    return found


def run(*command: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_haproxy_accepts_the_balancer_configuration(tmp_path):
    pem = tmp_path / "tether.pem"
    key = tmp_path / "key.pem"
    made = run(
        tool("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tether.test",
        "-keyout", str(key), "-out", str(tmp_path / "cert.pem"),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    pem.write_text((tmp_path / "cert.pem").read_text() + key.read_text())
    config = tmp_path / "haproxy.cfg"
    config.write_text((DEPLOY / "haproxy.cfg").read_text().replace("/etc/haproxy/certs/tether.pem", str(pem)))
    checked = run(tool("haproxy"), "-c", "-f", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # What it promises: WebSockets kept an hour, /readyz as the health check, /metrics never passed on.
    text = config.read_text()
    assert "timeout tunnel 1h" in text and "http-check send meth GET uri /readyz" in text
    assert re.search(r"http-request deny .*if \{ path,url_dec -m beg /metrics \}", text)
    assert "http-request set-header X-Forwarded-For %[src]" in text and "option forwardfor" not in text


def test_prometheus_accepts_the_scrape_configuration_and_the_alerts_fire_when_they_should(tmp_path):
    promtool = tool("promtool")
    shutil.copy(DEPLOY / "prometheus" / "tether-alerts.yml", tmp_path)
    (tmp_path / "token").write_text("a-token\n")
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    config = config.replace("/etc/prometheus/tether-alerts.yml", str(tmp_path / "tether-alerts.yml"))
    config = config.replace("/etc/prometheus/tether-metrics-token", str(tmp_path / "token"))
    (tmp_path / "prometheus.yml").write_text(config)
    checked = run(promtool, "check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "7 rules found" in checked.stdout, checked.stdout
    # The rules' own unit tests: each alert silent before its threshold, firing after, with its words.
    tested = run(promtool, "test", "rules", "tether-alerts.test.yml", cwd=DEPLOY / "prometheus")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def exported_names() -> set[str]:
    """Every series name a web process or a worker exports (counters and histograms with their suffixes)."""
    names = set()
    collectors = [*metrics.GROUPS["web"], *metrics.GROUPS["worker"], metrics.DatabaseCollector.instance()]
    for collector in collectors:
        for family in collector.collect():
            for suffix in {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""]):
                names.add(family.name + suffix)
    return names


@pytest.mark.django_db
def test_every_metric_the_alerts_and_the_dashboard_use_is_exported():
    exported = exported_names()
    assert {"tether_sessions", "tether_unknown_oldest_seconds", "tether_worker_processes"} <= exported
    used = set(re.findall(r"\btether_[a-z_]+", (DEPLOY / "prometheus" / "tether-alerts.yml").read_text()))
    dashboard = json.loads((DEPLOY / "grafana" / "tether-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\btether_[a-z_]+", target["expr"]))
    assert used, "no metric named"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
