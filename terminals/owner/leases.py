"""The lease keeper: extends this worker's leases, and is the one judge of whether they still stand.

A lease is extended only under the token the worker was given for it. After a stall longer than a lease
provably lasts (SIGSTOP, a frozen VM, a database outage) another worker may have taken it: until a
heartbeat confirms the leases again, nothing acts on a session, so two owners never act on one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from channels.db import database_sync_to_async as db

from terminals import actions, metrics
from terminals.owner.context import WorkerContext, every

log = logging.getLogger(__name__)

# Told after each heartbeat: the worker's state, and {execution pk: (token, requested action)} still held.
OnBeat = Callable[[str, dict[int, tuple[int, str]]], Awaitable[None]]


class LeaseKeeper:
    def __init__(self, context: WorkerContext, on_beat: OnBeat):
        self.context = context
        self.on_beat = on_beat
        # {execution id: token} for every lease this worker was given (claimed, adopted, watched).
        self.tokens: dict[int, int] = {}
        self.fresh_until = 0.0  # monotonic time until which every lease held is provably ours

    def give(self, execution_pk: int, token: int) -> None:
        self.tokens[execution_pk] = token

    def holds(self, execution_pk: int, token: int) -> bool:
        return self.tokens.get(execution_pk) == token

    async def beat(self) -> None:
        began = time.monotonic()
        given = dict(self.tokens)
        state, held = await db(actions.worker_heartbeat)(self.context.worker, given)
        metrics.beat_done(time.monotonic() - began)
        for pk, token in given.items():  # released, or claimed by another worker: nothing left to extend
            if pk not in held and self.tokens.get(pk) == token:
                del self.tokens[pk]
        # Until then our leases provably stand: no other worker may claim them before they expire.
        self.fresh_until = began + self.context.config.lease_ttl_seconds
        await self.on_beat(state, held)

    async def confirmed(self) -> bool:
        """Whether the leases provably stand now, beating once when that is no longer known."""
        if time.monotonic() <= self.fresh_until:
            return True
        try:
            await self.beat()
        except Exception as error:  # the database is away: vouch for nothing
            log.warning("cannot confirm leases (%r)", error)
            return False
        return True

    async def run(self) -> None:
        # While PostgreSQL is away the beats fail; once the leases are stale, output waits (``confirmed``).
        await every(self.context.config.heartbeat_seconds, self.beat, "heartbeat")
