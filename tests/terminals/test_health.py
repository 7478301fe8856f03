"""/healthz and /readyz, as a balancer and a supervisor see them from a real daphne."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bridge.harness import RedisServer, Stack, http_get

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def test_ready_while_postgresql_and_redis_answer_and_not_once_redis_is_gone():
    redis = RedisServer()
    redis.start()
    stack = Stack(redis_url=redis.url)
    try:
        port = stack.start_daphne()
        status, _, body = http_get(port, "/healthz", "")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        status, headers, body = http_get(port, "/readyz", "")
        ready = json.loads(body)
        assert status == 200 and ready["status"] == "ready", ready
        assert ready["checks"]["database"].startswith("ok") and ready["checks"]["channel_layer"].startswith("ok")
        assert "no-cache" in headers.get("Cache-Control", "")
        redis.stop()
        status, _, body = http_get(port, "/readyz", "")
        down = json.loads(body)
        assert status == 503 and down["status"] == "not ready"
        assert down["checks"]["channel_layer"].startswith("failing") and down["checks"]["database"].startswith("ok")
        assert http_get(port, "/healthz", "")[0] == 200  # up, though not ready: the supervisor keeps it
    finally:
        stack.stop()
        redis.stop()


@pytest.mark.parametrize("loop", ["", "asyncio"])
def test_the_web_process_serves_on_uvloop_unless_told_asyncio(loop):
    """uvloop took a ninth of daphne's CPU per keystroke off (docs/benchmarks.md); asyncio's loop stays a choice."""
    stack = Stack()
    stack.extra_env["TETHER_WEB_LOOP"] = loop
    try:
        port = stack.start_daphne()
        assert http_get(port, "/healthz", "")[0] == 200
        maps = Path(f"/proc/{stack.daphnes[0].pid}/maps").read_text()
        assert ("uvloop" in maps) == (loop != "asyncio")
    finally:
        stack.stop()
