"""/healthz and /readyz, as a balancer and a supervisor see them from a real daphne."""

from __future__ import annotations

import json

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
