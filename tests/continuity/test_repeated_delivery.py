"""The channel layer delivers at least once: a message repeated after a Redis hiccup must do no harm.

channels-redis keeps a popped message in a backup queue until it is handled and
puts it back when the receive was cut short, so after a Redis restart a message
can arrive twice. These tests deliver real messages twice on purpose, through
real Redis, to a real owner worker and to the real consumer.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.urls import path
from django.utils.module_loading import import_string

from terminals.consumers import TerminalConsumer
from terminals.owner_client import Owner, owner_of_session
from terminals.protocol import Attach, Input
from tests.bridge.harness import REDIS_URL, Stack

pytestmark = [pytest.mark.continuity, pytest.mark.django_db(transaction=True)]


def layer_config(stack: Stack, redis_url: str) -> dict:
    """The channel layer the stack's processes use (TETHER_CHANNEL_LAYER), for this process to speak on."""
    if settings.TETHER_CHANNEL_LAYER == "pubsub":
        return {
            "BACKEND": "transport.redis_layer.RedisPubSubLayer",
            "CONFIG": {"hosts": [redis_url], "prefix": stack.prefix},
        }
    if settings.TETHER_CHANNEL_LAYER == "channels-pubsub":
        return {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": redis_url}], "prefix": stack.prefix},
        }
    return {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": redis_url, "socket_timeout": 15}], "prefix": stack.prefix},
    }


def layer_for(stack: Stack):
    config = layer_config(stack, stack.redis_url)
    return import_string(config["BACKEND"])(**config["CONFIG"])


async def held_by_worker(session) -> Owner:
    """The owner worker, once it holds the session's started process (found as every viewer finds it)."""
    for _ in range(300):
        if owner := await sync_to_async(owner_of_session)(session.pk):
            return owner
        await asyncio.sleep(0.1)
    raise AssertionError("the worker never took the session")


async def collect(layer, channel: str, until: bytes, timeout: float = 15) -> tuple[bytes, list[dict]]:
    output, messages = bytearray(), []
    async with asyncio.timeout(timeout):
        while until not in output:
            message = await layer.receive(channel)
            messages.append(message)
            if message["type"] == "terminal.output":
                output += message["data"]
    return bytes(output), messages


async def test_worker_answers_a_repeated_attach_once_and_writes_repeated_input_once(stack, terminal, operator):
    session, _cookie = await sync_to_async(terminal)(operator)
    owner = await held_by_worker(session)
    worker_channel = owner.channel
    layer = layer_for(stack)
    reply = await layer.new_channel()
    base = {"execution": owner.execution, "viewer": "repeat-test", "reply": reply}
    for attach_id in range(1, 50):  # like the consumer: the worker may refuse until it has registered the process
        attach = Attach(**base, attach=attach_id, since=0, generation=session.generation).encode()
        await layer.send(worker_channel, attach)
        answer = await asyncio.wait_for(layer.receive(reply), 10)
        if answer["type"] == "terminal.attached":
            break
        assert answer.get("code") == "attach_refused", answer
        await asyncio.sleep(0.2)
    await layer.send(worker_channel, attach)  # the same attach again, as a restored backup would deliver it
    typed = Input(**base, seq=1, data=b"echo ran-$((40+2))\r").encode()
    await layer.send(worker_channel, typed)
    await layer.send(worker_channel, typed)  # the same message delivered twice
    await layer.send(worker_channel, Input(**base, seq=2, data=b"echo end-$((1+1))\r").encode())

    output, messages = await collect(layer, reply, until=b"end-2\r\n")

    assert [m["type"] for m in messages].count("terminal.attached") == 0  # answered once, above
    assert output.count(b"ran-42\r\n") == 1, output  # the command ran once: the repeated input was dropped
    if hasattr(layer, "flush"):
        await layer.flush()


async def _attached(layer, worker_channel: str, message: dict, reply: str) -> dict:
    """Send an attach until the worker answers something other than "not registered yet"."""
    for attach_id in range(1, 50):
        await layer.send(worker_channel, {**message, "attach": attach_id})
        answer = await asyncio.wait_for(layer.receive(reply), 10)
        if answer.get("code") != "attach_refused":
            return answer
        await asyncio.sleep(0.2)
    raise AssertionError("the worker never registered the process")


async def test_a_socket_following_its_session_yields_to_a_window_attached_first(stack, terminal, operator):
    """After a worker change, a window's socket follows its session to the new owner by itself. A window a
    person opened meanwhile and attached first keeps the shell: the follower is refused (superseded) and
    takes nothing over. In CI (stop 49) the follower's late attach superseded the new window."""
    session, _cookie = await sync_to_async(terminal)(operator)
    owner = await held_by_worker(session)
    layer = layer_for(stack)
    opened, follower = await layer.new_channel(), await layer.new_channel()
    fresh = {"execution": owner.execution, "viewer": "opened-now", "reply": opened}
    old = {"execution": owner.execution, "viewer": "following", "reply": follower}
    attach = {"since": 0, "generation": session.generation, "cols": 80, "rows": 24}
    answer = await _attached(layer, owner.channel, Attach(**fresh, **attach).encode(), opened)
    assert answer["type"] == "terminal.attached", answer

    answer = await _attached(layer, owner.channel, Attach(**old, **attach, follow=True).encode(), follower)
    assert (answer["type"], answer.get("code")) == ("terminal.error", "superseded"), answer
    await layer.send(owner.channel, Input(**fresh, seq=1, data=b"echo kept-$((40+2))\r").encode())
    _, messages = await collect(layer, opened, until=b"kept-42\r\n")
    assert "terminal.superseded" not in [m["type"] for m in messages], messages

    # A person's own attach (no follow) still takes the shell over, and the other window is told.
    answer = await _attached(layer, owner.channel, Attach(**old, **attach).encode(), follower)
    assert answer["type"] == "terminal.attached", answer
    told = await asyncio.wait_for(layer.receive(opened), 10)
    while told["type"] != "terminal.superseded":
        told = await asyncio.wait_for(layer.receive(opened), 10)
    if hasattr(layer, "flush"):
        await layer.flush()


class RecordingConsumer(TerminalConsumer):
    """The real consumer, remembered so the test can deliver a message to its channel a second time."""

    instances: list[RecordingConsumer] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.delivered: list[dict] = []
        RecordingConsumer.instances.append(self)

    async def terminal_attached(self, event: dict) -> None:
        self.delivered.append(event)
        await super().terminal_attached(event)


async def test_consumer_ignores_a_repeated_attached_and_the_stream_never_rewinds(terminal, operator, settings):
    stack = Stack()
    settings.CHANNEL_LAYERS = {"default": layer_config(stack, REDIS_URL)}
    try:
        await sync_to_async(stack.start_worker)("local")
        session, _cookie = await sync_to_async(terminal)(operator)
        await held_by_worker(session)
        router = URLRouter([path("ws/terminals/<uuid:session>/", RecordingConsumer.as_asgi())])

        async def app(scope, receive, send):
            return await router({**scope, "user": operator}, receive, send)

        browser = WebsocketCommunicator(app, f"/ws/terminals/{session.id}/")
        assert (await browser.connect())[0]
        await browser.receive_json_from(5)  # hello
        await browser.send_json_to({"type": "attach", "since": 0, "cols": 80, "rows": 24})
        output = bytearray()
        while (await browser.receive_json_from(15))["type"] != "attached":
            pass  # hello, and perhaps an attach_refused while the worker registers the process

        async def read_until(marker: bytes) -> None:
            async with asyncio.timeout(15):
                while marker not in output:
                    frame = await browser.receive_output(15)
                    if frame.get("bytes"):
                        output.extend(frame["bytes"])

        await browser.send_to(bytes_data=b"echo one-$((1+1))\r")
        await read_until(b"one-2\r\n")
        consumer = RecordingConsumer.instances[-1]
        first_attached = consumer.delivered[0]
        await consumer.channel_layer.send(consumer.channel_name, first_attached)  # delivered again
        await browser.send_to(bytes_data=b"echo two-$((1+2))\r")
        await read_until(b"two-3\r\n")

        # A rewound cursor would have replayed everything from offset 0 a second time.
        assert output.count(b"one-2\r\n") == 1, bytes(output)
        assert len(consumer.delivered) == 2
        await browser.disconnect()
    finally:
        await sync_to_async(stack.stop)()
