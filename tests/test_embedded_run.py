"""`make run`'s steps on a fresh data directory: SQLite, migrate, printed admin login, daphne serving admin."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def test_embedded_mode_serves_admin_with_the_printed_login(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
    environ["TETHER_DATA_DIR"] = str(tmp_path)
    environ["TETHER_SHELL"] = "/bin/bash,--noprofile,--norc"
    # Its tmux shell outlives the server by design: on a test socket (clean-test-leftovers.sh knows it).
    environ["TETHER_TMUX_SOCKET"] = f"tether-test-{tmp_path.name[-8:]}"
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )
    assert run("migrate", "--noinput").returncode == 0
    printed = run("ensure_admin").stdout
    username, password = re.search(r"Admin login: (\S+) / (\S+)", printed).groups()
    assert run("ensure_admin").stdout == printed  # idempotent: same login every time
    assert (tmp_path / "tether.sqlite3").exists()

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "tether_serve", "--port", str(port)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("wb"),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        for _ in range(100):
            try:
                login_page = opener.open(f"{base}/admin/login/", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("daphne did not answer")
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

        # The owner worker runs inside the same process, on the in-memory channel layer.
        opened = run("shell", "-c", OPEN_TERMINAL)
        assert opened.returncode == 0, opened.stderr
        session_id = opened.stdout.strip().splitlines()[-1]
        cookie = next(c.value for c in jar if c.name == "sessionid")
        echoed = asyncio.run(_echo(port, session_id, cookie))
        assert b"embedded-42" in echoed
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["tmux", "-L", environ["TETHER_TMUX_SOCKET"], "kill-server"], capture_output=True)
