"""Ending a process tree for good: every process of it signalled while its identity still matches (pid, start
time, boot: procfs.ProcessIdentity), TERM first and KILL after a grace, and an answer only once none is left
alive, including those that detached (found by the marker variable they inherit) or were stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from terminals.backends import procfs
from terminals.backends.procfs import MARKER_VARIABLE, ProcessIdentity


async def terminate_tree(
    *,
    marker: str,
    leader: ProcessIdentity | None = None,
    variable: str = MARKER_VARIABLE,
    grace: float = 2.0,
    timeout: float = 10.0,
) -> list[ProcessIdentity]:
    """End every process of the tree (see ``find_tree``) and return once none is left alive.

    1. SIGHUP and SIGTERM to every process found, the tree frozen meanwhile (``_frozen``);
    2. wait up to ``grace`` for them to end;
    3. SIGKILL whatever is left, frozen too, scanning again each round (a dying parent may have forked a
       last child), until nothing is; TimeoutError after ``timeout``, so a return means proven gone.

    A process found once stays on the list (by pid and start time): a session member without the marker
    that ignores SIGTERM is still killed after its leader has died and been reaped.
    """
    known: set[ProcessIdentity] = set()

    async def scan() -> list[ProcessIdentity]:
        # A pass over every process, read after this moment and shared with the other trees ended meanwhile.
        table = await procfs.shared_table(time.monotonic(), with_sessions=leader is not None)
        known.update(table.tree(marker=marker, leader=leader, variable=variable))
        known.difference_update([process for process in known if not process.is_alive()])
        return list(known)

    first = await scan()
    if not first:
        # Nothing to end: a pass read wholly after the call found none, the same proof the last round takes.
        # (Ending a holder's tree leaves only this sweep for strays, one pass shared with the others.)
        return first
    # Each round freezes the tree before signalling it: signalled one by one, a child could die first and
    # let its parent run on for a moment (a subshell whose sleep was ended goes on to its next command).
    _frozen(first, signal.SIGHUP, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and await scan():
        await asyncio.sleep(0.05)
    stop_by = time.monotonic() + timeout
    while True:
        left = await scan()
        if not left:
            return first
        _frozen(left, signal.SIGKILL)
        if time.monotonic() > stop_by:
            raise TimeoutError(f"processes still alive after SIGKILL: {[p.pid for p in left]}")
        await asyncio.sleep(0.05)


def _children(pid: int) -> list[int] | None:
    """The children of every thread of ``pid`` (zombies too, until reaped); None when its task directory
    cannot be read (it is gone, or the kernel has no children files)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found, read_any = [], False
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as file:
                text = file.read()
        except OSError:
            continue
        read_any = True
        found.extend(int(child) for child in text.split())
    return found if read_any else None


def _stopped_below(root: ProcessIdentity) -> list[ProcessIdentity] | None:
    """Every live process below ``root``, each stopped (SIGSTOP) as it is found and before its own children
    are read, so none forks or reaps behind the walk; None when ``root`` is gone or its children cannot be
    read. A process whose parent dies meanwhile moves up to ``root`` (a child subreaper), after its list was
    read: it is found by the next walk."""
    pids = _children(root.pid)
    if pids is None or not root.is_alive():
        return None
    found = []
    for pid in pids:  # grows as the walk goes down
        identity = ProcessIdentity.of(pid)
        if identity is None:
            continue  # gone
        if identity.signal(signal.SIGSTOP):  # not sent to a zombie, nor to one not ours (a sudo)
            found.append(identity)
        # Walked through either way: a zombie has no children (they went to root), a sudo's may be ours.
        pids.extend(_children(pid) or ())
    return found


def _has_no_children(root: ProcessIdentity) -> bool | None:
    """Whether ``root`` has no child at all, live or zombie, at one moment (a children file read empty is
    exact: its first entry is looked up under the kernel's task list lock); None when it cannot tell."""
    children = _children(root.pid)
    if children is None or not root.is_alive():
        return None
    return not children


async def terminate_descendants(holder: ProcessIdentity, *, grace: float = 2.0, timeout: float = 10.0) -> bool:
    """End every process below ``holder``, a child subreaper (the session holder): whatever its program
    starts, daemons included, stays below it, so the tree is a walk down from it, a few reads, not a pass
    over every process of the host. Like ``terminate_tree``: HUP and TERM to the tree (stopped while it is
    found), up to ``grace`` for it to end, then KILL each round until none is left; TimeoutError after
    ``timeout``. True once the holder had no child left at one moment while it still lived; False when that
    cannot be told (the holder is gone, or its children cannot be read): the caller ends the tree by marker.

    The holder reaps every child it gets, so "no child" is soon true once the tree has ended."""

    def round(*signals: int) -> bool | None:
        found = _stopped_below(holder)
        if found is None:
            return None
        _frozen(found, *signals)  # stopped already, as the walk found them: signalled, then let go
        return bool(found)

    if round(signal.SIGHUP, signal.SIGTERM) is None:
        return False
    deadline = time.monotonic() + grace
    while (empty := _has_no_children(holder)) is False and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    stop_by = time.monotonic() + timeout
    while True:
        if empty is None:
            return False
        if empty:
            return True
        if round(signal.SIGKILL) is None:
            return False
        if time.monotonic() > stop_by:
            raise TimeoutError(f"processes still alive below holder {holder.pid} after SIGKILL")
        await asyncio.sleep(0.02)
        empty = _has_no_children(holder)


def _frozen(processes: list[ProcessIdentity], *signals: int) -> None:
    """Stop every process, send ``signals`` to each, then let them go on: a pending signal is taken before
    a resumed process runs a single instruction of its own, so none acts on another's end meanwhile."""
    try:
        for process in processes:
            process.signal(signal.SIGSTOP)
        for process in processes:
            for signum in signals:
                process.signal(signum)
    finally:
        for process in processes:
            process.signal(signal.SIGCONT)
