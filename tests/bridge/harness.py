"""Real processes for the bridge tests: daphne servers and owner workers on Redis and the test database."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.test import Client
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from terminals.protocol import ACK_AT_ONCE_BYTES, ACK_IDLE_MS
from tests import run_secrets
from tests.launcher import launch

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A program printing about 1 MB/s (100 KiB every 0.1 s) from one process: a shell loop of head, tr and
# sleep would start dozens of processes a second per session and load the machine more than its output.
STREAM_1MBS = (sys.executable, "-c", "import os, time\nwhile True: os.write(1, b'x' * 102400); time.sleep(0.1)")


SHELL_MARKS = re.compile(rb"\x1b\]133;[^\x07\x1b]*(?:\x07|\x1b\\)")


def without_marks(data: bytes | bytearray) -> bytes:
    """Output as it shows: the shell's command marks (docs/commands.md) are not drawn."""
    return SHELL_MARKS.sub(b"", bytes(data))


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll ``predicate`` (a synchronous check, e.g. a query) until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# How the page acknowledges what it drew (frontend/attached-stream.js, terminals/protocol/words.py): at once from
# ACK_AT_ONCE_BYTES new (this client draws everything at once), ACK_IDLE_MS after the last draw when less.
ACK_IDLE_SECONDS = ACK_IDLE_MS / 1000
TEST_IMAGE = "tether/busybox:test"  # built locally by scripts/ensure-services.sh


def own_directory(variable: str, default: str) -> str:
    """A directory of this test process's own, kept in ``variable`` for the servers it starts: under
    pytest-xdist each worker gets its own (``…-gw0``), so one worker's clean-up never touches another's.
    Never one the environment names: the run ends by removing it (a real install's would go)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    os.environ[variable] = value = f"{default}-{worker}" if worker else default
    return value


# Recordings the test servers save (tests/conftest.py points this process's recordings storage here too).
RECORDINGS_DIR = own_directory("TETHER_RECORDINGS_DIR", f"/tmp/tether-test-recordings-{os.getuid()}")


@functools.cache
def collected_static() -> str:
    """``manage.py collectstatic`` run once per test run, with production settings, into a folder of its own."""
    root = Path(tempfile.mkdtemp(prefix="tether-static-"))
    secret = "collectstatic-needs-no-secret-but-production-settings-want-one"
    env = {**os.environ, "TETHER_MODE": "production", "SECRET_KEY": secret, "ALLOWED_HOSTS": "127.0.0.1"}
    env["TETHER_STATIC_ROOT"] = str(root)
    done = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, capture_output=True
    )
    if done.returncode != 0:
        raise AssertionError(f"collectstatic failed: {done.stderr.decode()[-2000:]}")
    return str(root)


def start_container(prefix: str = "tether-test") -> tuple[str | None, str]:
    """A throwaway container from the test image, without a network, labelled for leftover cleanup.

    Returns (name, "") or (None, docker's error)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    options = ["--rm", "--network", "none", "--label", "tether.test=1", "--name", name]
    started = subprocess.run(
        ["docker", "run", "-d", *options, TEST_IMAGE, "sleep", "2147483647"],
        capture_output=True,
        text=True,
    )
    return (name, "") if started.returncode == 0 else (None, started.stderr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    db = connection.settings_dict
    return f"postgres:///{db['NAME']}?host={db['HOST'] or '/var/run/postgresql'}"


class RedisServer:
    """A private redis-server for tests that restart it, so the shared one is never disturbed."""

    def __init__(self):
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass
class Stack:
    """Daphne servers and workers sharing one channel prefix on the real Redis."""

    prefix: str = field(default_factory=lambda: f"tether-test-{uuid.uuid4().hex[:8]}")
    ports: list[int] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    workers: list[subprocess.Popen] = field(default_factory=list)
    daphnes: list[subprocess.Popen] = field(default_factory=list)  # in the order of ``ports``
    extra_env: dict[str, str] = field(default_factory=dict)
    redis_url: str = REDIS_URL
    # Tests create work from a process whose wake-ups do not reach the workers: they poll often.
    worker_poll: float = 0.1
    log_dir: Path = field(default_factory=lambda: run_secrets.LOGS)  # searched for secrets after the run
    access_log: bool = True  # daphne's access log (its stdout) into its log too

    def _log(self, name: str):
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return open(self.log_dir / f"{self.prefix}-{name}-{len(self.processes)}.log", "w+b")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": database_url(),
            "REDIS_URL": self.redis_url,
            "TETHER_CHANNEL_PREFIX": self.prefix,
            # Production settings, as deployed: secret and hosts required, secure cookies, no embedded worker.
            "TETHER_MODE": "production",
            "SECRET_KEY": settings.SECRET_KEY,  # the tests sign login sessions with it
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            # Production static files: WhiteNoise serves what collectstatic gathered, as in a deployment.
            "TETHER_STATIC_ROOT": collected_static(),
            "TETHER_HEARTBEAT_SECONDS": "1",
            "TETHER_LEASE_TTL_SECONDS": "4",
            "TETHER_DB_IDLE_TRANSACTION_SECONDS": "8",
            "TETHER_RECORDINGS_DIR": RECORDINGS_DIR,
            **self.extra_env,
        }

    def start_daphne(self, port: int | None = None) -> int:
        """Start a daphne server (on ``port`` when given, e.g. to come back where a killed one was)."""
        port = port or free_port()
        log = self._log("daphne")
        process = launch(
            [
                sys.executable,
                "-m",
                "config.web",  # daphne on the chosen event loop
                "--websocket_timeout",
                "-1",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "config.asgi:application",
            ],
            cwd=ROOT,
            env=self.env(),
            stdout=log if self.access_log else subprocess.DEVNULL,
            stderr=log,
        )
        self.processes.append(process)
        self.daphnes.append(process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None:
                    raise AssertionError(f"daphne died; see {self.log_dir}") from None
                time.sleep(0.05)
        else:
            raise AssertionError("daphne did not start")
        self.ports.append(port)
        return port

    def start_worker(self, backends: str = "local,tmux,docker", env: dict[str, str] | None = None) -> subprocess.Popen:
        """A worker (``env``: settings of its own, on top of the stack's)."""
        log = self._log("worker")
        process = launch(
            [sys.executable, "manage.py", "terminal_worker", "--poll", str(self.worker_poll), "--backends", backends],
            cwd=ROOT,
            env={**self.env(), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while b" ready (" not in Path(log.name).read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker did not start: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.05)
        self.processes.append(process)
        self.workers.append(process)
        return process

    def start(self, backends: str = "local,tmux,docker") -> Stack:
        """A daphne and a worker, side by side: each takes a second or two to import Django and come up."""
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(self.start_daphne), pool.submit(self.start_worker, backends)]:
                started.result()
        return self

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect is the answer itself (a login page, say)


def http_get(port: int, path: str, cookie: str) -> tuple[int, dict, bytes]:
    """A GET to a test daphne as the user the cookie signs in: (status, headers, body); redirects not followed."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Cookie": f"sessionid={cookie}", "Host": "127.0.0.1"}
    )
    try:
        with urllib.request.build_opener(_NoRedirects).open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def http_post(port: int, path: str, cookie: str, fields: dict | None = None) -> tuple[int, bytes]:
    """A POST as the page's forms make it, through daphne: the CSRF token read from a page first."""
    import http.cookiejar
    import urllib.parse

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirects)
    base = f"http://127.0.0.1:{port}"
    page = opener.open(urllib.request.Request(f"{base}/", headers={"Cookie": f"sessionid={cookie}"}), timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.read().decode()).group(1)
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, **(fields or {})}).encode()
    headers = {"Cookie": f"sessionid={cookie}; csrftoken={csrf}", "Referer": f"{base}/"}
    try:
        with opener.open(urllib.request.Request(f"{base}{path}", data=data, headers=headers), timeout=30) as done:
            return done.status, done.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def metric(port: int, name: str) -> float:
    """One figure from a process's /metrics (loopback: no token needed)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


class Viewer:
    """A WebSocket client speaking the terminal protocol, like the browser page does."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.output = bytearray()
        self.messages: list[dict] = []
        self.offset = 0
        self.auto_ack = True  # acknowledge rendered output like the page does; False plays a stalled browser
        self.acked = 0
        self.ack_soon: asyncio.Task | None = None

    @classmethod
    async def open(
        cls, port: int, session_id, cookie: str, *, origin: str | None = None, path: str | None = None
    ) -> Viewer:
        """A socket to a session (or to ``path``, such as a share link's ``/ws/shares/TOKEN/``)."""
        headers = {"Cookie": f"sessionid={cookie}", "Origin": origin or f"http://127.0.0.1:{port}"}
        ws = await connect(
            f"ws://127.0.0.1:{port}{path or f'/ws/terminals/{session_id}/'}",
            additional_headers=headers,
            max_size=2**22,
            ping_interval=None,
        )
        return cls(ws)

    async def attach(
        self, since: int = 0, cols: int = 80, rows: int = 24, generation: int | None = None, epoch: int | None = None
    ) -> dict:
        await self.send_json(
            {"type": "attach", "since": since, "cols": cols, "rows": rows, "generation": generation, "epoch": epoch}
        )
        return await self.wait_for("attached")

    async def observe(self, since: int = 0, generation: int | None = None, epoch: int | None = None) -> dict:
        """Watch read-only beside the writer."""
        await self.send_json({"type": "observe", "since": since, "generation": generation, "epoch": epoch})
        return await self.wait_for("attached")

    async def ack(self) -> None:
        self.acked = self.offset
        await self.send_json({"type": "ack", "offset": self.offset})

    async def _acknowledge(self, *, idle: bool = False) -> None:
        """As the page acks (frontend/attached-stream.js): at once from ACK_AT_ONCE_BYTES, a few bytes
        ACK_IDLE_SECONDS after they were drawn."""
        if idle:
            await asyncio.sleep(ACK_IDLE_SECONDS)
            self.ack_soon = None
        elif self.offset - self.acked < ACK_AT_ONCE_BYTES:
            if self.ack_soon is None:
                self.ack_soon = asyncio.create_task(self._acknowledge(idle=True))
            return
        if self.auto_ack and self.offset > self.acked:
            try:
                await self.ack()
            except ConnectionClosed:
                pass  # closing: what the server said before it (superseded, exit) is still to be read

    async def send_json(self, message: dict) -> None:
        await self.ws.send(json.dumps(message))

    async def type(self, data: bytes | str) -> None:
        await self.ws.send(data.encode() if isinstance(data, str) else data)

    async def _next(self, timeout: float) -> None:
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        if isinstance(frame, bytes):
            self.output += frame
            self.offset += len(frame)
            if self.auto_ack:  # this client renders at once, so everything received is rendered
                await self._acknowledge()
        else:
            message = json.loads(frame)
            self.messages.append(message)
            if message["type"] == "attached":
                self.offset = self.acked = message["offset"]

    async def read_for(self, seconds: float) -> None:
        """Take whatever comes for ``seconds`` (acknowledging it only if ``auto_ack``): with it off, a browser
        whose renderer is stuck, whose socket still takes frames and answers daphne's pings."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                await self._next(left)
            except TimeoutError:
                pass

    async def read_until(self, needle: bytes, timeout: float = 15.0) -> bytes:
        deadline = time.monotonic() + timeout
        start = len(self.output) - len(needle) if len(self.output) > len(needle) else 0
        while needle not in self.output[start:]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{needle!r} not seen; got {bytes(self.output[-500:])!r}; {self.messages[-5:]}")
            await self._next(remaining)
        return bytes(self.output)

    async def read_match(self, pattern: bytes, timeout: float = 15.0) -> re.Match:
        """Wait until ``pattern`` matches output received from now on; return the match."""
        start = len(self.output)
        deadline = time.monotonic() + timeout
        while (match := re.search(pattern, bytes(self.output[start:]))) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{pattern!r} not seen; got {bytes(self.output[-500:])!r}; {self.messages[-5:]}")
            await self._next(remaining)
        return match

    async def wait_for(self, kind: str, timeout: float = 20.0) -> dict:
        seen = len(self.messages)
        deadline = time.monotonic() + timeout
        while True:
            for message in self.messages[seen:]:
                if message["type"] == kind:
                    return message
            seen = len(self.messages)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {kind!r} message; got {self.messages[-5:]}")
            await self._next(remaining)

    async def wait_closed(self, timeout: float = 10.0) -> int:
        try:
            while True:
                await self._next(timeout)
        except ConnectionClosed as closed:
            await self._stop_acking()
            return closed.rcvd.code if closed.rcvd else 1006  # no close frame came: abnormal closure

    async def close(self) -> None:
        await self._stop_acking()
        await self.ws.close()

    async def _stop_acking(self) -> None:
        if (task := self.ack_soon) is not None:
            self.ack_soon = None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def open_viewer(stack: Stack, terminal, user, backend: str = "local", **attach) -> tuple[Viewer, object, str]:
    """Open a terminal session for ``user`` on a new machine and attach a viewer through the first daphne."""
    session, cookie = await sync_to_async(terminal)(user, backend)
    viewer = await Viewer.open(stack.ports[0], session.id, cookie)
    await viewer.attach(**attach)
    return viewer, session, cookie
