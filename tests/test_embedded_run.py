"""`make run`'s steps on a fresh data directory: SQLite, migrate, printed admin login, daphne serving admin."""

from __future__ import annotations

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_embedded_mode_serves_admin_with_the_printed_login(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
    environ["TETHER_DATA_DIR"] = str(tmp_path)
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
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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
    finally:
        server.terminate()
        server.wait(timeout=10)
