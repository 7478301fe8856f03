"""A rolling restart of every worker kills no shell: docker and local shells are kept by their session
holders and tmux ones by their server, each worker is stopped (SIGTERM) and replaced in turn, and every
open page is re-attached to the same shell by itself."""

from __future__ import annotations

import asyncio
import signal

import pytest
from asgiref.sync import sync_to_async
from websockets.exceptions import ConnectionClosed

from executions.models import Evidence, ExecutionEvent, State
from terminals import actions as terminal_actions
from terminals.models import ProcessLease
from terminals.protocol import CloseCode
from tests.bridge.harness import Stack, Viewer, session_cookie

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

BACKENDS = ["docker", "docker", "local", "local", "tmux"]


def _holders(execution_pks: list[int]) -> dict[int, int]:
    """execution -> the pid of the worker holding its lease now."""
    leases = ProcessLease.objects.filter(execution_id__in=execution_pks, released_at__isnull=True).select_related(
        "worker"
    )
    return {lease.execution_id: lease.worker.pid for lease in leases}


def _adopted(execution_pks: list[int]) -> set[int]:
    events = ExecutionEvent.objects.filter(execution_id__in=execution_pks, evidence=Evidence.ADOPTED)
    return set(events.values_list("execution_id", flat=True))


def _open(place, user, backend: str, n: int):
    session, _ = terminal_actions.open_terminal(place(backend, f"roll-{backend}-{n}"), user)
    return session, session_cookie(user)


async def _as_a_page_would(viewer: Viewer, stack: Stack, opened, attaches_before: int) -> Viewer:
    """The page's side of a worker's stop: its socket is re-attached by the server where it is (a new
    ``attached``), or closed with a code the page retries (4014: the worker let go), and the page then
    reconnects from its own offset, generation and epoch. Either way it ends up attached to its shell."""
    session, cookie = opened
    for _ in range(300):
        if sum(m["type"] == "attached" for m in viewer.messages) > attaches_before:
            return viewer
        try:
            await viewer.read_for(0.1)
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            assert code == CloseCode.SERVER_RESTART, (code, viewer.messages[-3:])
            last = [m for m in viewer.messages if m["type"] == "attached"][-1]
            again = await Viewer.open(stack.ports[0], session.id, cookie)
            again.output, again.offset = viewer.output, viewer.offset
            attached = await again.attach(since=viewer.offset, generation=last["generation"], epoch=last["epoch"])
            assert attached["generation"] == last["generation"] and attached["lost"] == 0, attached
            return again
    raise AssertionError(f"the page was never attached again: {viewer.messages[-5:]}")


async def test_restarting_every_worker_in_turn_keeps_every_shell_and_every_page(place, operator, settings):
    settings.TETHER_SESSIONS_PER_USER = len(BACKENDS)
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1", "TETHER_VIEWER_CHECK_SECONDS": "1"}
    stack.extra_env["TETHER_SESSIONS_PER_USER"] = str(len(BACKENDS))
    try:
        await sync_to_async(stack.start_daphne)()
        workers = [await sync_to_async(stack.start_worker)() for _ in range(2)]
        opened = [await sync_to_async(_open)(place, operator, backend, n) for n, backend in enumerate(BACKENDS)]
        viewers, pids = [], []
        for session, cookie in opened:
            viewer = await Viewer.open(stack.ports[0], session.id, cookie)
            await viewer.attach()
            await viewer.type("echo shell-$$-here\r")
            pids.append((await viewer.read_match(rb"shell-(\d+)-here\r\n", timeout=30)).group(1))
            viewers.append(viewer)
        executions = [session.execution_id for session, _ in opened]
        attaches = [sum(m["type"] == "attached" for m in viewer.messages) for viewer in viewers]

        for round_, old in enumerate(list(workers)):
            moving = {pk for pk, pid in (await sync_to_async(_holders)(executions)).items() if pid == old.pid}
            old.send_signal(signal.SIGTERM)
            assert await sync_to_async(old.wait)(timeout=30) == 0
            workers.remove(old)
            workers.append(await sync_to_async(stack.start_worker)())
            # Every shell the stopped worker held is adopted by a live one.
            live = {worker.pid for worker in workers}
            for _ in range(300):
                holders = await sync_to_async(_holders)(executions)
                if len(holders) == len(executions) and set(holders.values()) <= live:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"round {round_}: not every shell was adopted: {holders}, live {live}")
            for n in [n for n, pk in enumerate(executions) if pk in moving]:
                viewers[n] = await _as_a_page_would(viewers[n], stack, opened[n], attaches[n])
                attaches[n] = sum(m["type"] == "attached" for m in viewers[n].messages)

        # Each shell was held by one of the first two workers, both restarted: each was adopted at least once.
        assert await sync_to_async(_adopted)(executions) == set(executions)
        for viewer, pid, backend in zip(viewers, pids, BACKENDS, strict=True):
            await viewer.type("echo shell-$$-again\r")
            again = await viewer.read_match(rb"shell-(\d+)-again\r\n", timeout=30)
            assert again.group(1) == pid, backend
        for session, _ in opened:
            execution = await sync_to_async(type(session).objects.get)(pk=session.pk)
            assert (await sync_to_async(lambda e=execution: e.execution.state)()) == State.RUNNING
        for viewer in viewers:
            await viewer.close()
    finally:
        await sync_to_async(stack.stop)()
