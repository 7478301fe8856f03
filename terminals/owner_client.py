"""The one client of the owner worker's messages: where a session's process is held, and what to send it.

The WebSocket consumer, the demo's console viewer, the tests and the benchmarks all speak to a worker
through this, so the worker's side of the protocol has one caller to keep in step with.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import BooleanField, ExpressionWrapper

from terminals import metrics
from terminals.models import ProcessLease, TerminalSession, WorkerState, lease_expired
from terminals.protocol import Ack, Attach, Detach, Input, Keepalive, Observe, Resend, ResetShell, Resize, ToOwner


@dataclass(frozen=True)
class Owner:
    """The worker holding a session's started process: its channel, the stream (lease token) it serves, and
    where its direct link is dialled (``link``: none, Redis carries everything)."""

    channel: str
    token: int
    execution: int
    worker_id: str = ""
    link: str = ""

    def route_on(self, layer) -> None:
        """Messages to this worker's channel go over its link, where the layer makes links (transport/links.py)."""
        if self.link and (route := getattr(layer, "route", None)) is not None:
            route(self.channel, self.link, self.worker_id)


def _unreleased_started_lease(execution_pk: int, *, with_machine: bool = False):
    """The execution's unreleased lease for a started process (its handle set), with whether it has expired
    on the database clock: one read for both questions a viewer asks (who answers, or why nobody does: that
    sentence names the machine's host, ``with_machine``)."""
    related = ("worker", "execution__machine") if with_machine else ("worker",)
    return (
        ProcessLease.objects.select_related(*related)
        .filter(execution_id=execution_pk, released_at__isnull=True)
        .exclude(handle={})
        .annotate(expired=ExpressionWrapper(lease_expired(), output_field=BooleanField()))
        .first()
    )


def _owner(lease) -> Owner | None:
    """Only a worker that holds a started process can attach a viewer: one still launching it (its lease's
    handle says how far it got) would refuse, so a viewer waits as for a shell that is starting. A worker
    that stopped beating (its lease expired) or stopped would never answer."""
    if lease is None or lease.worker is None or lease.expired or not lease.handle.started:
        return None
    if lease.worker.state == WorkerState.STOPPED:
        return None
    worker = lease.worker
    return Owner(worker.channel_name, lease.token, lease.execution_id, worker.worker_id, worker.link)


def _lost(lease) -> str:
    """Why nobody answers for a started process whose lease has expired (its worker stopped beating), in
    words for the page; "" when that is not the case."""
    if lease is None or lease.worker is None or not lease.expired:
        return ""
    host = lease.execution.machine.host
    then = "a worker on " + host if host else "another worker"
    return (
        f"The worker holding this shell (on {lease.worker.host}) stopped answering. Waiting for {then} to take "
        "it over; if the shell did not survive, its outcome is recorded as unknown for an operator."
    )


def owner_of_execution(execution_pk: int) -> Owner | None:
    return _owner(_unreleased_started_lease(execution_pk))


def owner_or_lost(execution_pk: int) -> tuple[Owner | None, str]:
    """Who answers for the execution's process, or, when nobody does because its worker stopped beating,
    why (for the page): both from one read of its lease."""
    lease = _unreleased_started_lease(execution_pk, with_machine=True)
    return _owner(lease), _lost(lease)


def owner_of_session(session_pk) -> Owner | None:
    execution_pk = TerminalSession.objects.filter(pk=session_pk).values_list("execution_id", flat=True).first()
    return owner_of_execution(execution_pk) if execution_pk else None


class OwnerClient:
    """One viewer's messages to the owner it is attached to (``owner``, None until one is found)."""

    def __init__(self, layer, reply: str, viewer: str):
        self.layer, self.reply, self.viewer = layer, reply, viewer
        self.owner: Owner | None = None

    async def _send(self, kind: type[ToOwner], **fields) -> None:
        if self.owner is None:
            return
        message = kind(execution=self.owner.execution, viewer=self.viewer, reply=self.reply, **fields)
        try:
            await self.layer.send(self.owner.channel, message.encode())
        except Exception:
            metrics.LAYER_ERRORS.labels("viewer_to_worker").inc()
            raise

    def _to(self, owner: Owner) -> None:
        self.owner = owner
        owner.route_on(self.layer)

    async def attach(self, owner: Owner, **fields) -> None:
        """Ask ``owner`` to make this viewer its session's viewer (see protocol.Attach for the fields)."""
        self._to(owner)
        await self._send(Attach, **fields)

    async def observe(self, owner: Owner, **fields) -> None:
        """Ask ``owner`` to let this viewer watch its session read-only (see protocol.Observe)."""
        self._to(owner)
        await self._send(Observe, **fields)

    async def input(self, data: bytes, seq: int) -> None:
        await self._send(Input, data=data, seq=seq)

    async def resize(self, cols: int, rows: int) -> None:
        await self._send(Resize, cols=cols, rows=rows)

    async def ack(self, offset: int) -> None:
        await self._send(Ack, offset=offset)

    async def resend(self, since: int) -> None:
        await self._send(Resend, since=since)

    async def keepalive(self, observing: bool = False) -> None:
        await self._send(Keepalive, observing=observing)

    async def reset(self) -> None:
        await self._send(ResetShell)

    async def detach(self) -> None:
        await self._send(Detach)
