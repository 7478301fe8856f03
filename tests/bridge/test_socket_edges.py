"""The socket's edges: where a browser closes mid-stream, sends what no parser takes, knocks on a path that is no
terminal, or comes from another origin. Each gets a plain answer, and nothing keeps acting for a viewer who left."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from asgiref.sync import sync_to_async
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.bridge.harness import Stack, Viewer, open_viewer
from transport.origins import origin_allowed

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def daphne_log(stack: Stack) -> str:
    return "".join(path.read_text() for path in stack.log_dir.glob(f"{stack.prefix}-daphne-*.log"))


async def test_a_viewer_closed_mid_stream_leaves_nothing_acting_for_it_and_the_exit_is_reported(terminal, operator):
    """Sends into a socket the browser just closed used to end the consumer without its disconnect: its
    owner check then lived on, auto-reset the session in the user's name when the shell died, and the
    user's next attach got a silent fresh shell instead of the exit."""
    stack = Stack(extra_env={"TETHER_RECONNECT_GRACE_SECONDS": "1", "TETHER_VIEWER_CHECK_SECONDS": "1"})
    try:
        await sync_to_async(stack.start)("local")
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        first = await viewer.attach()
        await viewer.type("echo shell-$$-pid; yes tether-flood\r")
        shell = int((await viewer.read_match(rb"shell-(\d+)-pid")).group(1))
        for _ in range(8):  # close in the middle of the stream, again and again
            await viewer.read_until(b"tether-flood\r\ntether-flood")
            await viewer.ws.close()
            viewer = await Viewer.open(stack.ports[0], session.id, cookie)
            await viewer.attach(since=0, generation=first["generation"], epoch=first["epoch"])
        await viewer.ws.close()
        await asyncio.sleep(2)  # past the reconnect grace
        os.kill(shell, signal.SIGKILL)
        await asyncio.sleep(4)  # an orphaned owner check (every second) would have attached and reset by now

        last = await Viewer.open(stack.ports[0], session.id, cookie)
        await last.send_json({"type": "attach", "since": 0, "generation": first["generation"], "cols": 80, "rows": 24})
        exit = await last.wait_for("exit")
        assert (exit["generation"], exit["outcome"]) == (first["generation"], "Ended by signal 9"), exit
        await last.wait_for("reset")
        attached = await last.wait_for("attached")
        assert attached["generation"] == first["generation"] + 1
        await last.close()
        assert "Attempt to send on a closed protocol" not in daphne_log(stack)
        assert " ERROR " not in daphne_log(stack), daphne_log(stack)[-3000:]
    finally:
        await sync_to_async(stack.stop)()


async def test_deeply_nested_json_gets_an_error_reply_and_the_session_lives_on(stack, terminal, operator):
    viewer, _session, _cookie = await open_viewer(stack, terminal, operator)
    await viewer.ws.send("[" * 60000)  # under the frame limit, far deeper than any parser recurses
    assert "malformed JSON" in (await viewer.wait_for("error"))["message"]
    await viewer.ws.send('{"a":' * 12000)
    assert "malformed JSON" in (await viewer.wait_for("error"))["message"]
    await viewer.type("echo alive-$((5*5))\r")
    await viewer.read_until(b"alive-25")
    assert "RecursionError" not in daphne_log(stack) and "Traceback" not in daphne_log(stack)


async def test_a_path_that_is_no_terminal_is_refused_plainly_even_to_strangers(stack, terminal, operator):
    port = stack.ports[0]
    for path in ("/ws/nope/", "/ws/terminals/not-a-uuid/", "/ws/"):
        with pytest.raises(InvalidStatus) as refused:
            await connect(f"ws://127.0.0.1:{port}{path}", additional_headers={"Origin": f"http://127.0.0.1:{port}"})
        assert refused.value.response.status_code == 403
    await asyncio.sleep(0.3)
    assert "Traceback" not in daphne_log(stack) and "No route found" not in daphne_log(stack)


async def test_only_this_sites_own_origin_opens_a_socket(stack, terminal, operator):
    session, cookie = await sync_to_async(terminal)(operator, "local")
    port = stack.ports[0]
    for origin in (
        "http://127.0.0.1:9",  # the same host on another port
        f"https://127.0.0.1:{port}",  # another scheme
        f"http://localhost:{port}",  # another host name than the page's
        "null",
        f"http://127.0.0.1:{port}@evil.example",
    ):
        with pytest.raises(InvalidStatus) as refused:
            await Viewer.open(port, session.id, cookie, origin=origin)
        assert refused.value.response.status_code == 403, origin
    viewer = await Viewer.open(port, session.id, cookie)  # the page's own origin
    await viewer.attach()
    await viewer.close()


def scope(origin: str, host: str = "tether.example.com", scheme: str = "ws", **headers: str) -> dict:
    pairs = [(b"origin", origin.encode()), (b"host", host.encode())]
    pairs += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": pairs}


def test_the_origin_rule_is_scheme_host_and_port(settings):
    settings.ALLOWED_HOSTS = ["tether.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.corp.example", "https://portal.example:8443"]
    assert origin_allowed(scope("http://tether.example.com"))
    assert origin_allowed(scope("http://tether.example.com:80"))  # the default port, spelt out
    assert not origin_allowed(scope("http://tether.example.com:8080"))
    assert not origin_allowed(scope("https://tether.example.com"))  # plain ws: the page was http
    assert origin_allowed(scope("https://tether.example.com", scheme="wss"))
    assert not origin_allowed(scope("http://tether.example.com", host="evil.example"))  # a host not allowed
    # Behind a TLS proxy the socket arrives as ws; the proxy's header says the browser used https.
    assert not origin_allowed(scope("https://tether.example.com", x_forwarded_proto="https"))
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert origin_allowed(scope("https://tether.example.com", x_forwarded_proto="https"))
    assert not origin_allowed(scope("http://tether.example.com", x_forwarded_proto="https"))
    # Trusted origins, as Django's CSRF check reads them (a leading wildcard for subdomains).
    assert origin_allowed(scope("https://ops.corp.example"))
    assert not origin_allowed(scope("http://ops.corp.example"))
    assert origin_allowed(scope("https://portal.example:8443"))
    assert not origin_allowed(scope("https://portal.example"))
    assert not origin_allowed({"type": "websocket", "scheme": "ws", "headers": [(b"host", b"tether.example.com")]})
