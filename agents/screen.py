"""A terminal's screen as text, rebuilt from its output by a terminal emulator (pyte) at the grid its program
draws: what an agent reads instead of escape sequences. Said honestly: when output before the replayed part
is gone (or older than what is replayed), rows drawn before it may be missing, and the answer says so."""

from __future__ import annotations

import asyncio
import base64
import uuid

import pyte
from channels.db import database_sync_to_async as db
from pydantic import BaseModel, Field

from api import terminals as api_terminals
from api.output import READ_BYTES


class Cursor(BaseModel):
    row: int = Field(description="0 is the top row")
    col: int
    visible: bool


class Screen(BaseModel):
    terminal: uuid.UUID
    process_state: str = Field(description="live, closing or closed")
    cols: int
    rows: int
    lines: list[str] = Field(description="The screen's rows, top to bottom, trailing blanks removed")
    cursor: Cursor
    offset: int = Field(description="The screen as of this output offset (the output's end when read)")
    from_offset: int = Field(description="Rebuilt from the output from this offset on")
    complete: bool = Field(
        description="True: rebuilt from the shell's first byte. False: output before from_offset was not "
        "replayed (no longer kept, or older than what is replayed), so rows drawn before it may be missing"
    )
    detail: str

    def said(self) -> str:
        rows = list(self.lines)
        while rows and not rows[-1]:
            rows.pop()
        head = f"[terminal {self.terminal} ({self.process_state}), {self.cols}x{self.rows}, cursor row "
        head += f"{self.cursor.row} col {self.cursor.col}, as of offset {self.offset}"
        head += "]" if self.complete else f"; {self.detail}]"
        return "\n".join([head, *rows])


def _draw(data: bytes, cols: int, rows: int) -> tuple[list[str], pyte.screens.Cursor]:
    screen = pyte.Screen(cols, rows)
    pyte.ByteStream(screen).feed(data)
    return [line.rstrip() for line in screen.display], screen.cursor


async def render(call, terminal: uuid.UUID, limit: int, attempts: int = 3) -> Screen:
    """``terminal``'s screen (the caller's own session: the API's reads, with their refusals), rebuilt from at
    most ``limit`` bytes of the end of its output: all from one stream (a reset or an adoption that moves the
    offsets meanwhile starts it again)."""
    first = await api_terminals.terminal_output(call, terminal, 0, None, None, 1, 0.0)
    stream = first.get("generation"), first.get("epoch")
    end = first["end"]
    start = max(first["offset"], end - limit)
    data, at = bytearray(), start
    cols, rows = first.get("cols"), first.get("rows")
    while at < end:
        piece = await api_terminals.terminal_output(call, terminal, at, *stream, READ_BYTES, 0.0)
        if piece.get("restarted"):  # another stream now: what was read is not its screen
            if attempts > 1:
                return await render(call, terminal, limit, attempts - 1)
            break
        if not (piece["data"] or piece["lost"]):
            break
        if piece["lost"]:  # gone while it was read: start again after it
            data.clear()
            start = piece["offset"]
        data += base64.b64decode(piece["data"])
        at = piece["next"]
        cols, rows = piece.get("cols") or cols, piece.get("rows") or rows
    session = await db(api_terminals.terminal_state)(call, terminal)
    spec = session["execution"]["spec"]
    cols, rows = cols or spec.get("cols", 80), rows or spec.get("rows", 24)
    lines, cursor = await asyncio.to_thread(_draw, bytes(data), cols, rows)
    complete = start == 0
    if complete:
        detail = "rebuilt from all of its output"
    elif first["lost"] or start == first["offset"]:
        detail = f"the {start} bytes of output before offset {start} are no longer kept: rows drawn then may be missing"
    else:
        detail = f"rebuilt from the last {end - start} bytes of output: rows drawn before offset {start} may be missing"
    return Screen(
        terminal=terminal, process_state=session["process_state"], cols=cols, rows=rows, lines=lines,
        cursor=Cursor(row=cursor.y, col=cursor.x, visible=not cursor.hidden), offset=at, from_offset=start,
        complete=complete, detail=detail,
    )  # fmt: skip
