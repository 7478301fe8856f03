"""Churn across hosts: sessions opened on two simulated hosts (tests/hosts/harness.py: each a UTS + PID
namespace with a daphne and a worker), viewed through HAProxy, typed into and closed, in parallel lanes,
many times over. Afterwards nothing may be left: shells, tmux sessions, Redis subscriptions or keys, lease
rows unreleased, sessions not closed.

    make bench BENCH_ARGS="--only churn_hosts --full"     # 10,000 sessions (about half an hour here)
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async

from bench.common import Figure, unique
from bench.scale import _redis_counts, _tmux_server, _tmux_sessions
from bench.sessions import close_all


def _left_processes(marker: str, servers: set[str]) -> list[str]:
    lines = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.splitlines()
    return [line for line in lines if line.split()[0] not in servers]


def _why_not_started(session_pks: list[str]) -> list[str]:
    """What the worker recorded for shells that did not start: each distinct reason, with how often."""
    from executions.models import Evidence, ExecutionEvent

    events = ExecutionEvent.objects.filter(
        execution__terminal_session__pk__in=session_pks, evidence=Evidence.SPAWN_FAILED
    ).values_list("reason", flat=True)
    return [f"{n}x {reason}" for reason, n in Counter(reason[:200] for reason in events).most_common()]


def _resolve_if_unknown(session_pk) -> str:
    """An outcome recorded unknown keeps its machine's slot until an operator resolves it: resolved here
    (once the checks pass), and why it was unknown returned for the report; "" when it is not unknown."""
    from executions.actions import Actor
    from executions.models import State
    from terminals.models import TerminalSession
    from terminals.resolution import resolve

    execution = TerminalSession.objects.select_related("execution").get(pk=session_pk).execution
    if execution.state != State.UNKNOWN:
        return ""
    why = execution.events.filter(to_state=State.UNKNOWN).values_list("reason", flat=True).last() or "?"
    resolve(execution, actor=Actor.command("bench"), note="churn benchmark: its processes were checked gone")
    return why[:300]


def _state_of(session_pk) -> dict:
    from terminals.models import ProcessLease, TerminalSession

    session = TerminalSession.objects.select_related("execution").get(pk=session_pk)
    lease = ProcessLease.objects.select_related("worker").filter(execution=session.execution).first()
    return {
        "process_state": session.process_state,
        "execution": (session.execution.state, session.execution.evidence),
        "lease": lease
        and (lease.worker and lease.worker.host, lease.token, lease.handle and lease.handle.launch, lease.released_at),
    }


async def bench_churn_hosts(ctx) -> None:
    from executions.actions import Actor, add_machine
    from terminals.actions import open_terminal
    from terminals.models import ProcessLease, TerminalSession
    from tests.bridge.harness import Stack, Viewer
    from tests.hosts.harness import Balancer, Host

    count = ctx.sizes.get("churn_hosts", 1000 if ctx.quick else 10_000)  # --size churn_hosts=1000
    lanes = 10
    marker = unique("churnhosts")
    stack = Stack(worker_poll=0.5, extra_env=dict(ctx.stack.extra_env))
    hosts = [Host("bench-host-a", stack), Host("bench-host-b", stack)]
    sockets = {host.name: unique(f"tether-bench-{host.name}") for host in hosts}
    balancer = None
    try:
        for host in hosts:
            host.boot()
        with ThreadPoolExecutor(4) as pool:
            starts = [pool.submit(host.start_daphne) for host in hosts] + [
                pool.submit(host.start_worker, "local,tmux") for host in hosts
            ]
            for started in starts:
                started.result()
        balancer = await asyncio.to_thread(Balancer({host.name: host.daphne_port for host in hosts}).start)

        def machine(lane: int):
            host = hosts[lane % 2].name
            backend = "tmux" if (lane // 2) % 2 else "local"
            return add_machine(
                name=unique(f"churn-{host}-{backend}"), backend=backend, host=host, scope="bench",
                ref=sockets[host] if backend == "tmux" else "", actor=Actor.command("bench"),
            )  # fmt: skip

        machines = [await sync_to_async(machine)(n) for n in range(lanes)]
        shell = ["/bin/sh", "-c", f"echo READY; read line; echo got-$line; sleep 2147483; : {marker}"]
        done = total = 0
        not_started: list[str] = []
        unknown: list[str] = []

        async def lane(number: int) -> None:
            nonlocal done
            while done < total:
                done += 1
                session = await sync_to_async(lambda: open_terminal(machines[number], ctx.user, shell=shell)[0])()
                viewer = await Viewer.open(balancer.port, session.id, ctx.cookie)
                await viewer.attach()
                try:
                    await viewer.read_until(b"READY", timeout=60)
                    await viewer.type(f"{done}\r")
                    await viewer.read_until(b"got-", timeout=60)
                except (TimeoutError, AssertionError) as error:
                    said = await sync_to_async(_state_of)(session.pk)
                    if not any(m.get("evidence") == "spawn_failed" for m in viewer.messages):
                        raise AssertionError(
                            f"session {session.pk} (lane {number}, via {viewer.ws.response.headers.get('X-Served-By')})"
                            f": {said}; got {bytes(viewer.output[-300:])!r}; messages {viewer.messages[-6:]}"
                        ) from error
                    # Its shell did not start (recorded so, and the page started a fresh one): counted.
                    not_started.append(str(session.pk))
                await viewer.close()
                await close_all([session])
                if why := await sync_to_async(_resolve_if_unknown)(session.pk):
                    unknown.append(why)  # recorded honestly; resolved as an operator would, so the lane goes on

        total = 2 * lanes  # a first round warms the pools: what is counted after is what the churn left
        await asyncio.gather(*(lane(n) for n in range(lanes)))
        await asyncio.sleep(3)
        before = _redis_counts(stack.redis_url, stack.prefix)
        total += count
        began = time.monotonic()
        await asyncio.gather(*(lane(n) for n in range(lanes)))
        elapsed = time.monotonic() - began
        await asyncio.sleep(3)
        after = _redis_counts(stack.redis_url, stack.prefix)
        pks = [m.pk for m in machines]
        servers = {_tmux_server(socket) for socket in sockets.values()}
        left = {
            "shells": len(_left_processes(marker, servers)),
            "tmux sessions": sum(_tmux_sessions(socket) for socket in sockets.values()),
            "Redis keys": after[0] - before[0],
            "Redis subscriptions": after[1] - before[1],
            "leases unreleased": await sync_to_async(
                lambda: ProcessLease.objects.filter(execution__machine__in=pks, released_at__isnull=True).count()
            )(),
            "zombies in the hosts": sum(host.zombies() for host in hosts),
            "sessions not closed": await sync_to_async(
                lambda: TerminalSession.objects.filter(machine__in=pks).exclude(process_state="closed").count()
            )(),
        }
        ctx.report.add(
            Figure(
                f"churn across 2 hosts behind HAProxy: {count} sessions opened, viewed, typed into and closed "
                f"({lanes} at a time, local and tmux): left over",
                sum(max(v, 0) for v in left.values()),
                "",
                goal="0",
                met=all(v <= 0 for v in left.values()),
                note=", ".join(f"{k} {v}" for k, v in left.items())
                + f"; {count / elapsed:.1f} sessions/s; {len(not_started)} recorded 'Did not start', "
                f"{len(unknown)} unknown",
            )
        )
        for reason in await sync_to_async(_why_not_started)(not_started):
            ctx.report.notes.append(f"churn_hosts: a shell that did not start: {reason}")
        for why in unknown:
            ctx.report.notes.append(f"churn_hosts: a shell recorded unknown: {why}")
    finally:
        if balancer is not None:
            await asyncio.to_thread(balancer.stop)
        for host in hosts:
            await asyncio.to_thread(host.kill)
        stack.stop()
        for socket in sockets.values():
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
