"""One shell's recording as its owner takes it: kept on the live process (owner/live.py), worked by the
recorder (recordings/recorder.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from recordings.asciicast import EventLog, Taken


@dataclass
class Take:
    """One shell's recording as its owner takes it."""

    pk: int
    log: EventLog
    chunks: int  # the next chunk's number
    input_recorded: bool
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    flush_due: bool = False  # a write is on its way for what came past FLUSH_BYTES
    unconfirmed: tuple[Taken, str] | None = None  # a chunk (and its file) whose write's answer was lost
    stopped: bool = False  # the lease was lost: someone else records it now
