"""A bounded output buffer addressed by absolute byte offset.

Offsets count every byte the process ever wrote in this generation, so a
viewer that says "I have rendered up to N" gets exactly the bytes after N, or
is told precisely how many bytes are gone.
"""

from __future__ import annotations

from collections.abc import Callable


class OutputBuffer:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._data = bytearray()
        self.start = 0  # absolute offset of the oldest byte still held
        # Given each run of bytes let go of, with its offset, in order (the shell's screen: terminals.screen).
        self.on_evict: Callable[[int, bytes], None] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self._data)

    def append(self, chunk: bytes) -> int:
        """Store ``chunk``; return the absolute offset of its first byte."""
        offset = self.end
        self._data += chunk
        overflow = len(self._data) - self.capacity
        if overflow > 0:
            if self.on_evict is not None:
                self.on_evict(self.start, bytes(memoryview(self._data)[:overflow]))
            del self._data[:overflow]
            self.start += overflow
        return offset

    def evicts(self, size: int) -> bool:
        """Whether appending ``size`` more bytes lets go of some."""
        return len(self._data) + size > self.capacity

    def since(self, offset: int) -> tuple[int, bytes, int]:
        """``(first_offset, bytes, lost)``: what follows ``offset``, and how many bytes after it are gone."""
        if offset >= self.end:
            return self.end, b"", 0
        if offset < self.start:
            return self.start, bytes(self._data), self.start - offset
        return offset, bytes(self._data[offset - self.start :]), 0

    def tail(self, size: int) -> bytes:
        return bytes(self._data[-size:]) if size > 0 else b""
