"""The owner worker's watch over the lifetimes of what it holds (terminals/lifetimes.py judges them): the
viewer warned before an idle or deadline close, what is past its limits ended by the session host, and
observers whose consumer went without a word forgotten."""

from __future__ import annotations

import time

from terminals.lifetimes import CHECK_SECONDS, Act, judge
from terminals.owner.context import WorkerContext, every
from terminals.owner.host import SessionHost
from terminals.owner.leases import LeaseKeeper
from terminals.owner.live import LiveProcess
from terminals.owner.outbox import Outbox
from terminals.protocol import ClosingSoon, Reason


class LifetimeWatch:
    """``host`` ends what is past its limits."""

    def __init__(self, context: WorkerContext, leases: LeaseKeeper, outbox: Outbox, host: SessionHost):
        self.context, self.leases, self.outbox, self.host = context, leases, outbox, host

    async def run(self) -> None:
        async def check() -> None:
            self.check()

        await every(CHECK_SECONDS, check, "lifetime check")

    def check(self) -> None:
        """Warn the viewer before an idle or deadline close; close what is past its limits."""
        now = time.monotonic()
        for live in list(self.context.live.values()):
            if live.closing:
                continue
            self._forget_silent_observers(live, now)
            live.update_flow()  # a departed viewer's grace period may have run out
            verdict = judge(
                live.limits,
                now=now,
                started=live.started,
                last_activity=live.last_activity,
                produced=live.buffer.end,
                interactive=live.session_id is not None,
            )
            if verdict is None:
                continue
            if verdict.action is Act.CLOSE:
                self.context.tasks.start(self.host.end(live, Reason(verdict.reason)))
            elif live.viewer and live.warned != verdict.reason:
                live.warned = verdict.reason
                warning = ClosingSoon(Reason(verdict.reason), verdict.seconds_left, live.token)
                self.context.tasks.start(self.outbox.to_viewer(live, warning))

    def _forget_silent_observers(self, live: LiveProcess, now: float) -> None:
        """An observer whose consumer went without a word (its daphne died) stops being listed as watching. Not
        while the leases are unconfirmed: this worker drops every message then, keep-alives too. One forgotten
        by mistake is told at its next keep-alive, and observes again."""
        if now > self.leases.fresh_until:
            return
        silent = 3 * self.context.config.viewer_check_seconds  # three keep-alives missed
        gone = [key for key, observer in live.observers.items() if now - observer.seen > silent]
        for key in gone:
            del live.observers[key]
        if gone:
            self.context.tasks.start(self.outbox.watchers(live))
