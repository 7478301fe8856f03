"""What a lease keeps to find its process again: one typed handle per backend.

A handle is written to the lease's JSON (``ProcessLease.handle``) and read back by whichever worker looks
next, possibly of another release during a rolling upgrade. It is turned into JSON and back here and
nowhere else (``load`` and ``Handle.dump``), under these rules, so that either release reads the other's:

- the keys are the ones every release so far wrote (``backend``, ``marker``, ``holder``, …), each with the
  same meaning; a field that is None is not written (an empty string is: a docker handle's ``engine`` is
  "" for the default engine, and releases before this one read it by key);
- a key this release does not know is kept as it came (``extra``) and written back with the rest, so a
  handle a newer release wrote survives being re-saved (a re-tag, an adoption) by an older one.

A handle without ``launch`` is the process's own: the program was started. With it, it is how far its owner
got (``Launch``): ``claimed`` (nothing begun, no backend yet), ``spawning`` (the owner's intent: the marker
and session its program will carry, the instance it is placed in), ``starting`` (a docker exec created, not
started).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, ClassVar, Self

from terminals.backends.procfs import ProcessIdentity


class Launch(StrEnum):
    """How far an owner got with starting a program, as the ``launch`` key of its lease's handle says.
    A handle without the key is the process's own: the program was started."""

    CLAIMED = "claimed"  # nothing begun: the program cannot have started
    SPAWNING = "spawning"  # the backend was asked to start it; the handle is the worker's intent
    STARTING = "starting"  # created, not started (a docker exec between create and start)


Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]
IDENTITY: Codec = (ProcessIdentity.from_json, ProcessIdentity.to_json)


@dataclass(frozen=True, kw_only=True)
class Record:
    """A JSON object read into typed fields; what this release does not know kept in ``extra``."""

    codecs: ClassVar[dict[str, Codec]] = {}
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Self:
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {}
        for name in known & data.keys():
            value = data[name]
            if value is not None and name in cls.codecs:
                value = cls.codecs[name][0](value)
            values[name] = value
        extra = {name: value for name, value in data.items() if name not in known and name != "backend"}
        return cls(**values, extra=extra)

    def dump(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None:
                continue
            data[f.name] = self.codecs[f.name][1](value) if f.name in self.codecs else value
        return data | dict(self.extra)


@dataclass(frozen=True, kw_only=True)
class Holder(Record):
    """A session holder: its directory (socket, exit record), the secret it asks of a client, the bytes its ring
    keeps (None: a holder started before that was written down keeps the default), and whether it keeps a
    screen for the next owner."""

    dir: str | None = None
    secret: str | None = None
    ring: int | None = None
    screens: bool | None = None  # it keeps the screen its client leaves with it (a holder from before: None)


@dataclass(frozen=True, kw_only=True)
class LocalHolder(Holder):
    """On the worker's host: its own process (to tell it alive), and whether it reaps orphans (a subreaper)."""

    codecs: ClassVar[dict[str, Codec]] = {"process": IDENTITY}
    process: ProcessIdentity | None = None
    subreaper: bool | None = None


@dataclass(frozen=True, kw_only=True)
class DockerHolder(Holder):
    """In a container: the binary placed there, and the pids (in the container) of the holder and of the
    program, once it said them."""

    binary: str | None = None
    pid: int | None = None
    program: int | None = None


@dataclass(frozen=True, kw_only=True)
class Handle(Record):
    """What every handle has: the marker its program's tree carries, the session label, the backend object
    it was placed in (``instance``), and how far its launch got (None: started)."""

    backend: ClassVar[str] = ""
    codecs: ClassVar[dict[str, Codec]] = {"launch": (Launch, str)}
    launch: Launch | None = None
    marker: str | None = None
    session: str | None = None  # Tether's session label (the tags'); a tmux handle's is the tmux session's name
    instance: str | None = None

    def dump(self) -> dict[str, Any]:
        return ({"backend": self.backend} if self.backend else {}) | super().dump()

    @property
    def started(self) -> bool:
        """The process's own handle, not a launch's step."""
        return self.launch is None

    @property
    def held(self) -> bool:
        """A session holder keeps the program (it outlives its owner)."""
        return False

    def ends_with_worker(self) -> str:
        """Why a started shell ends with its worker, "" when it does not (a holder or a tmux server keeps
        it) or it is not started."""
        return ""


@dataclass(frozen=True, kw_only=True)
class Claimed(Handle):
    """A claimed execution's lease before its owner asked any backend for anything."""


CLAIMED = Claimed(launch=Launch.CLAIMED)
UNHELD = "no session holder runs on its host (TETHER_HOLDER is off, or it is not built)"


@dataclass(frozen=True, kw_only=True)
class HeldHandle(Handle):
    """A program a session holder keeps (``holder``: it outlives its worker), or one its worker holds itself
    (``unheld`` may say why no holder keeps it); ``process`` is the program as this host's /proc sees it."""

    process: ProcessIdentity | None = None
    holder: Holder | None = None
    unheld: str | None = None

    @staticmethod
    def codecs_with(holder: type[Holder]) -> dict[str, Codec]:
        return {**Handle.codecs, "process": IDENTITY, "holder": (holder.load, holder.dump)}

    @property
    def held(self) -> bool:
        return self.holder is not None

    def ends_with_worker(self) -> str:
        return "" if self.launch or self.holder else (self.unheld or UNHELD)


@dataclass(frozen=True, kw_only=True)
class LocalHandle(HeldHandle):
    """A PTY child on the worker's host, or a session holder's there."""

    backend: ClassVar[str] = "local"
    codecs: ClassVar[dict[str, Codec]] = HeldHandle.codecs_with(LocalHolder)
    holder: LocalHolder | None = None


@dataclass(frozen=True, kw_only=True)
class DockerHandle(HeldHandle):
    """An exec in a container of an engine (``engine`` "": the default one), or a session holder's there
    (``exec_id``: the holder's serve exec). ``process`` is set where a local engine shares this host's /proc."""

    backend: ClassVar[str] = "docker"
    codecs: ClassVar[dict[str, Codec]] = HeldHandle.codecs_with(DockerHolder)
    holder: DockerHolder | None = None
    engine: str | None = None
    container: str | None = None
    exec_id: str | None = None
    owner_pid: int | None = None
    owner_started_at: int | None = None


@dataclass(frozen=True, kw_only=True)
class TmuxHandle(Handle):
    """A pane of a session on a tmux server (its socket's name); the server keeps it."""

    backend: ClassVar[str] = "tmux"
    socket: str | None = None
    pane: str | None = None


KINDS: dict[str, type[Handle]] = {kind.backend: kind for kind in (LocalHandle, DockerHandle, TmuxHandle)}


@dataclass(frozen=True, kw_only=True)
class Unreadable(Handle):
    """A handle this release cannot read: of a backend it does not have (a later release's), or with no
    backend at all. Kept as it came and written back unchanged; no backend of this release is asked about it."""

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Self:
        marker = data.get("marker")
        return cls(extra=dict(data), marker=marker if isinstance(marker, str) else None)

    def dump(self) -> dict[str, Any]:
        return dict(self.extra)

    @property
    def started(self) -> bool:
        return "launch" not in self.extra  # a step of a launch this release may not know

    @property
    def why(self) -> str:
        backend = self.extra.get("backend")
        if backend is None:
            return "a handle without a backend"
        if backend not in KINDS:
            return f"a handle of backend {backend!r}, which this release does not have"
        return f"a {backend} handle in a form this release cannot read"


def load(data: Mapping[str, Any] | Handle | None) -> Handle | None:
    """The handle a lease's JSON says; None for none (``{}``). Reading never fails (every query that reads a
    lease reads its handle): what this release cannot read, a later release's backend or value, is
    ``Unreadable``."""
    if data is None or isinstance(data, Handle):
        return data
    if not data:
        return None
    backend = data.get("backend")
    if backend is None and data.get("launch") == Launch.CLAIMED:
        return Claimed.load(data)
    try:
        return KINDS[backend].load(data) if backend in KINDS else Unreadable.load(data)
    except (ValueError, KeyError, TypeError, AttributeError):  # a launch step, a process of a later shape
        return Unreadable.load(data)


def dump(handle: Handle | None) -> dict[str, Any]:
    return handle.dump() if handle is not None else {}


def intent(backend: str, **values: Any) -> Handle:
    """What an owner saves before it asks ``backend`` to start a program (``Launch.SPAWNING``)."""
    return KINDS[backend](launch=Launch.SPAWNING, **values)


def starting(handle: Handle) -> Handle:
    """A created, not yet started process's handle (a docker exec between create and start)."""
    return replace(handle, launch=Launch.STARTING)
