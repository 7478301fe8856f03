"""Structured logs: one JSON object a line, carrying the ids that let a query follow one session across the
daphne that serves its page and the worker that holds its shell."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from config.logs import JsonFormatter, bound
from tests.bridge.harness import Stack, Viewer

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def test_a_line_is_one_json_object_with_the_ids_of_its_context():
    formatter = JsonFormatter(host="h1")
    record = logging.LogRecord("terminals.x", logging.WARNING, __file__, 1, 'session %s: "odd"\nline', ("s-1",), None)
    with bound(session="s-1", user="alice"):
        line = json.loads(formatter.format(record))
    assert line["message"] == 'session s-1: "odd"\nline' and line["level"] == "WARNING" and line["host"] == "h1"
    assert (line["session"], line["user"]) == ("s-1", "alice")
    assert "session" not in json.loads(formatter.format(record))  # the block's ids end with it


def _lines(path: Path) -> list[dict]:
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON, or this fails


async def test_one_session_can_be_followed_across_daphne_and_its_worker(terminal, operator):
    stack = Stack(extra_env={"TETHER_LOG_FORMAT": "json"})
    try:
        await sync_to_async(stack.start)("local")
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        await viewer.type("exit 3\r")
        await viewer.wait_for("exit")
        await viewer.wait_closed()
    finally:
        await sync_to_async(stack.stop)()
    logs = sorted(stack.log_dir.glob(f"{stack.prefix}-*.log"))
    daphne = [line for path in logs if "daphne" in path.name for line in _lines(path)]
    worker = [line for path in logs if "worker" in path.name for line in _lines(path)]
    sid = str(session.id)
    ours = [line for line in daphne if line.get("session") == sid]
    assert any("connected to session" in line["message"] and line["user"] == "operator" for line in ours)
    held = [line for line in worker if line.get("session") == sid]
    assert any("running on" in line["message"] for line in held), worker
    settled = [line for line in held if "completed: Exited with code 3" in line["message"]]
    assert settled and settled[0]["execution"] == str(session.execution_id) and settled[0]["worker"]
    assert {line["pid"] for line in ours}.isdisjoint({line["pid"] for line in held})  # two processes, one query
    # daphne's access log is JSON lines too, in the same stream (config/redact.py)
    assert any(
        line["logger"] == "daphne.access" and f"WSCONNECTING /ws/terminals/{sid}/" in line["message"] for line in daphne
    )
