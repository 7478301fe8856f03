"""Metrics as an operator gets them: a real Prometheus (Debian's) scrapes a daphne and a worker of a real
stack, and the figures move as a session opens, streams, comes back and closes. Also who may read them,
and the worker's own /healthz and /readyz."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests import run_secrets
from tests.bridge.harness import Stack, Viewer, free_port, open_viewer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.bridge]


class Prometheus:
    """Debian's prometheus, scraping ``targets`` ({job: host:port}) every half second."""

    def __init__(self, targets: dict[str, str]):
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: `make services` installs it (scripts/ensure-services.sh)"
        self.dir = Path(tempfile.mkdtemp(prefix="tether-prometheus-"))
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            for job, target in targets.items()
        )
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\nscrape_configs:\n{jobs}"
        )
        self.port = free_port()
        self.log = open(self.dir / "prometheus.log", "w+b")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def query(self, expression: str) -> float | None:
        """The instant value of ``expression`` (a single series or a sum); None when it has no series."""
        address = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(address, timeout=5) as response:
            said = json.load(response)
        assert said["status"] == "success", said
        result = said["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    async def until(self, expression: str, check, timeout: float = 20.0) -> float | None:
        """Poll until ``check(value)`` holds: Prometheus sees a change only at its next scrape."""
        deadline = time.monotonic() + timeout
        while True:
            value = await asyncio.to_thread(self.query, expression)
            if check(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression} is {value}: not what was expected")
            await asyncio.sleep(0.25)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def get(port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def positive(value) -> bool:
    return value is not None and value > 0


def zero_or_absent(value) -> bool:
    return value is None or value == 0


async def test_a_real_prometheus_sees_sessions_open_stream_come_back_and_close(terminal, operator):
    stack = Stack()
    worker_http = free_port()
    prometheus = None
    try:
        stack.start_daphne()
        stack.start_worker("local", env={"TETHER_WORKER_HTTP": f"127.0.0.1:{worker_http}"})
        prometheus = await asyncio.to_thread(
            Prometheus, {"daphne": f"127.0.0.1:{stack.ports[0]}", "worker": f"127.0.0.1:{worker_http}"}
        )
        await prometheus.until('sum(up{job=~"daphne|worker"})', lambda up: up == 2)
        await prometheus.until("tether_heartbeat_seconds_count", positive)
        assert await asyncio.to_thread(prometheus.query, "tether_heartbeat_age_seconds") < 4  # beats every second
        before = await asyncio.to_thread(prometheus.query, 'sum(tether_sessions{state="live"})') or 0

        # Opens and streams.
        viewer, session, cookie = await open_viewer(stack, terminal, operator)
        await viewer.type("seq 1 20000; echo streamed-$((6*7))\n")
        await viewer.read_until(b"streamed-42")
        await prometheus.until('sum(tether_viewers{role="writer"})', lambda n: n == 1)
        await prometheus.until('sum(tether_worker_processes{kind="terminal"})', lambda n: n == 1)
        await prometheus.until('max(tether_sessions{state="live"})', lambda n: n == before + 1)
        await prometheus.until('tether_attaches_total{result="new"}', lambda n: n == 1)

        # Comes back where it left off: one resumed attach, the bytes since then replayed, none lost.
        resume_from = viewer.offset - 1000
        await viewer.close()
        await prometheus.until('sum(tether_viewers{role="writer"})', zero_or_absent)
        again = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await again.attach(since=resume_from, generation=1)
        assert attached["lost"] == 0
        replayed_before = await asyncio.to_thread(prometheus.query, "tether_replayed_bytes_total")
        await prometheus.until('tether_attaches_total{result="resumed"}', lambda n: n == 1)
        replayed = await prometheus.until("tether_replayed_bytes_total", lambda n: n >= replayed_before + 1000)
        assert replayed >= 1000
        assert await asyncio.to_thread(prometheus.query, "tether_gap_bytes_total") == 0

        # The page's keystroke-echo samples land in the histogram; nonsense in a ping is dropped.
        await again.send_json({"type": "ping", "echo_ms": [1.5, 30, "x", -4, 10**9]})
        await again.wait_for("pong")
        await prometheus.until("tether_keystroke_echo_seconds_count", lambda n: n == 2)
        assert await asyncio.to_thread(prometheus.query, 'tether_keystroke_echo_seconds_bucket{le="0.002"}') == 1

        # Closes: the shell exits, its outcome is counted, nothing is held or viewed any more.
        await again.type("exit 3\n")
        await again.wait_closed()
        await prometheus.until('sum(tether_worker_processes{kind="terminal"})', zero_or_absent)
        await prometheus.until('sum(tether_viewers{role="writer"})', zero_or_absent)
        await prometheus.until('sum(tether_outcomes_total{state="completed"})', lambda n: n == 1)
        await prometheus.until('max(tether_sessions{state="live"})', lambda n: (n or 0) == before)
    finally:
        if prometheus is not None:
            prometheus.stop()
        stack.stop()


def test_metrics_are_for_loopback_or_the_token_and_the_worker_says_when_it_is_ready():
    run_secrets.remember("metrics token", "s3cret-scrape-token-of-32-characters")
    stack = Stack(extra_env={"TETHER_METRICS_TOKEN": "s3cret-scrape-token-of-32-characters"})
    worker_http = free_port()
    try:
        stack.start_daphne()
        worker = stack.start_worker("local", env={"TETHER_WORKER_HTTP": f"127.0.0.1:{worker_http}"})
        daphne = stack.ports[0]
        for port in (daphne, worker_http):
            status, body = get(port, "/metrics")
            assert status == 200 and b"tether_" in body, body[:200]  # loopback
            # Passed on by a balancer: not local, whatever the socket says.
            status, body = get(port, "/metrics", {"X-Forwarded-For": "203.0.113.9"})
            assert status == 403 and b"TETHER_METRICS_TOKEN" in body
            status, _ = get(port, "/metrics", {"X-Forwarded-For": "203.0.113.9", "Authorization": "Bearer wrong"})
            assert status == 403
            status, body = get(
                port,
                "/metrics",
                {"X-Forwarded-For": "203.0.113.9", "Authorization": "Bearer s3cret-scrape-token-of-32-characters"},
            )
            assert status == 200 and b"tether_" in body
        # Only the web process reads the database's figures; only the worker has a heartbeat.
        web, worker_said = get(daphne, "/metrics")[1], get(worker_http, "/metrics")[1]
        assert b"tether_sessions" in web and b"tether_heartbeat" not in web
        assert b"tether_heartbeat_seconds_count" in worker_said and b"tether_viewers" not in worker_said

        status, body = get(worker_http, "/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        deadline = time.monotonic() + 10
        while (said := get(worker_http, "/readyz"))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)  # its first heartbeat
        status, body = said
        checks = json.loads(body)["checks"]
        assert status == 200, checks
        assert {"database", "channel_layer", "heartbeat", "backend_local"} <= set(checks)
        assert get(worker_http, "/nothing")[0] == 404

        # Stopped (SIGSTOP): its supervisor's probe gets no answer at all; woken, it answers again.
        worker.send_signal(19)
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            urllib.request.urlopen(f"http://127.0.0.1:{worker_http}/healthz", timeout=1)
        worker.send_signal(18)
        assert get(worker_http, "/healthz")[0] == 200
    finally:
        stack.stop()
