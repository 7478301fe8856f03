"""The client: each call of the API, retried only where a retry cannot do a thing twice.

What may be sent again after its answer was lost (a dropped connection, a proxy's 502, a restarting daphne):
reads, a submission (the same (scope, id, spec) is the same execution, and nothing runs again), an alias, an
open of a terminal (the open one is reattached), numbered input (a number is written at most once), a resize.
What is sent again only when it surely did nothing (the connection was refused, or Tether said 429 or 503):
cancel, resolve, reset and close.
"""

from __future__ import annotations

import base64
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import httpx

from tether_client.errors import GaveUp, InputUnconfirmed, Problem
from tether_client.models import Execution, Outcome, Output, Submission, TerminalState, Written
from tether_client.sse import events

RETRIED_STATUS = frozenset({429, 502, 503, 504})
DONE_NOTHING_STATUS = frozenset({429, 503})  # Tether's own answers when it did nothing (rate limited, no worker)


@dataclass(frozen=True)
class Retry:
    """How long a call is tried again: ``attempts`` in all, waiting from ``first_delay`` doubling to
    ``max_delay`` (with jitter), or what a ``Retry-After`` says."""

    attempts: int = 8
    first_delay: float = 0.25
    max_delay: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.first_delay * 2**attempt) * random.uniform(0.75, 1.25)


class Client:
    """A Tether API client. ``url`` is Tether's address (``https://tether.example.com``); ``token`` an API
    token (``tether_…``) with the scopes the calls need (read, run, terminals)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        retry: Retry | None = None,
        timeout: float = 90.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.retry = retry or Retry()
        self._http = httpx.Client(
            base_url=url.rstrip("/").removesuffix("/api/v1") + "/api/v1",  # the site's address, or the API's
            headers={"Authorization": f"Bearer {token}", "User-Agent": "tether-client/0.1"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the calls ---------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, json: Any = None, params: dict | None = None, safe: bool = True) -> Any:
        """One call, tried again as the policy allows; its JSON answer, or the ``Problem`` it was refused with."""
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            wait = self.retry.delay(attempt)
            try:
                response = self._http.request(method, path, json=json, params=params)
            except httpx.ConnectError as error:  # never sent: trying again cannot do it twice
                last = error
            except httpx.TransportError as error:  # sent, and the answer lost: it may have been done
                if not safe:
                    raise GaveUp(f"{method} {path}: the answer was lost; it may have been done") from error
                last = error
            else:
                if response.status_code in (DONE_NOTHING_STATUS if not safe else RETRIED_STATUS):
                    last = _problem(response)
                    wait = max(wait, _retry_after(response))
                else:
                    return _answer(response)
            if attempt + 1 < self.retry.attempts:
                time.sleep(wait)
        raise GaveUp(f"{method} {path}: no answer after {self.retry.attempts} tries") from last

    # --- machines and executions ----------------------------------------------------------------------------

    def machines(self) -> list[dict[str, Any]]:
        """The machines you may reach, with your role on each."""
        return self._call("GET", "/machines")

    def submit(
        self,
        scope: str,
        id: str,
        *,
        machine: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: str = "",
        cols: int | None = None,
        rows: int | None = None,
        session_seconds: int | None = None,
        idle_seconds: int | None = None,
        output_limit_bytes: int | None = None,
        aliases: Sequence[tuple[str, str]] = (),
        pty: bool = True,
    ) -> Submission:
        """Submit a command under your (scope, id). Sent again (by you or by the retries) with the same spec,
        it answers the same execution and runs nothing again; with another spec, ``Problem`` identity_conflict.
        ``pty=False`` runs it on pipes: stdout and stderr apart (``read(stream=...)``), stdin by ``stdin()``."""
        body: dict[str, Any] = {"scope": scope, "id": id, "machine": machine, "argv": list(argv)}
        if not pty:
            body["pty"] = False
        optional = {"env": env, "cwd": cwd or None, "cols": cols, "rows": rows, "session_seconds": session_seconds,
                    "idle_seconds": idle_seconds, "output_limit_bytes": output_limit_bytes}  # fmt: skip
        body |= {name: value for name, value in optional.items() if value is not None}
        if aliases:
            body["aliases"] = [{"scope": s, "id": i} for s, i in aliases]
        answer = self._call("POST", "/executions", json=body)
        return Submission(answer["created"], Execution.of(answer["execution"]))

    def get(self, execution: int) -> Execution:
        return Execution.of(self._call("GET", f"/executions/{execution}"))

    def lookup(self, scope: str, id: str) -> Execution:
        """Yours by (scope, id), or by one of its aliases; ``Problem`` not_found when there is none."""
        return Execution.of(self._call("GET", "/executions/lookup", params={"scope": scope, "id": id}))

    def list(self, scope: str, *, limit: int = 50) -> list[Execution]:
        return [Execution.of(e) for e in self._call("GET", "/executions", params={"scope": scope, "limit": limit})]

    def add_alias(self, execution: int, scope: str, id: str) -> Execution:
        """Let another (scope, id) of yours name it too."""
        return Execution.of(self._call("POST", f"/executions/{execution}/aliases", json={"scope": scope, "id": id}))

    def await_outcome(self, execution: int, *, timeout: float = 30) -> Outcome:
        """One long poll: returns when it is final, or after ``timeout`` seconds with what it awaits."""
        return Outcome.of(self._call("GET", f"/executions/{execution}/await", params={"timeout": timeout}))

    def wait(self, execution: int, *, timeout: float | None = None) -> Outcome:
        """Wait until it is final, or its outcome is unknown (``awaiting == "operator"``: no exit code is made
        up; an operator resolves it), or ``timeout`` seconds have passed (then ``final`` is False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, deadline - time.monotonic())
            outcome = self.await_outcome(execution, timeout=min(60.0, left))
            if outcome.final or outcome.awaiting == "operator" or (deadline and time.monotonic() >= deadline):
                return outcome

    def read(
        self, execution: int, *, since: int = 0, wait: float = 0, size: int | None = None, stream: str = "all"
    ) -> Output:
        """One read of its output from ``since`` (at most 64 KiB), waiting up to ``wait`` seconds for news. A
        command on pipes: ``stream`` "stdout", "stderr" or "all" (both, in the order they came; ``chunks`` says
        which is which), ``since`` counting in that stream."""
        params: dict[str, Any] = {"since": since, "wait": wait} | ({"size": size} if size else {})
        params |= {"stream": stream} if stream != "all" else {}
        return Output.of(self._call("GET", f"/executions/{execution}/output", params=params))

    def output(self, execution: int, *, since: int = 0, wait: float = 30, stream: str = "all") -> Iterator[Output]:
        """Its output from ``since`` as it comes (long polls), to its end. Each piece says what was ``lost``
        before it; resume later from the last piece's ``next``."""
        while True:
            piece = self.read(execution, since=since, wait=wait, stream=stream)
            if piece.data or piece.lost:
                yield piece
            since = piece.next
            if piece.final:
                return

    def stream(self, execution: int, *, since: int = 0, stream: str = "all") -> Iterator[Output | Outcome]:
        """Its output pushed (Server-Sent Events) from ``since``, then its ``Outcome``. A cut stream (a proxy,
        a daphne, a worker restarting) is resumed from the last offset received: nothing lost, nothing twice."""
        failures, resumed = 0, False
        while True:
            try:
                headers = {"Accept": "text/event-stream"} | ({"Last-Event-ID": str(since)} if resumed else {})
                params: dict[str, Any] = {} if resumed else {"since": since}
                params |= {"stream": stream} if stream != "all" else {}
                path = f"/executions/{execution}/output/stream"
                with self._http.stream("GET", path, headers=headers, params=params) as answer:
                    resumed = True
                    if answer.status_code == 204:  # resumed at the end of output that is over: how it ended
                        yield self.wait(execution)
                        return
                    if answer.status_code >= 400:
                        answer.read()
                        if answer.status_code not in RETRIED_STATUS:
                            _answer(answer)  # raises its problem
                        raise _problem(answer)
                    for kind, data in events(answer.iter_lines()):
                        failures = 0
                        if kind == "output":
                            piece = Output.of(data)
                            since = piece.next
                            yield piece
                        elif kind == "end":
                            yield Outcome.of(data)
                            return
                        elif kind == "error":
                            raise Problem(0, data.get("code", "error"), data.get("detail", ""), data)
                # Closed without an end (the stream's time was up): go on from where it was.
            except (httpx.TransportError, Problem) as error:
                if isinstance(error, Problem) and (error.status not in RETRIED_STATUS):
                    raise
                failures += 1
                if failures >= self.retry.attempts:
                    raise GaveUp(f"the output stream of {execution} broke {failures} times") from error
                time.sleep(self.retry.delay(failures - 1))

    def stdin(self, execution: int, *, client_id: str | None = None, first_seq: int = 0) -> Stdin:
        """The stdin of a command on pipes (``pty=False``): ``write`` bytes to it, ``close`` it (EOF)."""
        return Stdin(self, execution, client_id=client_id, first_seq=first_seq)

    def cancel(self, execution: int, *, reason: str = "") -> Execution:
        """Pending: cancelled at once. Running: its owner is asked to end it (await the outcome)."""
        return Execution.of(self._call("POST", f"/executions/{execution}/cancel", json={"reason": reason}, safe=False))

    def resolve(self, execution: int, *, note: str) -> Execution:
        """An unknown outcome resolved by an operator (staff with the permission), with what shows it is gone."""
        return Execution.of(self._call("POST", f"/executions/{execution}/resolve", json={"note": note}, safe=False))

    # --- files ----------------------------------------------------------------------------------------------

    def list_files(self, machine: str, path: str) -> dict[str, Any]:
        """A directory on ``machine``: ``{"path": as it resolved there, "entries": [{name, type, size, mode,
        modified}]}``."""
        return self._call("GET", f"/machines/{machine}/files", params={"path": path})

    def download(self, machine: str, path: str, to: BinaryIO) -> int:
        """The file at ``path`` on ``machine``, written to ``to``; how many bytes. A body shorter than its
        Content-Length (the file changed while it was read, or the connection broke) is started again (the
        bytes already written are written again: give a file you can truncate), then raised as ``GaveUp``."""
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            start, written = to.tell(), 0
            try:
                with self._http.stream("GET", f"/machines/{machine}/files/content", params={"path": path}) as answer:
                    if answer.status_code >= 400:
                        answer.read()
                        if answer.status_code not in RETRIED_STATUS:
                            _answer(answer)  # raises its problem
                        raise _problem(answer)
                    size = int(answer.headers["Content-Length"])
                    for chunk in answer.iter_bytes():
                        to.write(chunk)
                        written += len(chunk)
                    if written == size:
                        return written
                    last = Problem(0, "incomplete", f"{written} of {size} bytes arrived")
            except (httpx.TransportError, Problem) as error:
                if isinstance(error, Problem) and error.status not in RETRIED_STATUS:
                    raise
                last = error
            to.seek(start)
            to.truncate()
            if attempt + 1 < self.retry.attempts:
                time.sleep(self.retry.delay(attempt))
        raise GaveUp(f"download of {path} from {machine}: no whole file after {self.retry.attempts} tries") from last

    def upload(self, machine: str, path: str, data: bytes | BinaryIO, *, tar: bool = False) -> dict[str, Any]:
        """``data`` (bytes, or a file opened for reading in binary) to ``path`` on ``machine``, moved into place
        once whole; ``tar``: a tar extracted into ``path``. ``{"path", "size", "sha256", "tar"}``. Sent again
        after a lost answer (the same bytes to the same path are the same file)."""
        kind = "application/x-tar" if tar else "application/octet-stream"
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            if isinstance(data, bytes):
                body, size = data, len(data)
            else:  # read again from its start on each try
                size = data.seek(0, 2)
                data.seek(0)
                body = data
            headers = {"Content-Type": kind, "Content-Length": str(size)}
            try:
                answer = self._http.put(
                    f"/machines/{machine}/files/content", params={"path": path}, content=body, headers=headers
                )
            except httpx.TransportError as error:
                last = error
            else:
                if answer.status_code not in RETRIED_STATUS:
                    return _answer(answer)
                last = _problem(answer)
            if attempt + 1 < self.retry.attempts:
                time.sleep(self.retry.delay(attempt))
        raise GaveUp(f"upload of {path} to {machine}: no answer after {self.retry.attempts} tries") from last

    # --- terminals ------------------------------------------------------------------------------------------

    def open_terminal(self, machine: str) -> Terminal:
        """A shell on ``machine``: a new one, or the one open there (yours) reattached."""
        answer = self._call("POST", "/terminals", json={"machine": machine})
        return Terminal(self, TerminalState.of(answer["terminal"]))

    def terminal(self, session: str) -> Terminal:
        return Terminal(self, TerminalState.of(self._call("GET", f"/terminals/{session}")))

    def terminals(self, *, limit: int = 50) -> list[TerminalState]:
        return [TerminalState.of(t) for t in self._call("GET", "/terminals", params={"limit": limit})]


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


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("Retry-After", 0)), 60.0)
    except ValueError:
        return 0.0


def _problem(response: httpx.Response) -> Problem:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = body.get("code") or f"http_{response.status_code}"
    kind = InputUnconfirmed if code == "input_unconfirmed" else Problem
    detail = body.get("detail") or response.reason_phrase
    extra = {k: v for k, v in body.items() if k not in {"type", "title", "status", "code", "detail"}}
    return kind(response.status_code, code, detail, extra)


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise _problem(response)
    return response.json()
