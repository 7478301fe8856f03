"""Chromium (Debian's, never a downloaded one) driving the real pages on a real daphne + worker + Redis stack."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import pytest_asyncio
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from executions.actions import Actor, add_machine
from tests.bridge.harness import ROOT, Stack

CHROMIUM = os.environ.get("TETHER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DIST = ROOT / "static" / "dist"
# Generous: a loaded CI machine starts shells and daphnes slowly, and a passing wait returns at once.
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)
# Set TETHER_SCREENSHOTS=1 to refresh the pictures in docs/screenshots/ (they are committed, so not on every run).
SCREENSHOTS = ROOT / "docs" / "screenshots" if os.environ.get("TETHER_SCREENSHOTS") else None


# TETHER_BROWSER_TRACE=1 logs every WebSocket frame to the console (printed when a test fails).
WEBSOCKET_TRACE = """
(() => {
  const Native = window.WebSocket;
  const t0 = performance.now();
  const show = (d) => typeof d === "string" ? d.slice(0, 200) : `<${d.byteLength ?? d.length} bytes>`;
  const at = () => `${Math.round(performance.now() - t0)}ms`;
  window.WebSocket = function (url, protocols) {
    const ws = new Native(url, protocols);
    const id = Math.random().toString(36).slice(2, 6);
    console.log(`ws ${id} ${at()} open ${url}`);
    ws.addEventListener("message", (e) => console.log(`ws ${id} ${at()} <- ${show(e.data)}`));
    ws.addEventListener("close", (e) => console.log(`ws ${id} ${at()} closed ${e.code}`));
    const send = ws.send.bind(ws);
    ws.send = (d) => { console.log(`ws ${id} ${at()} -> ${show(d)}`); send(d); };
    return ws;
  };
  Object.assign(window.WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
})();
"""


@pytest.fixture(scope="session")
def frontend_built() -> Path:
    """static/dist/ as `make test` builds it; quick when nothing changed."""
    built = subprocess.run([ROOT / "scripts" / "build-frontend.sh"], cwd=ROOT, capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"scripts/build-frontend.sh failed:\n{built.stdout}\n{built.stderr}")
    for name in ("terminal.js", "player.js", "xterm.css", "htmx.min.js", "tether.css", "asciinema-player.css"):
        if not (DIST / name).is_file():
            pytest.fail(f"static/dist/{name} is missing after scripts/build-frontend.sh")
    return DIST


def committed(function, *args, **kwargs):
    """Run ``function`` on a connection of its own, outside the test's transaction: the servers see it."""

    def run():
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


@pytest.fixture(scope="module")
def stack(request, frontend_built, django_db_setup, django_db_blocker):
    """One daphne + worker for the module: starting them per test would cost most of the time budget.

    The servers must see what the tests create, and it must outlive a test: so it is committed
    on a connection of its own (see ``committed``), each test gets its own machine, and the
    database is flushed at the end as a transactional test case would. A module's ``STACK_ENV``
    adds to the servers' environment.
    """
    stack = Stack(
        extra_env={
            # A plain shell: no rc files (see tests/conftest.py).
            "TETHER_SHELL": "/bin/bash,--noprofile,--norc",
            # Every test opens a terminal as the same person.
            "TETHER_SESSIONS_PER_USER": "100",
            # The lost-output test replays the buffer into xterm's scrollback: keep it to 256 KiB.
            "TETHER_BUFFER_BYTES": "262144",
            **getattr(request.module, "STACK_ENV", {}),
        }
    )
    try:
        stack.start(backends="local")
        with django_db_blocker.unblock():
            committed(_staff_operator)
        yield stack
    finally:
        stack.stop()
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


def _staff_operator() -> None:
    """The staff user most tests sign in as: it opens shells on every workspace (a staff permission, no grant)."""
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username="operator", password="operator-password", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="use_every_workspace"))


@pytest.fixture
def base_url(stack) -> str:
    return f"http://127.0.0.1:{stack.ports[0]}"


_machines = itertools.count(1)


@pytest.fixture
def host_machine(stack) -> str:
    """A fresh local machine for this test (host shells: the staff user may open them); returns its name."""
    number = next(_machines)
    name = "dev-box" if number == 1 else f"dev-box-{number}"
    committed(add_machine, name=name, backend="local", scope="team-a", actor=Actor.command("tests"))
    return name


# One Chromium for the module (launching it per test costs a second each): the async fixtures and the
# tests share the module's event loop (the tests say `pytest.mark.asyncio(loop_scope="module")`).
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing (make services installs Debian's chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser, base_url) -> AsyncIterator[BrowserContext]:
    context = await browser.new_context(base_url=base_url, viewport={"width": 1100, "height": 680})
    context.set_default_timeout(TIMEOUT_MS)
    log: list[str] = []
    if os.environ.get("TETHER_BROWSER_TRACE"):
        await context.add_init_script(WEBSOCKET_TRACE)
    # Printed at teardown; pytest shows it only when the test failed.
    context.on("console", lambda message: log.append(f"console.{message.type}: {message.text}"))
    context.on("weberror", lambda error: log.append(f"page error: {error.error}"))
    try:
        yield context
    finally:
        for page in context.pages:
            try:
                state = await page.evaluate("window.tetherTerminal ? window.tetherTerminal.state() : null")
                text = await page.evaluate("window.tetherTerminal ? window.tetherTerminal.text() : ''")
                print(f"--- {page.url}\nstate: {state}\nscreen:\n{text[-2000:]}")
            except Exception as error:
                print(f"--- {page.url}: {error!r}")
        print("\n".join(log))
        await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(context) -> Page:
    return await context.new_page()
