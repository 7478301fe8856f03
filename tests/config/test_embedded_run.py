"""`make run` on a fresh data directory: SQLite, migrate, printed admin login, admin and a terminal served."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


FACTS = """
from django.conf import settings
from executions.models import Machine
print(Machine.objects.get(name="this-host").backend, settings.CHANNEL_LAYERS["default"]["BACKEND"])
"""

OPEN_TERMINAL = """
from django.contrib.auth import get_user_model
from executions.models import Machine
from terminals.actions import open_terminal
session, _ = open_terminal(Machine.objects.get(name="this-host"), get_user_model().objects.get(username="admin"))
print(session.id)
"""


async def _echo(port: int, session_id: str, cookie: str) -> bytes:
    from tests.bridge.harness import Viewer

    viewer = await Viewer.open(port, session_id, cookie)
    await viewer.attach()
    await viewer.type("echo embedded-$((6*7))\r")
    output = await viewer.read_until(b"embedded-42")
    await viewer.close()
    return output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _without_tmux(tmp_path: Path) -> str:
    """A PATH with every program of this one but tmux: a host where tmux is not installed."""
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = shadow / name
            if name != "tmux" and not target.exists() and os.access(os.path.join(directory, name), os.X_OK):
                target.symlink_to(os.path.join(directory, name))
    return str(shadow)


@pytest.mark.parametrize("tmux", ["with tmux", "without tmux"])
def test_make_run_serves_admin_with_the_printed_login_and_a_terminal(tmp_path, tmux):
    environ = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
    environ["TETHER_DATA_DIR"] = str(tmp_path)
    environ["TETHER_SHELL"] = "/bin/bash,--noprofile,--norc"
    # Its tmux shell outlives the server by design: on a test socket (clean-test-leftovers.sh knows it).
    environ["TETHER_TMUX_SOCKET"] = f"tether-test-{tmp_path.name[-8:]}"
    if tmux == "without tmux":
        environ["PATH"] = _without_tmux(tmp_path)
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )

    port = _free_port()
    printed = tmp_path / "make-run.out"
    # The README's command itself, on a port of its own.
    server = subprocess.Popen(
        ["make", "run", f"PORT={port}"],
        cwd=ROOT,
        env=environ,
        stdout=printed.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        deadline = time.monotonic() + 120
        while True:
            try:
                login_page = opener.open(f"{base}/admin/login/", timeout=5).read().decode()
                break
            except OSError:
                assert server.poll() is None, printed.read_text()
                assert time.monotonic() < deadline, f"make run did not serve: {printed.read_text()[-2000:]}"
                time.sleep(0.2)
        output = printed.read_text()
        username, password = re.search(r"Admin login: (\S+) / (\S+)", output).groups()
        assert f"Tether: http://127.0.0.1:{port}/" in output
        assert run("ensure_admin").stdout.strip() in output  # idempotent: the same login every time
        assert (tmp_path / "tether.sqlite3").exists()  # SQLite under the data directory: no service needed
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": token, "username": username, "password": password, "next": "/admin/"}
        ).encode()
        request = urllib.request.Request(f"{base}/admin/login/?next=/admin/", data=form, headers={"Referer": base})
        landed = opener.open(request, timeout=10)
        assert landed.geturl().endswith("/admin/")
        assert "Site administration" in landed.read().decode()
        # Static files are served by the same process in embedded mode.
        css = opener.open(f"{base}/static/admin/css/base.css", timeout=5)
        assert css.status == 200

        # The machine is tmux when tmux exists, else a local PTY; the layer is in memory.
        facts = run("shell", "-c", FACTS)
        assert facts.returncode == 0, facts.stderr
        backend, layer = facts.stdout.strip().splitlines()[-1].split()
        assert backend == ("tmux" if tmux == "with tmux" else "local")
        assert layer == "transport.layers.CappedInMemoryLayer"
        # The owner worker runs inside the same process, on the in-memory channel layer.
        opened = run("shell", "-c", OPEN_TERMINAL)
        assert opened.returncode == 0, opened.stderr
        session_id = opened.stdout.strip().splitlines()[-1]
        cookie = next(c.value for c in jar if c.name == "sessionid")
        echoed = asyncio.run(_echo(port, session_id, cookie))
        assert b"embedded-42" in echoed
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        subprocess.run(["tmux", "-L", environ["TETHER_TMUX_SOCKET"], "kill-server"], capture_output=True)


SERVE_CAPTURED = """
import os
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()
import daphne.server


class Server:  # what tether_serve hands to daphne, printed instead of serving
    def __init__(self, **options):
        self.options = options

    def run(self):
        print("websocket_timeout", self.options["websocket_timeout"])


daphne.server.Server = Server
from django.core.management import call_command

call_command("tether_serve", "--port", "0", "--no-worker")
"""


@pytest.mark.django_db(transaction=True)
def test_terminals_are_never_cut_off_by_daphnes_websocket_timeout():
    """daphne closes every WebSocket after 24 hours unless told otherwise; a terminal must stay open."""
    from tests.bridge.harness import database_url

    served = subprocess.run(
        [sys.executable, "-c", SERVE_CAPTURED],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 0, served.stderr
    assert "websocket_timeout -1" in served.stdout  # daphne: negative means no limit
    # The production command in the runbook and the web unit in deploy/ say the same (config.web is daphne).
    assert "-m config.web --websocket_timeout -1 " in (ROOT / "docs" / "operations.md").read_text()
    assert "--websocket_timeout -1 " in (ROOT / "deploy" / "systemd" / "tether-web@.service").read_text()
