"""Programs a worker starts (terminals/children.py), on both event loops a worker can run: a daemon they leave
behind holds none of the worker's descriptors, and their output, exit and a kill are seen without a thread."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import uvloop

from terminals.children import PIPE, Child

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}
# A daemon's way: its own stdio on /dev/null, left running; the command itself says the daemon's pid and ends.
DAEMON = "sleep 30 </dev/null >/dev/null 2>&1 & echo $!"


def link(path: str) -> str:
    try:
        return os.readlink(path)
    except FileNotFoundError:
        return "(closed as it was read)"


@pytest.fixture(params=sorted(LOOPS))
def run(request):
    return LOOPS[request.param]


def test_a_daemon_a_program_leaves_behind_holds_none_of_the_workers_descriptors(run):
    """Under uvloop's own subprocesses the daemon kept a copy of the command's stdout at another number, so
    its output never ended (the first tmux new-session, which forks the tmux server, hung the worker)."""

    async def main():
        child = Child.start(["sh", "-c", DAEMON], stdout=PIPE)
        out, _ = await asyncio.wait_for(child.communicate(), 10)
        return child.returncode, int(out)

    code, daemon = run(main())
    try:
        assert code == 0
        # The shell forked it before it said its pid: until it is sleep itself, with the shell's own
        # close-on-exec descriptors closed (a leaked one would stay).
        for _ in range(200):
            held = {fd: link(f"/proc/{daemon}/fd/{fd}") for fd in os.listdir(f"/proc/{daemon}/fd")}
            if sorted(held, key=int) == ["0", "1", "2"]:
                break
            time.sleep(0.01)
        assert sorted(held, key=int) == ["0", "1", "2"], held
    finally:
        os.kill(daemon, signal.SIGKILL)


def test_input_output_exit_and_kill_are_seen(run):
    async def main():
        echo = Child.start(["sh", "-c", "cat; echo oops >&2; exit 3"], stdin=PIPE, stdout=PIPE, stderr=PIPE)
        said = await asyncio.wait_for(echo.communicate(b"x" * 300_000), 10)  # more than a pipe holds
        sleeper = Child.start(["sleep", "30"])
        waits = [asyncio.ensure_future(sleeper.wait()) for _ in range(2)]  # two waiters, one reaping
        await asyncio.sleep(0.05)
        assert not any(wait.done() for wait in waits)
        sleeper.kill()
        ended = await asyncio.wait_for(asyncio.gather(*waits), 10)
        return said, echo.returncode, ended, await sleeper.wait()

    (out, err), code, ended, again = run(main())
    assert out == b"x" * 300_000 and err == b"oops\n" and code == 3
    assert ended == [-signal.SIGKILL, -signal.SIGKILL] and again == -signal.SIGKILL


def test_a_wait_that_is_cancelled_leaves_the_child_to_be_waited_for_again(run):
    async def main():
        child = Child.start(["sh", "-c", "sleep 0.3; exit 5"])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(child.wait(), 0.05)
        return await asyncio.wait_for(child.wait(), 10)

    assert run(main()) == 5


def test_ending_a_child_given_up_on_kills_it_and_waits_even_when_the_wait_is_cancelled(run):
    async def main():
        sleeper = Child.start(["sleep", "30"])
        ending = asyncio.ensure_future(sleeper.end())
        await asyncio.sleep(0)
        ending.cancel()  # the caller gives up on the wait: the child is still reaped
        with pytest.raises(asyncio.CancelledError):
            await ending
        code = await asyncio.wait_for(sleeper.wait(), 10)
        done = Child.start(["sh", "-c", "exit 4"])
        await done.wait()
        return code, await done.end()  # one that has ended already keeps its own status

    assert run(main()) == (-signal.SIGKILL, 4)
