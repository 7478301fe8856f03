"""Two simulated hosts behind a real HAProxy (tests/hosts/harness.py): sessions through the balancer from
either daphne; a host killed outright leaves its docker session adopted by the other host (through the
session holder), its local and tmux sessions recorded honestly, and no page waiting on a dead worker; a
host that is only slow (SIGSTOP) is fenced off, never doubled."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async

from executions.actions import Actor, add_machine
from executions.models import Execution, ExecutionEvent, State
from terminals import actions as terminal_actions
from terminals.models import ProcessLease, Worker, WorkerState
from tests.bridge.harness import Stack, Viewer, session_cookie, start_container
from tests.hosts.harness import Balancer, DockerOverTcp, Host, LinkRelay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.bridge]


@pytest.fixture
def hosts():
    stack = Stack()
    docker = DockerOverTcp()
    container, error = start_container("tether-test-hosts")
    assert container, f"the test container did not start: {error}"
    a, b = Host("host-a", stack), Host("host-b", stack)
    balancer = None
    try:
        for host in (a, b):
            host.boot()
        with ThreadPoolExecutor(3) as pool:
            for started in [pool.submit(a.start_daphne), pool.submit(b.start_daphne), pool.submit(a.start_worker)]:
                started.result()
        balancer = Balancer({"web-a": a.daphne_port, "web-b": b.daphne_port}).start()
        yield SimpleNamespace(stack=stack, docker=docker, container=container, a=a, b=b, balancer=balancer)
    finally:
        if balancer is not None:
            balancer.stop()
        for host in (a, b):
            host.kill()
        stack.stop()
        docker.close()
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)


def machine(name: str, backend: str, *, host: str = "", ref: str = "", engine: str = ""):
    return add_machine(
        name=name, backend=backend, ref=ref, engine=engine, host=host or None, scope="team-a",
        actor=Actor.command("tests"),
    )  # fmt: skip


def holder_host(execution_pk: int) -> str | None:
    lease = ProcessLease.objects.select_related("worker").filter(execution_id=execution_pk, released_at=None).first()
    return lease.worker.host if lease and lease.worker and lease.handle is not None and lease.handle.started else None


async def until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = await sync_to_async(predicate)()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def through(balancer: Balancer, session, cookie: str, **attach) -> tuple[Viewer, str]:
    viewer = await Viewer.open(balancer.port, session.id, cookie)
    served_by = viewer.ws.response.headers.get("X-Served-By", "")
    await viewer.attach(**attach)
    return viewer, served_by


async def test_a_host_killed_outright_loses_nothing_it_could_keep_and_says_so_for_the_rest(hosts, operator):
    a, b, balancer = hosts.a, hosts.b, hosts.balancer
    cookie = await sync_to_async(session_cookie)(operator)

    def open_sessions():
        docker = machine("net-docker", "docker", ref=hosts.container, engine=hosts.docker.url)
        local = machine("a-local", "local", host="host-a")
        tmux = machine("a-tmux", "tmux", host="host-a", ref="tether-hosts-a")
        return [terminal_actions.open_terminal(m, operator)[0] for m in (docker, local, tmux)]

    docker_session, local_session, tmux_session = await sync_to_async(open_sessions)()
    for session in (docker_session, local_session, tmux_session):  # only host-a's worker runs yet
        await until(lambda s=session: holder_host(s.execution_id) == "host-a", what=f"{session} held on host-a")
    await sync_to_async(b.start_worker)()

    # Through the balancer, from either daphne: one socket lands on each.
    served = set()
    viewer, by = await through(balancer, docker_session, cookie)
    served.add(by)
    await viewer.type("export MARK=before-$((40+2)); echo set-$MARK\n")
    await viewer.read_until(b"set-before-42")
    offset = viewer.offset
    await viewer.close()
    viewer, by = await through(balancer, docker_session, cookie, since=offset)
    served.add(by)
    await viewer.type("echo again-$MARK\n")
    await viewer.read_until(b"again-before-42")
    await viewer.close()
    assert served == {"web-a", "web-b"}
    for session in (local_session, tmux_session):
        viewer, _ = await through(balancer, session, cookie)
        await viewer.type("echo alive-$((5*5))\n")
        await viewer.read_until(b"alive-25")
        await viewer.close()

    # Host A loses power: its daphne, its worker, its shells and its tmux server, all at once.
    pids = a.pids()
    assert len(pids) >= 4  # its init, daphne, worker, shells...
    await sync_to_async(a.kill)()

    # Host B adopts the docker shell through its session holder: the same shell, the variable still set.
    await until(lambda: holder_host(docker_session.execution_id) == "host-b", timeout=40, what="docker adopted by B")
    viewer, by = await through(balancer, docker_session, cookie)
    assert by == "web-b"
    await viewer.type("echo after-$MARK\n")
    await viewer.read_until(b"after-before-42")
    await viewer.close()

    # Host A's local and tmux shells: nobody may say how they ended while host A is away. A page opened on
    # one is told so, instead of waiting on a worker that is gone.
    viewer = await Viewer.open(balancer.port, local_session.id, cookie)
    await viewer.send_json({"type": "attach", "since": 0, "cols": 80, "rows": 24})
    status = await viewer.wait_for("status", timeout=30)
    assert "host-a" in status["text"], status
    await viewer.close()
    for session in (local_session, tmux_session):
        assert await sync_to_async(lambda s=session: Execution.objects.get(pk=s.execution_id).state)() == State.RUNNING

    # Host A comes back: its worker finds both processes gone with the host and records them unknown.
    await sync_to_async(a.boot)()
    await sync_to_async(a.start_worker)()
    for session in (local_session, tmux_session):
        await until(
            lambda s=session: Execution.objects.get(pk=s.execution_id).state == State.UNKNOWN,
            timeout=40,
            what=f"{session} recorded unknown",
        )
    assert await sync_to_async(holder_host)(docker_session.execution_id) == "host-b"


async def test_a_host_whose_worker_is_only_slow_is_fenced_never_doubled(hosts, operator):
    a, b, balancer = hosts.a, hosts.b, hosts.balancer
    cookie = await sync_to_async(session_cookie)(operator)
    session = await sync_to_async(
        lambda: terminal_actions.open_terminal(
            machine("slow-docker", "docker", ref=hosts.container, engine=hosts.docker.url), operator
        )[0]
    )()
    await until(lambda: holder_host(session.execution_id) == "host-a", what="held on host-a")
    await sync_to_async(b.start_worker)()
    viewer, _ = await through(balancer, session, cookie)
    await viewer.type("echo one-$((1+1))\n")
    await viewer.read_until(b"one-2")

    attaches = sum(message["type"] == "attached" for message in viewer.messages)
    # Host A's worker stops (SIGSTOP to the process inside the namespace; nsenter passes nothing on).
    slow_pid = await sync_to_async(lambda: Worker.objects.get(host="host-a", state=WorkerState.RUNNING).pid)()
    stopped = [pid for pid in a.pids() if _ns_pid(pid) == slow_pid]
    assert stopped, "the worker process inside host A"
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        await until(lambda: holder_host(session.execution_id) == "host-b", timeout=40, what="adopted by B")
        adopted_at = await sync_to_async(
            lambda: ExecutionEvent.objects.filter(execution_id=session.execution_id).count()
        )()
        # The viewer follows the new owner by itself (its owner check); what it types then is written once.
        while sum(message["type"] == "attached" for message in viewer.messages) < attaches + 1:
            await viewer._next(30)
        await viewer.type("echo two-$((2+2))\n")
        await viewer.read_until(b"two-4", timeout=30)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        a.worker.send_signal(signal.SIGCONT)  # nsenter stopped itself when its child did (job control)
    await asyncio.sleep(3)  # the woken worker's next heartbeat finds its token bumped and lets go
    await viewer.type("echo three-$((3+3))\n")
    await viewer.read_until(b"three-6")
    await viewer.read_for(1.0)
    text = bytes(viewer.output).decode(errors="replace")
    # Each command line echoed once and run once: nothing written twice, nothing shown twice.
    for line, result in (("echo two-$((2+2))", "two-4"), ("echo three-$((3+3))", "three-6")):
        assert text.count(line) == 1 and text.count(result) == 1, text[-2000:]
    # Host A wrote nothing about the shell after it was taken over, and holds no lease on it.
    slow = await sync_to_async(lambda: Worker.objects.get(host="host-a", pid=slow_pid).worker_id)()
    events = await sync_to_async(
        lambda: list(ExecutionEvent.objects.filter(execution_id=session.execution_id).values_list("actor", flat=True))
    )()
    assert f"worker:{slow}" not in events[adopted_at:]
    assert await sync_to_async(holder_host)(session.execution_id) == "host-b"
    await viewer.close()


def _ns_pid(outer_pid: int) -> int | None:
    """The pid a process has in its own namespace (the innermost NSpid)."""
    for line in Path(f"/proc/{outer_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


async def test_a_link_cut_between_two_hosts_mid_stream_loses_no_byte_and_repeats_none(hosts, operator):
    """Host A's daphne streams a shell of host B's worker over B's direct link; the network between them drops
    the link twice mid-stream: the stream goes on (through Redis, then a new link) from its offset, every line
    once and in order."""
    a, b = hosts.a, hosts.b
    b.link = LinkRelay()
    try:
        await sync_to_async(b.start_worker)("local")
        cookie = await sync_to_async(session_cookie)(operator)
        session = await sync_to_async(
            lambda: terminal_actions.open_terminal(machine("b-local", "local", host="host-b"), operator)[0]
        )()
        await until(lambda: holder_host(session.execution_id) == "host-b", what="the shell held on host-b")
        viewer = await Viewer.open(a.daphne_port, session.id, cookie)
        await viewer.attach()
        await viewer.type("echo ready-$((6*7))\n")
        await viewer.read_until(b"ready-42")
        assert b.link.accepted == 1  # A's daphne dialled B's worker through the relay
        count = 200_000
        await viewer.type(f"seq 1 {count}; echo end-$((6*7))\n")
        for upto in (b"\r\n20000\r\n", b"\r\n90000\r\n"):
            await viewer.read_until(upto, timeout=60)
            b.link.cut()
        await viewer.read_until(b"end-42\r\n", timeout=90)
        text = bytes(viewer.output).decode(errors="replace")
        # From the first number (after the shell's mark that the command began: OSC 133;C ... BEL).
        numbers = text[text.index("\x071\r\n", text.index("seq 1")) + 1 :].split("\r\n")[:count]
        assert numbers == [str(n) for n in range(1, count + 1)]
        assert b.link.accepted >= 2  # dialled again after the cut
        await viewer.close()
    finally:
        b.link.close()
