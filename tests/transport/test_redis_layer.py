"""Tether's pub/sub channel layer (transport/redis_layer.py), on real Redis: what a sender and a
receiver rely on, through a Redis restart and after a channel is let go of."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import threading
import uuid

import msgpack
import pytest
import redis
from asgiref.sync import async_to_sync

from tests.bridge.harness import REDIS_URL, RedisServer, free_port
from transport import redis_wire
from transport.redis_layer import RedisPubSubLayer

PREFIX = f"tether-test-{uuid.uuid4().hex[:8]}."  # as every process of one install shares its prefix


def make_layer(url: str = REDIS_URL) -> RedisPubSubLayer:
    return RedisPubSubLayer(hosts=[url], prefix=PREFIX)


@contextlib.asynccontextmanager
async def pair(url: str = REDIS_URL):
    """A sender's layer and a receiver's (two processes, as daphne and a worker), closed afterwards."""
    sender, receiver = make_layer(url), make_layer(url)
    try:
        yield sender, receiver
    finally:
        await sender.flush()
        await receiver.flush()


async def test_the_first_message_sent_after_new_channel_is_received():
    """new_channel returns once Redis has the subscription: a message sent at once is never lost."""
    async with pair() as (sender, receiver):
        for n in range(50):
            channel = await receiver.new_channel()
            await sender.send(channel, {"type": "terminal.output", "n": n, "data": b"\x00\xff"})
            message = await asyncio.wait_for(receiver.receive(channel), 5)
            assert message == {"type": "terminal.output", "n": n, "data": b"\x00\xff"}
            await receiver.forget(channel)


async def test_groups_reach_every_member_and_a_discarded_one_no_more():
    async with pair() as (sender, receiver):
        first, second = await receiver.new_channel(), await receiver.new_channel()
        await receiver.group_add("viewers", first)
        await receiver.group_add("viewers", second)
        await sender.group_send("viewers", {"type": "hello"})
        assert await asyncio.wait_for(receiver.receive(first), 5) == {"type": "hello"}
        assert await asyncio.wait_for(receiver.receive(second), 5) == {"type": "hello"}
        await receiver.group_discard("viewers", first)
        await sender.group_send("viewers", {"type": "again"})
        assert await asyncio.wait_for(receiver.receive(second), 5) == {"type": "again"}
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(receiver.receive(first), 0.5)


async def test_publishes_are_not_reordered_under_a_burst():
    """Pipelined publishes (nothing waits for Redis's reply) still arrive in the order they were sent."""
    async with pair() as (sender, receiver):
        channel = await receiver.new_channel()
        for n in range(2000):
            await sender.send(channel, {"type": "terminal.output", "offset": n, "data": b"x" * 2048})
        got = [(await asyncio.wait_for(receiver.receive(channel), 5))["offset"] for _ in range(2000)]
        assert got == list(range(2000))


async def test_a_cancelled_receive_lets_go_of_its_channel_in_redis():
    """A consumer that ends (its receive cancelled) leaves no subscription behind in Redis."""
    receiver = make_layer()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        channel = await receiver.new_channel()
        assert client.pubsub_numsub(channel) == [(channel.encode(), 1)]
        receiving = asyncio.ensure_future(receiver.receive(channel))
        await asyncio.sleep(0.1)
        receiving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receiving
        for _ in range(50):
            if client.pubsub_numsub(channel) == [(channel.encode(), 0)]:
                break
            await asyncio.sleep(0.05)
        assert client.pubsub_numsub(channel) == [(channel.encode(), 0)]
    finally:
        client.close()
        await receiver.flush()


async def test_a_redis_restart_is_survived_sends_raise_while_it_is_away_and_subscriptions_come_back():
    server = RedisServer()
    server.start()
    sender, receiver = make_layer(server.url), make_layer(server.url)
    try:
        channel = await receiver.new_channel()
        await receiver.group_add("viewers", channel)
        await sender.send(channel, {"type": "before"})
        assert await asyncio.wait_for(receiver.receive(channel), 5) == {"type": "before"}
        server.stop()
        # A sender finds out: once its connection is seen gone, a send raises (the caller counts it and
        # the protocol's offsets recover what was lost), it never hangs.
        raised = None
        for _ in range(50):
            try:
                await asyncio.wait_for(sender.send(channel, {"type": "lost"}), 10)
            except (ConnectionError, OSError) as error:
                raised = error
                break
            await asyncio.sleep(0.1)
        assert raised is not None, "sends to a stopped Redis never raised"
        # A consumer connecting meanwhile is told so (in CONFIRM_SECONDS), not handed a channel nothing can reach.
        late = make_layer(server.url)
        with pytest.raises(ConnectionError, match="did not confirm"):
            await asyncio.wait_for(late.new_channel(), 15)
        await late.flush()
        server.start()  # the same port: Redis is back, empty
        # The receiver subscribes its channel and its group again by itself: its consumer, waiting all
        # along, gets what is sent once Redis is back.
        receiving = asyncio.ensure_future(receiver.receive(channel))
        for n in range(100):
            try:
                await sender.send(channel, {"type": "after", "n": n})
            except (ConnectionError, OSError):
                pass
            await asyncio.sleep(0.1)
            if receiving.done():
                break
        assert (await asyncio.wait_for(receiving, 1))["type"] == "after"

        async def a_group_message():
            while (message := await receiver.receive(channel))["type"] != "group":
                pass
            return message

        receiving = asyncio.ensure_future(a_group_message())
        for n in range(50):
            await sender.group_send("viewers", {"type": "group", "n": n})
            await asyncio.sleep(0.1)
            if receiving.done():
                break
        assert (await asyncio.wait_for(receiving, 1))["type"] == "group"
    finally:
        await sender.flush()
        await receiver.flush()
        server.stop()


@pytest.mark.exclusive  # counts every client of the shared Redis
def test_a_loop_made_for_one_call_closes_its_connections():
    """Synchronous code (a view, a signal after a commit) sends through async_to_sync from threads: each
    call's event loop closes its connections and drops its queues with it, so neither Redis's client
    count nor the layer's memory grows with the calls."""
    layer = make_layer()
    client = redis.Redis.from_url(REDIS_URL)

    def clients() -> int:
        return len(client.client_list())

    try:
        before = clients()

        def send_some():
            for n in range(20):
                async_to_sync(layer.group_send)("nobody", {"type": "hello", "n": n})

        thread = threading.Thread(target=send_some)
        thread.start()
        thread.join(60)
        assert clients() <= before + 1
        assert layer._layers == {}  # nothing kept for the 20 loops that have closed
    finally:
        client.close()


async def test_members_joining_one_group_at_once_share_its_confirmation_and_its_failure(monkeypatch):
    """Two viewers join one group while Redis cannot confirm it in time: both are told, neither is left
    believing it is in a group Redis does not deliver to; once Redis answers, joining works."""
    async with pair() as (sender, receiver):
        first, second = await receiver.new_channel(), await receiver.new_channel()
        monkeypatch.setattr(redis_wire, "CONFIRM_SECONDS", 0)
        results = await asyncio.gather(
            receiver.group_add("crowd", first), receiver.group_add("crowd", second), return_exceptions=True
        )
        assert [type(result) for result in results] == [ConnectionError, ConnectionError]
        monkeypatch.setattr(redis_wire, "CONFIRM_SECONDS", 5.0)
        await asyncio.gather(receiver.group_add("crowd", first), receiver.group_add("crowd", second))
        await sender.group_send("crowd", {"type": "hello"})
        assert await asyncio.wait_for(receiver.receive(first), 5) == {"type": "hello"}
        assert await asyncio.wait_for(receiver.receive(second), 5) == {"type": "hello"}


async def test_a_cancelled_new_channel_leaves_no_subscription_in_redis():
    layer = make_layer()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        kept = await layer.new_channel()  # the connection is up: the next subscribe is one write away
        asking = asyncio.ensure_future(layer.new_channel())
        await asyncio.sleep(0)
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        await asyncio.sleep(0.3)
        assert client.pubsub_channels(f"{PREFIX}*") == [kept.encode()]
    finally:
        client.close()
        await layer.flush()


def test_what_a_closing_loop_has_buffered_still_reaches_redis(monkeypatch):
    """A view's async_to_sync send returns once its bytes are buffered; when that call's loop closes, they
    are still sent, not thrown away (a small send buffer stands in for a slow link to Redis)."""
    connect = redis_wire._connect

    async def slow_link(url):
        reader, writer = await connect(url)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return reader, writer

    monkeypatch.setattr(redis_wire, "_connect", slow_link)
    layer = make_layer()
    client = redis.Redis.from_url(REDIS_URL)
    listener = client.pubsub()
    listener.subscribe(f"{PREFIX}slow")
    listener.get_message(timeout=2)  # the subscribe's confirmation
    try:

        def send_some():
            for n in range(5):
                async_to_sync(layer.send)(f"{PREFIX}slow", {"type": "big", "n": n, "data": b"z" * 200_000})

        thread = threading.Thread(target=send_some)
        thread.start()
        thread.join(60)
        got = []
        while (message := listener.get_message(timeout=5)) is not None:
            got.append(msgpack.unpackb(message["data"])["n"])
            if len(got) == 5:
                break
        assert got == [0, 1, 2, 3, 4]
    finally:
        listener.close()
        client.close()


@pytest.mark.parametrize("answers", ["one a second", "every publish (CLIENT REPLY refused)"])
async def test_a_redis_that_stops_answering_makes_publishes_raise_then_they_connect_again(monkeypatch, answers):
    """A Redis that stops answering (stopped, or its host gone without a reset) is found out: publishes
    raise once they have gone unanswered a while, instead of piling up unseen; after it answers again
    they go through. The same whether Redis answers one publish a second or, refusing CLIENT REPLY, each."""
    monkeypatch.setattr(redis_wire, "ANSWER_SECONDS", 1.0)
    server = RedisServer()
    server.start()
    url = server.url if answers == "one a second" else _restricted_user(server, "-client")
    sender, receiver = make_layer(url), make_layer(url)
    try:
        channel = await receiver.new_channel()
        await sender.send(channel, {"type": "before"})
        assert await asyncio.wait_for(receiver.receive(channel), 5) == {"type": "before"}
        server.process.send_signal(signal.SIGSTOP)
        raised = None
        for _ in range(40):
            try:
                await sender.send(channel, {"type": "unanswered"})
            except ConnectionError as error:
                raised = error
                break
            await asyncio.sleep(0.1)
        assert raised is not None and "not answered" in str(raised)
        server.process.send_signal(signal.SIGCONT)
        await sender.send(channel, {"type": "after"})
        seen = []
        async with asyncio.timeout(10):
            while not seen or seen[-1] != "after":
                seen.append((await receiver.receive(channel))["type"])
        assert seen[-1] == "after"
    finally:
        server.process.send_signal(signal.SIGCONT)
        await sender.flush()
        await receiver.flush()
        server.stop()


def test_options_it_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="symmetric_encryption_keys"):
        RedisPubSubLayer(hosts=[REDIS_URL], symmetric_encryption_keys=["secret"])
    with pytest.raises(ValueError, match="one host"):
        RedisPubSubLayer(hosts=[REDIS_URL, REDIS_URL])
    with pytest.raises(ValueError, match="ssl_cert_reqs"):
        RedisPubSubLayer(hosts=[{"address": REDIS_URL, "ssl_cert_reqs": None}])


async def test_a_password_and_a_unix_socket_work_as_redis_url_says(tmp_path):
    """Production Redis wants a password, and often listens on a unix socket: both, as REDIS_URL spells
    them, carry messages (and a wrong password is refused, never silently ignored)."""
    sock = tmp_path / "redis.sock"
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", str(sock)]
    server = subprocess.Popen(
        [*argv, "--requirepass", "s3cret", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if sock.exists():
                break
            await asyncio.sleep(0.05)
        for url in (f"redis://:s3cret@127.0.0.1:{port}/0", f"unix://:s3cret@{sock}?db=0"):
            async with pair(url) as (sender, receiver):
                channel = await receiver.new_channel()
                await sender.send(channel, {"type": "hello", "via": url.split(":")[0]})
                assert await asyncio.wait_for(receiver.receive(channel), 5) == {
                    "type": "hello",
                    "via": url.split(":")[0],
                }
        wrong = make_layer(f"redis://:wrong@127.0.0.1:{port}/0")
        with pytest.raises(ConnectionError):
            await wrong.send(f"{PREFIX}nobody", {"type": "hello"})
        await wrong.flush()
    finally:
        server.kill()
        server.wait()


def _certificates(directory) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 signed by it (files: ca, cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def made(subject, issuer, key, signer, *extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = made(
        "tether test CA", "tether test CA", ca_key, ca_key, (x509.BasicConstraints(ca=True, path_length=None), True)
    )
    alt = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = made("127.0.0.1", "tether test CA", server_key, ca_key, (alt, False))
    paths = [directory / name for name in ("ca.crt", "server.crt", "server.key")]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return tuple(str(path) for path in paths)


async def test_tls_carries_messages_with_the_ca_the_url_names_and_refuses_a_certificate_it_cannot_trust(
    tmp_path, monkeypatch
):
    """rediss:// verifies Redis's certificate: with the CA the URL names, messages flow; without it the
    subscribe fails and says why (the certificate), never falls back to an unverified connection."""
    ca, cert, key = _certificates(tmp_path)
    port = free_port()
    argv = ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", ""]
    server = subprocess.Popen(
        [*argv, "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        async with pair(url) as (sender, receiver):
            channel = await receiver.new_channel()
            await sender.send(channel, {"type": "over tls"})
            assert await asyncio.wait_for(receiver.receive(channel), 5) == {"type": "over tls"}
        monkeypatch.setattr(redis_wire, "CONFIRM_SECONDS", 1.0)
        untrusted = make_layer(f"rediss://127.0.0.1:{port}/0")
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusted.new_channel()
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusted.send(f"{PREFIX}nobody", {"type": "hello"})
        await untrusted.flush()
    finally:
        server.kill()
        server.wait()


def _net_out(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return client.info("stats")["total_net_output_bytes"]
    finally:
        client.close()


def _restricted_user(server: RedisServer, *rules: str) -> str:
    """An ACL user on ``server`` with ``rules`` on top of every command, key and channel; its URL."""
    client = redis.Redis.from_url(server.url)
    try:
        client.execute_command("ACL", "SETUSER", "tether", "on", ">pw", "~*", "&*", "+@all", *rules)
    finally:
        client.close()
    return f"redis://tether:pw@127.0.0.1:{server.port}/0"


async def test_redis_answers_one_publish_a_second_not_every_one():
    """Reading Redis's answer to each publish woke the publisher once more per keystroke: Redis is asked
    to answer one a second. A thousand publishes to a channel nobody holds come back as a few answers,
    where each would have been one (``:0``); where Redis refuses ``CLIENT REPLY`` (an ACL without
    ``CLIENT``), every publish is answered as before and still goes through. An ACL without PING (which
    the check at connect sends) does not change that."""
    server = RedisServer()
    server.start()
    try:
        for rules, quiet in (((), True), (("-client",), False), (("-ping",), True)):
            url = _restricted_user(server, "resetpass", ">pw", "+@all", *rules) if rules else server.url
            layer = make_layer(url)
            try:
                await layer.send(f"{PREFIX}nobody", {"type": "first"})  # connected, and the first answered
                await asyncio.sleep(0.2)
                info = -_net_out(server) + (before := _net_out(server))  # what an INFO answer itself costs
                for n in range(1000):
                    await layer.send(f"{PREFIX}nobody", {"type": "hello", "n": n})
                await asyncio.sleep(0.3)
                answered = _net_out(server) - before - info
                publisher = layer._layer().publisher
                assert publisher.quiet is quiet
                assert publisher.sent == publisher.answered  # every answer asked for came
                if quiet:
                    assert answered < 100, answered  # a probe's, not 4,000 bytes
                else:
                    assert answered >= 4000, answered
                receiver = make_layer(url)
                channel = await receiver.new_channel()
                await layer.send(channel, {"type": "through"})
                assert await asyncio.wait_for(receiver.receive(channel), 5) == {"type": "through"}
                await receiver.flush()
            finally:
                await layer.flush()
    finally:
        server.stop()


async def test_a_refused_publish_is_still_logged_within_a_second(caplog):
    """Answers off, a publish the ACL refuses is not answered at once; the next answered one (a second
    later at most) is, and says so at ERROR."""
    server = RedisServer()
    server.start()
    try:
        layer = make_layer(_restricted_user(server, "resetchannels", f"&{PREFIX}allowed*"))
        try:
            await layer.send(f"{PREFIX}allowed", {"type": "first"})
            await layer.send(f"{PREFIX}forbidden", {"type": "unanswered"})
            await asyncio.sleep(0.3)
            assert "Redis refused a publish" not in caplog.text
            await asyncio.sleep(redis_wire.PROBE_SECONDS)
            await layer.send(f"{PREFIX}forbidden", {"type": "answered"})
            for _ in range(50):
                if "Redis refused a publish" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert "Redis refused a publish" in caplog.text and "NOPERM" in caplog.text
        finally:
            await layer.flush()
    finally:
        server.stop()
