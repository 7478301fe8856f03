"""The client: each call of the API, retried only where a retry cannot do a thing twice.

What may be sent again after its answer was lost (a dropped connection, a proxy's 502, a restarting daphne):
reads, a submission (the same (scope, id, spec) is the same execution, and nothing runs again), an alias, an
open of a terminal (the open one is reattached), numbered input (a number is written at most once), a resize.
What is sent again only when it surely did nothing (the connection was refused, or Tether said 429 or 503):
cancel, resolve, reset and close.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import httpx

from tether_client import calls, files
from tether_client.calls import Retry, call
from tether_client.errors import GaveUp, Problem
from tether_client.models import Execution, Outcome, Output, Submission, TerminalState
from tether_client.numbered import Stdin, Terminal
from tether_client.sse import events


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
        return call(self._http, self.retry, method, path, json=json, params=params, safe=safe)

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
                        if answer.status_code not in calls.RETRIED_STATUS:
                            calls.answer(answer)  # raises its problem
                        raise calls.problem(answer)
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
                if isinstance(error, Problem) and (error.status not in calls.RETRIED_STATUS):
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
        return files.download(self._http, self.retry, machine, path, to)

    def upload(self, machine: str, path: str, data: bytes | BinaryIO, *, tar: bool = False) -> dict[str, Any]:
        """``data`` (bytes, or a file opened for reading in binary) to ``path`` on ``machine``, moved into place
        once whole; ``tar``: a tar extracted into ``path``. ``{"path", "size", "sha256", "tar"}``. Sent again
        after a lost answer (the same bytes to the same path are the same file)."""
        return files.upload(self._http, self.retry, machine, path, data, tar=tar)

    # --- terminals ------------------------------------------------------------------------------------------

    def open_terminal(self, machine: str) -> Terminal:
        """A shell on ``machine``: a new one, or the one open there (yours) reattached."""
        answer = self._call("POST", "/terminals", json={"machine": machine})
        return Terminal(self, TerminalState.of(answer["terminal"]))

    def terminal(self, session: str) -> Terminal:
        return Terminal(self, TerminalState.of(self._call("GET", f"/terminals/{session}")))

    def terminals(self, *, limit: int = 50) -> list[TerminalState]:
        return [TerminalState.of(t) for t in self._call("GET", "/terminals", params={"limit": limit})]
