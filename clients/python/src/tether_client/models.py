"""What the API answers, as typed objects. Each keeps the whole answer in ``raw`` for members added later."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

FINAL_STATES = frozenset({"completed", "cancelled", "resolved"})


@dataclass(frozen=True)
class Execution:
    id: int
    scope: str
    execution_id: str
    machine: str
    state: str  # pending, dispatched, running, completed, cancelled, unknown or resolved
    evidence: str
    exit_code: int | None
    exit_signal: int | None
    outcome: str  # in words; "unknown" is never made into an exit
    aliases: tuple[tuple[str, str], ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def final(self) -> bool:
        """Settled: the record will not change again."""
        return self.state in FINAL_STATES

    @property
    def unknown(self) -> bool:
        """Its outcome is not known (the program may still run somewhere) until an operator resolves it."""
        return self.state == "unknown"

    @classmethod
    def of(cls, data: dict[str, Any]) -> Execution:
        return cls(
            id=data["id"],
            scope=data["scope"],
            execution_id=data["execution_id"],
            machine=data["machine"],
            state=data["state"],
            evidence=data["evidence"],
            exit_code=data["exit_code"],
            exit_signal=data["exit_signal"],
            outcome=data["outcome"],
            aliases=tuple((a["scope"], a["id"]) for a in data.get("aliases", [])),
            raw=data,
        )


@dataclass(frozen=True)
class Submission:
    created: bool  # False: this (scope, id, spec) was submitted before, and nothing runs again
    execution: Execution


@dataclass(frozen=True)
class Outcome:
    """What an await or a stream's end says: the record, and what it waits for (``nothing`` once final;
    ``operator`` while the outcome is unknown: no exit will be made up)."""

    final: bool
    awaiting: str  # nothing, start, program or operator
    detail: str
    execution: Execution
    complete: bool = True  # False: a worker was lost while it ran, and what it printed meanwhile is not kept

    @classmethod
    def of(cls, data: dict[str, Any]) -> Outcome:
        execution = Execution.of(data["execution"])
        final = data.get("final", execution.final)
        return cls(final, data["awaiting"], data["detail"], execution, data.get("complete", True))


@dataclass(frozen=True)
class Chunk:
    """A piece of a command on pipes: its stream, where it starts there, and in both (``seq``)."""

    stream: str  # stdout or stderr
    offset: int
    seq: int
    data: bytes


@dataclass(frozen=True)
class Output:
    """Bytes of output from ``offset``; ``lost`` bytes before them are no longer kept (never a silent gap).
    Read on from ``next``."""

    data: bytes
    offset: int
    next: int
    lost: int
    first_kept: int
    end: int
    final: bool
    raw: dict[str, Any] = field(repr=False, compare=False)
    stream: str = "all"  # what was read: all, stdout or stderr (a command on pipes)
    chunks: tuple[Chunk, ...] = ()  # a command on pipes: data in pieces, each with its stream

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    @classmethod
    def of(cls, data: dict[str, Any]) -> Output:
        return cls(
            data=base64.b64decode(data["data"]),
            offset=data["offset"],
            next=data["next"],
            lost=data["lost"],
            first_kept=data["first_kept"],
            end=data["end"],
            final=bool(data.get("final", False)),
            raw=data,
            stream=data.get("stream", "all"),
            chunks=tuple(
                Chunk(c["stream"], c["offset"], c["seq"], base64.b64decode(c["data"])) for c in data.get("chunks") or ()
            ),
        )


@dataclass(frozen=True)
class TerminalState:
    id: str
    machine: str
    generation: int
    process_state: str  # live, closing or closed
    close_reason: str
    outcome: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, data: dict[str, Any]) -> TerminalState:
        return cls(
            id=str(data["id"]),
            machine=data["machine"],
            generation=data["generation"],
            process_state=data["process_state"],
            close_reason=data["close_reason"],
            outcome=data["outcome"],
            raw=data,
        )


@dataclass(frozen=True)
class Written:
    seq: int
    repeated: bool  # this number had been written before: not written again
