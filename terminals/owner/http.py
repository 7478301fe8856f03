"""A worker's own small HTTP server (``terminal_worker --http HOST:PORT``, or ``TETHER_WORKER_HTTP``) for its
supervisor and Prometheus: ``/healthz`` (the event loop answers), ``/readyz`` (its database, channel layer,
heartbeat and backends work, and it is not draining) and ``/metrics``. GET only, one small request a
connection, nothing else served; metrics as on the web processes (loopback, or the bearer token)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from http import HTTPStatus

from channels.db import database_sync_to_async as db

from executions.models import Backend
from terminals import health, metrics
from terminals.owner.context import WorkerContext
from terminals.owner.leases import LeaseKeeper

log = logging.getLogger(__name__)

REQUEST_LIMIT = 8 * 1024
READ_SECONDS = 5.0
CONNECTIONS_AT_ONCE = 16  # more are closed at once: the worker's descriptors are for its shells
READY_CACHE_SECONDS = 1.0  # /readyz asks the database, Redis and docker at most this often


def _docker() -> None:
    import docker

    docker.from_env(timeout=2).ping()


async def _backend(kind: str) -> None:
    if kind == Backend.DOCKER:
        await asyncio.to_thread(_docker)
    elif kind == Backend.TMUX and not shutil.which("tmux"):
        raise FileNotFoundError("tmux")


class WorkerHttp:
    def __init__(self, context: WorkerContext, leases: LeaseKeeper, address: str):
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]") or "127.0.0.1", int(port)
        self.context = context
        self.leases = leases
        self.open = 0
        self.said: tuple[float, bool, dict[str, str]] | None = None  # the last readiness, and when

    async def run(self) -> None:
        server = await asyncio.start_server(self._serve, self.host, self.port, limit=REQUEST_LIMIT)
        log.info("worker http on %s:%s (/healthz /readyz /metrics)", self.host, self.port)
        async with server:
            await server.serve_forever()

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        if self.said is not None and time.monotonic() - self.said[0] < READY_CACHE_SECONDS:
            return self.said[1], self.said[2]
        ready, checks = await self._check()
        self.said = (time.monotonic(), ready, checks)
        return ready, checks

    async def _check(self) -> tuple[bool, dict[str, str]]:
        checks = {
            "database": await health.timed(db(health.database_check)),
            "channel_layer": await health.timed(health.channel_layer_check),
        }
        fresh = time.monotonic() <= self.leases.fresh_until
        checks["heartbeat"] = "ok" if fresh else "failing: no heartbeat within the lease TTL"
        for kind in sorted(self.context.backends):
            checks[f"backend_{kind}"] = await health.timed(lambda kind=kind: _backend(kind))
        if self.context.draining:
            checks["state"] = "failing: draining"
        return all(value.startswith("ok") for value in checks.values()), checks

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= CONNECTIONS_AT_ONCE:
            writer.close()
            return
        self.open += 1
        try:
            await self._answer_one(reader, writer)
        finally:
            self.open -= 1

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_SECONDS)
            status, kind, body = await self._answer(head, writer.get_extra_info("peername"))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            status, kind, body = 400, "text/plain", b"bad request\n"
        try:
            writer.write(
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, head: bytes, peer) -> tuple[int, str, bytes]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, "text/plain", b"bad request\n"
        method, path = parts[0], parts[1].split("?", 1)[0]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if method != "GET":
            return 405, "text/plain", b"GET only\n"
        if path == "/healthz":
            return 200, "application/json", b'{"status": "ok"}'
        if path == "/readyz":
            ready, checks = await self.readiness()
            said = {"status": "ready" if ready else "not ready", "checks": checks}
            return (200 if ready else 503), "application/json", json.dumps(said).encode()
        if path == "/metrics":
            remote = "" if "x-forwarded-for" in headers else (peer[0] if peer else "")
            if not metrics.allowed(remote, headers.get("authorization", "")):
                return 403, "text/plain", b"metrics are for loopback or a bearer TETHER_METRICS_TOKEN\n"
            return 200, metrics.CONTENT_TYPE, await asyncio.to_thread(metrics.exposition)
        return 404, "text/plain", b"not found\n"
