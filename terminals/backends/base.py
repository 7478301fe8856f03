"""The one small async protocol every process backend implements.

A ``Backend`` starts programs and looks at them from any process; a ``Process``
is the live handle the owner worker holds. Its ``handle`` (``handles``: one type per
backend) is what a later worker finds the process again by, from the lease row.

Honesty rules shared by all backends:
- ``Process.wait()`` returns an ``Exit`` only from a trustworthy source
  (waitpid, tmux's dead-pane status, docker exec inspect), never because a
  stream closed.
- ``read()`` reads its source only when asked, so a consumer that stops
  reading makes the program block in write() instead of a buffer growing.
- ``terminate()`` returns only once the whole tree is proven gone.
"""

from __future__ import annotations

import abc
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from executions.outcomes import wait_status_label
from terminals.backends.handles import Handle

READ_CHUNK = 64 * 1024
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "TERM": "xterm-256color",
    "LANG": "C.UTF-8",
    "COLORTERM": "truecolor",
}


class BackendError(Exception):
    """The backend could not do what was asked; the message says why."""


class SpawnError(BackendError):
    """Nothing was started (bad program, missing container, unreachable engine)."""


BeforeStart = Callable[[Handle], Awaitable[None]]


@dataclass(frozen=True)
class SpawnSpec:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    cols: int = 80
    rows: int = 24

    @classmethod
    def from_execution_spec(cls, spec) -> SpawnSpec:
        return cls(argv=tuple(spec.argv), env=dict(spec.env), cwd=spec.cwd, cols=spec.cols, rows=spec.rows)


@dataclass(frozen=True)
class Tags:
    """Who owns a process. tmux stores these as session options; others in the handle."""

    session: str
    owner_pid: int
    owner_started_at: int
    heartbeat: int = 0
    # Inherited by every descendant through the environment, to find detached ones.
    marker: str = field(default_factory=lambda: secrets.token_hex(12))


@dataclass(frozen=True)
class Exit:
    code: int | None = None
    signal: int | None = None
    source: str = ""
    # ``code`` is a wait status the source cannot split: 128+N may be the program's exit or signal N (docker).
    ambiguous: bool = False

    def describe(self) -> str:
        if self.ambiguous:
            return wait_status_label(self.code)
        if self.code is not None:
            return f"Exited with code {self.code}"
        return f"Ended by signal {self.signal}"


class Status(StrEnum):
    ALIVE = "alive"
    EXITED = "exited"
    GONE = "gone"
    UNKNOWN = "unknown"
    NEVER_STARTED = "never_started"  # proven: the program never ran, and nothing can start it now


@dataclass(frozen=True)
class Inspection:
    status: Status
    exit: Exit | None = None
    detail: str = ""
    handle: Handle | None = None  # found from an intent (a tmux session by its marker): the process's own handle
    # NEVER_STARTED even should its owner only be frozen: the owner's next step towards starting it is fenced
    # by its lease (a docker exec is started only after a fenced write), so a take-over stops it.
    fenced: bool = False
    # A live session holder keeps the program, or its last output and exit: a new owner attaches to it.
    held: bool = False


@dataclass(frozen=True)
class TaggedSession:
    """A process a backend can list with its owner tags (tmux)."""

    handle: Handle
    tags: dict[str, str]


class Process(abc.ABC):
    """A live process held by its owner."""

    handle: Handle
    can_snapshot = False  # whether ``snapshot`` can tell the screen as it is now (a terminal that keeps one)
    survives_owner = False  # it runs on once its owner lets go, for a later owner to attach to
    offsets_survive_owner = False  # output offsets continue across owners (a holder's), not per owner
    stream_origin = 0  # the offset of the first byte ``read`` returns (a held stream resumed by a new owner)
    written_at_attach = 0  # how far the stream went when this owner attached (a holder's): all of it is to come

    @abc.abstractmethod
    async def read(self) -> bytes:
        """Up to READ_CHUNK bytes of output; b"" once the output has ended."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def resize(self, cols: int, rows: int) -> None: ...

    @abc.abstractmethod
    async def wait(self) -> Exit:
        """The observed exit. Raises BackendError when no trustworthy exit can be had."""

    @abc.abstractmethod
    async def terminate(self, grace: float = 2.0) -> Exit | None:
        """End the whole process tree and return once it is proven gone; the exit if one was observed."""

    @abc.abstractmethod
    async def detach(self) -> None:
        """Stop observing without touching the process (it stays for a later owner where possible)."""

    async def snapshot(self):
        """The screen as it is now (``can_snapshot``); its ``render()`` redraws it on a blank terminal."""
        raise NotImplementedError(f"{type(self).__name__} keeps no screen")

    async def release(self) -> None:
        """Its exit is on record: let go of whatever still kept it (a holder waiting to be told)."""
        return None


class Backend(abc.ABC):
    name: str
    # What a backend can do beyond the contract, declared so that callers ask instead of guessing:
    can_adopt = False  # ``attach`` takes over a live process from a dead owner
    can_retag = False  # ``tag`` rewrites a live process's owner tags (an adopter's pid, a heartbeat)
    can_snapshot = False  # ``snapshot(handle)`` tells a session's screen as it is now
    can_find_by_label = False  # ``find_by_label`` finds a process by its session label, with no handle

    @abc.abstractmethod
    async def spawn(
        self, spec: SpawnSpec, tags: Tags, before_start: BeforeStart | None = None, instance: str = ""
    ) -> Process:
        """Start ``spec``. A backend that creates before it starts (docker) awaits ``before_start(handle)``
        in between, so the handle is kept before anything can run; if it raises, nothing is started.
        ``instance`` is what ``instance()`` said the machine is: a backend that can address it (a container
        by id) starts the program there and nowhere else. Raises SpawnError only when nothing started."""

    @abc.abstractmethod
    async def inspect(self, handle: Handle) -> Inspection:
        """Look at a process from any OS process, e.g. after its spawner died."""

    async def inspect_launch(self, intent: Handle) -> Inspection:
        """Look for what an owner that died mid-launch may have started. ``intent`` is the handle it saved
        before spawning (``launch``: spawning or starting, with the tags' marker and session and the
        instance it was placed in). NEVER_STARTED only with proof; GONE when it may have run and ended."""
        return Inspection(Status.GONE, detail="no handle was saved: it may have run")

    async def look(self, handle: Handle) -> Inspection:
        """What a lease's saved handle says now, whoever asks (recovery, the checked resolution): an owner that
        died mid-launch saved its intent (``launch``), looked for with ``inspect_launch``; a started process's
        own handle is inspected."""
        return await (self.inspect(handle) if handle.started else self.inspect_launch(handle))

    async def instance(self, *, ensure: bool = False) -> str:
        """The identity of the object behind the machine now (a container's id, the tmux server), "" when
        there is none; ``ensure`` starts what a spawn would start anyway (the tmux server)."""
        return ""

    async def place_file(self, source: Path, instance: str = "") -> str:
        """Where a program started here reads ``source`` (a file of Tether's: the shell integration): on a
        host, where it is. Raises BackendError when it cannot be placed where the program runs."""
        return str(source)

    async def pipes_program(self, instance: str = "") -> str:
        """The path, where a program started here runs, of the session holder that runs a command on pipes
        (``tether-holder mux``, executions.pipes). Raises BackendError when there is none there."""
        raise BackendError(f"the {self.name} backend cannot run a command on pipes (pty: false)")

    async def vacancy(self, instance: str) -> str | None:
        """Why nothing that ran in ``instance`` (as recorded at its dispatch; "" when not recorded) can run
        any more: its container is gone or stopped, its tmux server gone, the host rebooted. None when
        something of it may still run there. Raises BackendError when this process cannot look at it (another
        engine, another user's tmux socket): absence seen from the wrong place is no proof."""
        return None

    async def survivors(self, handle: Handle) -> int:
        """How many processes of the handle's tree are still alive (descendants that outlived the program)."""
        return 0

    def adoptable(self, handle: Handle) -> bool:
        """Whether ``attach`` can take over this process (a held one, or any on a backend that can adopt)."""
        return self.can_adopt

    async def attach(self, handle: Handle) -> Process:
        """Take over observation of a live process (adoption). Backends that cannot, refuse."""
        raise BackendError(f"the {self.name} backend cannot adopt a process from another owner")

    async def list_tagged(self) -> list[TaggedSession]:
        """Every tagged process this backend can see; untagged ones are never listed."""
        return []

    async def tag(self, handle: Handle, **values: str | int) -> None:
        """Rewrite owner tags (``can_retag``)."""
        raise BackendError(f"the {self.name} backend cannot retag a process")

    async def find_by_label(self, label: str) -> str | None:
        """What carries the session label ``label`` (``can_find_by_label``), said for people; None: nothing."""
        raise BackendError(f"the {self.name} backend cannot find a process by its label")

    async def snapshot(self, handle: Handle):
        """A session's screen as it is now (``can_snapshot``), read without holding it."""
        raise BackendError(f"the {self.name} backend keeps no screen")

    async def remove(self, handle: Handle, grace: float = 2.0) -> None:
        """End a process found through its handle (recovery of a dead owner's leftovers)."""
        raise BackendError(f"the {self.name} backend cannot remove a process it does not hold")


def child_env(spec: SpawnSpec, tags: Tags, base: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment: the worker's own secrets (DATABASE_URL, SECRET_KEY) never leak into a shell."""
    from terminals.backends.procfs import MARKER_VARIABLE

    env = {**BASE_ENV, **(base or {}), **spec.env}
    env[MARKER_VARIABLE] = tags.marker
    env["TETHER_SESSION"] = tags.session
    return env
