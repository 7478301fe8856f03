"""Session lifetimes: idle, deadline and output budget, each closing with its own reason.

A pure decision per live process, so the rules are testable without a clock or
a worker: the worker calls ``judge`` every second and acts on the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from terminals.models import CloseReason


@dataclass(frozen=True)
class Limits:
    idle_seconds: int = 0  # 0: no limit
    session_seconds: int = 0
    output_limit_bytes: int = 0


class Act(StrEnum):
    WARN = "warn"  # tell its viewers the end is near
    CLOSE = "close"  # end it now


@dataclass(frozen=True)
class Verdict:
    action: Act
    reason: str  # a CloseReason
    seconds_left: int = 0


CHECK_SECONDS = 1  # the worker judges every live process this often


def warning_lead(limit_seconds: int) -> int:
    """How long before a close the viewer is warned: a fifth of the limit, at most 5 minutes, and at least
    two check periods, so that some check always falls inside the window (a close is never unannounced)."""
    return max(2 * CHECK_SECONDS, min(300, limit_seconds // 5))


def judge(
    limits: Limits, *, now: float, started: float, last_activity: float, produced: int, interactive: bool
) -> Verdict | None:
    """What should happen to a process now. Closing wins over warning; the deadline over idleness."""
    if limits.output_limit_bytes and produced > limits.output_limit_bytes:
        return Verdict(Act.CLOSE, CloseReason.OUTPUT_LIMIT)
    candidates = []
    if limits.session_seconds:
        candidates.append((CloseReason.DEADLINE, limits.session_seconds, started + limits.session_seconds - now))
    if interactive and limits.idle_seconds:
        candidates.append((CloseReason.IDLE, limits.idle_seconds, last_activity + limits.idle_seconds - now))
    for reason, _limit, left in candidates:
        if left <= 0:
            return Verdict(Act.CLOSE, reason)
    for reason, limit, left in candidates:
        if left <= warning_lead(limit):
            return Verdict(Act.WARN, reason, int(left + 0.999))
    return None
