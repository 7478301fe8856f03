"""How outcomes are told to people: plain functions, shared by the records and the process backends."""

from __future__ import annotations

import signal

# Docker reports a death by signal N as the wait status 128+N; signals go up to 64.
AMBIGUOUS_STATUSES = range(129, 128 + 65)


def wait_status_label(code: int) -> str:
    """A wait status of 128+N that may be a signal death, told without claiming more than its source knows."""
    number = code - 128
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"Exit status {code} (128+{number}: {name} or exit {code}; docker cannot tell)"
