"""The direct link between daphne and the owner worker (transport/links.py), end to end: keystrokes, echoes and
output go over it, not through Redis; where no link can be made, Redis carries the stream and says so."""

from __future__ import annotations

import re

import pytest
import redis
from asgiref.sync import sync_to_async

from tests.bridge.harness import RedisServer, Stack, Viewer, free_port, metric
from tests.hosts.harness import LinkRelay, link_certificates

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def publishes(url: str) -> int:
    """PUBLISH commands this Redis has run (its own, so no other test's count in it)."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return stats.get("cmdstat_publish", {}).get("calls", 0)


async def test_keystrokes_echoes_and_output_go_over_the_link_not_through_redis(terminal, operator):
    private = RedisServer()
    private.start()
    worker_http = free_port()
    stack = Stack(redis_url=private.url)
    try:
        stack.start_daphne()
        stack.start_worker("local", env={"TETHER_WORKER_HTTP": f"127.0.0.1:{worker_http}"})
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        await viewer.type("echo ready-$((6*7))\r")
        await viewer.read_until(b"ready-42")
        # The terminal echoes each key while head waits for its line (a prompt's line editor would wrap it).
        await viewer.type("head -c 100 >/dev/null\r")
        await viewer.read_until(b"null\r\n")
        before = publishes(private.url)
        for n in range(100):
            await viewer.type("x")
            await viewer.read_until(b"x" * (n + 1))
        await viewer.type("\rhead -c 2000000 /dev/zero | tr '\\0' y; echo done-$((6*7))\r")
        await viewer.read_until(b"done-42", timeout=60)
        # 100 keystrokes and their echoes, 2 MB of output and its acks: none of it through Redis.
        assert publishes(private.url) - before == 0
        assert metric(stack.ports[0], 'tether_links{side="dial"}') == 1
        assert metric(stack.ports[0], 'tether_link_bytes_total{direction="received"}') > 2_000_000
        assert metric(worker_http, 'tether_links{side="accept"}') == 1
        assert metric(worker_http, 'tether_link_bytes_total{direction="sent"}') > 2_000_000
        assert metric(stack.ports[0], "tether_link_fallbacks_total") == 0
        await viewer.close()
    finally:
        stack.stop()
        private.stop()


async def test_where_no_link_can_be_made_redis_carries_the_stream_and_says_so(terminal, operator):
    """A worker that advertises an address no daphne reaches (a firewall between hosts): the session works
    through Redis, and daphne's log and /metrics say the link could not be made."""
    stack = Stack()
    try:
        stack.start_daphne()
        # It listens on 127.0.0.1 and says it is at 127.0.0.2, where nothing listens.
        stack.start_worker("local", env={"TETHER_LINK_LISTEN": "tcp:127.0.0.1:0", "TETHER_LINK_ADVERTISE": "127.0.0.2"})
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        await viewer.type("echo through-redis-$((6*7))\r")
        await viewer.read_until(b"through-redis-42")
        assert metric(stack.ports[0], "tether_link_fallbacks_total") >= 1
        assert metric(stack.ports[0], 'tether_links{side="dial"}') == 0
        await viewer.close()
        logs = b"".join(path.read_bytes() for path in stack.log_dir.glob(f"{stack.prefix}-daphne-*.log"))
        assert re.search(rb"no link to worker \w+ at tcp:127\.0\.0\.2:\d+ .*go through Redis", logs), logs[-3000:]
    finally:
        stack.stop()


async def test_a_link_that_drops_with_output_and_acks_on_it_resumes_the_stream_from_its_offset(terminal, operator):
    """A network that stalls, then fails: what was on the link is lost both ways, the worker's output past the
    viewer's last ack and the viewer's acks. The worker waits for an ack (its window is full), the viewer for
    output; told the link dropped (link.lost), the viewer says its ack again and asks for what it misses, and the
    stream goes on from its offset: every line once and in order."""
    relay = LinkRelay()
    stack = Stack()
    try:
        stack.start_daphne()
        stack.start_worker("local", env=relay.env)
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        await viewer.type("echo ready-$((6*7))\r")
        await viewer.read_until(b"ready-42")
        assert relay.accepted == 1
        count = 200_000
        await viewer.type(f"seq 1 {count}; echo end-$((6*7))\r")
        await viewer.read_until(b"\r\n20000\r\n", timeout=60)
        relay.hold()
        await viewer.read_for(2)  # what was on its way before the hold, then nothing: the window is full
        held = len(viewer.output)
        await viewer.read_for(2)
        assert len(viewer.output) == held and b"end-42" not in viewer.output
        relay.cut()
        await viewer.read_until(b"end-42\r\n", timeout=30)
        text = bytes(viewer.output).decode(errors="replace")
        numbers = text[text.index("\x071\r\n", text.index("seq 1")) + 1 :].split("\r\n")[:count]
        assert numbers == [str(n) for n in range(1, count + 1)]
        await viewer.close()
    finally:
        stack.stop()
        relay.close()


async def test_between_hosts_a_daphne_and_a_worker_link_over_mutual_tls_and_no_keystroke_crosses_in_clear(
    terminal, operator, tmp_path
):
    """TETHER_LINK_LISTEN=tls:..., each end with its certificate and the CA: the session's keys and output go over
    the link (0 PUBLISH of them), and what the network between the hosts carries holds none of them in clear."""
    files = link_certificates(tmp_path)
    private, relay = RedisServer(), LinkRelay()
    private.start()

    def ends(who: str) -> dict[str, str]:
        return {
            "TETHER_LINK_TLS_CERT": f"{files[who]}.pem",
            "TETHER_LINK_TLS_KEY": f"{files[who]}.key",
            "TETHER_LINK_TLS_CA": files["ca.pem"],
        }

    stack = Stack(redis_url=private.url, extra_env=ends("daphne"))  # (the worker's own below)
    try:
        stack.start_daphne()
        listen = {"TETHER_LINK_LISTEN": f"tls:127.0.0.1:{relay.port}", "TETHER_LINK_ADVERTISE": "127.0.0.2"}
        stack.start_worker("local", env={**listen, **ends("worker")})
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        await viewer.type("echo ready-$((6*7))\r")
        await viewer.read_until(b"ready-42")
        before = publishes(private.url)
        await viewer.type("echo the-secret-word-$((6*7))\r")
        await viewer.read_until(b"the-secret-word-42")
        assert publishes(private.url) - before == 0
        assert relay.accepted == 1 and relay.passed > 1000
        assert b"the-secret-word" not in relay.seen and b"ready-" not in relay.seen
        await viewer.close()
    finally:
        stack.stop()
        private.stop()
        relay.close()
