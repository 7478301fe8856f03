"""Input numbered per client and written at most once however often a call is retried: a command's stdin on
pipes, and a terminal's keys (with its output read by offset)."""

from __future__ import annotations

import base64
import time
import uuid
from typing import TYPE_CHECKING, Any

from tether_client.errors import GaveUp, Problem
from tether_client.models import Output, TerminalState, Written

if TYPE_CHECKING:
    from tether_client.client import Client


class _Numbered:
    """Input numbered per ``client_id`` and written at most once however often a call is retried."""

    _path = ""

    def __init__(self, client: Client, *, client_id: str | None, first_seq: int):
        self._client = client
        self.client_id = client_id or uuid.uuid4().hex[:16]
        self.seq = first_seq  # the number the next input takes
        self._pending: dict[str, Any] | None = None  # input sent whose answer never came

    def _send(self, data: str | bytes, **more: Any) -> Written:
        """``data`` under the next number. Input whose answer never came (``GaveUp``) is sent again first, under
        its own number: a number is written at most once, so nothing is written twice. Raises
        ``InputUnconfirmed`` when input was taken and its writing never confirmed (never written again; read the
        output to see); the next input takes the next number."""
        if self._pending is not None:
            self._deliver(self._pending)
        body: dict[str, Any] = {"seq": self.seq, "client": self.client_id, **more}
        if isinstance(data, str):
            body["data"] = data
        else:
            body["data_b64"] = base64.b64encode(data).decode()
        return self._deliver(body)

    def _deliver(self, body: dict[str, Any]) -> Written:
        self._pending = body  # until an answer says what became of it
        try:
            answer = self._client._call("POST", self._path, json=body)
        except GaveUp:
            raise
        except Problem as problem:
            self._pending = None  # answered: taken and unconfirmed, or refused (its number not taken)
            if problem.code == "input_unconfirmed":
                self.seq = body["seq"] + 1
            raise
        self._pending = None
        self.seq = body["seq"] + 1
        return Written(answer["seq"], answer["repeated"])


class Stdin(_Numbered):
    """The stdin of a command on pipes."""

    def __init__(self, client: Client, execution: int, *, client_id: str | None = None, first_seq: int = 0):
        super().__init__(client, client_id=client_id, first_seq=first_seq)
        self.execution = execution
        self._path = f"/executions/{execution}/input"

    def write(self, data: str | bytes) -> Written:
        """Bytes for its stdin (at most 64 KiB a call)."""
        return self._send(data)

    def close(self, data: str | bytes = b"") -> Written:
        """Its end (after ``data``, if any): the program reads end-of-file."""
        return self._send(data, eof=True)


class Terminal(_Numbered):
    """A shell held by Tether. Keys are numbered (per ``client_id``) and written at most once however often a
    call is retried; output is read by offset and follows the shell across a reset or a change of worker."""

    def __init__(self, client: Client, state: TerminalState, *, client_id: str | None = None, first_seq: int = 1):
        super().__init__(client, client_id=client_id, first_seq=first_seq)
        self.state = state
        self.id = state.id
        self._path = f"/terminals/{self.id}/input"
        self.since, self.generation, self.epoch = 0, state.generation, None

    def refresh(self) -> TerminalState:
        self.state = TerminalState.of(self._client._call("GET", f"/terminals/{self.id}"))
        return self.state

    def send(self, keys: str | bytes) -> Written:
        """Type ``keys``, under the next number (see ``_send``: never typed twice)."""
        return self._send(keys)

    def read(self, *, wait: float = 0) -> Output:
        """The output from where the last read ended. After a reset or an adoption that starts the stream
        again, it starts the new one (``raw["restarted"]``)."""
        params: dict[str, Any] = {"since": self.since, "wait": wait, "generation": self.generation}
        if self.epoch is not None:
            params["epoch"] = self.epoch
        piece = Output.of(self._client._call("GET", f"/terminals/{self.id}/output", params=params))
        self.since = piece.next
        self.generation = piece.raw.get("generation") or self.generation
        self.epoch = piece.raw.get("epoch") or self.epoch
        return piece

    def read_until(self, marker: bytes | str, *, timeout: float = 30) -> bytes:
        """Read until ``marker`` has come; what was read (raises ``TimeoutError`` with it otherwise)."""
        marker = marker.encode() if isinstance(marker, str) else marker
        seen, deadline = bytearray(), time.monotonic() + timeout
        while marker not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{marker!r} did not come in {timeout} s; read: {bytes(seen[-500:])!r}")
            seen += self.read(wait=min(left, 10)).data
        return bytes(seen)

    def resize(self, cols: int, rows: int) -> TerminalState:
        self.state = TerminalState.of(
            self._client._call("POST", f"/terminals/{self.id}/resize", json={"cols": cols, "rows": rows})
        )
        return self.state

    def reset(self, *, reason: str = "") -> TerminalState:
        answer = self._client._call("POST", f"/terminals/{self.id}/reset", json={"reason": reason}, safe=False)
        self.state = TerminalState.of(answer)
        return self.state

    def close(self, *, reason: str = "") -> TerminalState:
        answer = self._client._call("POST", f"/terminals/{self.id}/close", json={"reason": reason}, safe=False)
        self.state = TerminalState.of(answer)
        return self.state
