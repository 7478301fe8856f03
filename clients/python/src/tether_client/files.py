"""Files in and out of a machine, streamed: a download started again while its body comes short of its
Content-Length, an upload sent again after a lost answer (the same bytes to the same path are the same file)."""

from __future__ import annotations

import time
from typing import Any, BinaryIO

import httpx

from tether_client import calls
from tether_client.calls import Retry
from tether_client.errors import GaveUp, Problem


def download(http: httpx.Client, retry: Retry, machine: str, path: str, to: BinaryIO) -> int:
    """``Client.download``: each try from where ``to`` stood, a short body truncated away before the next."""
    last: Exception | None = None
    for attempt in range(retry.attempts):
        start, written = to.tell(), 0
        try:
            with http.stream("GET", f"/machines/{machine}/files/content", params={"path": path}) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    if answer.status_code not in calls.RETRIED_STATUS:
                        calls.answer(answer)  # raises its problem
                    raise calls.problem(answer)
                size = int(answer.headers["Content-Length"])
                for chunk in answer.iter_bytes():
                    to.write(chunk)
                    written += len(chunk)
                if written == size:
                    return written
                last = Problem(0, "incomplete", f"{written} of {size} bytes arrived")
        except (httpx.TransportError, Problem) as error:
            if isinstance(error, Problem) and error.status not in calls.RETRIED_STATUS:
                raise
            last = error
        to.seek(start)
        to.truncate()
        if attempt + 1 < retry.attempts:
            time.sleep(retry.delay(attempt))
    raise GaveUp(f"download of {path} from {machine}: no whole file after {retry.attempts} tries") from last


def upload(
    http: httpx.Client, retry: Retry, machine: str, path: str, data: bytes | BinaryIO, *, tar: bool = False
) -> dict[str, Any]:
    """``Client.upload``: each try sends the whole body again (a file is read again from its start)."""
    kind = "application/x-tar" if tar else "application/octet-stream"
    last: Exception | None = None
    for attempt in range(retry.attempts):
        if isinstance(data, bytes):
            body, size = data, len(data)
        else:  # read again from its start on each try
            size = data.seek(0, 2)
            data.seek(0)
            body = data
        headers = {"Content-Type": kind, "Content-Length": str(size)}
        try:
            answer = http.put(
                f"/machines/{machine}/files/content", params={"path": path}, content=body, headers=headers
            )
        except httpx.TransportError as error:
            last = error
        else:
            if answer.status_code not in calls.RETRIED_STATUS:
                return calls.answer(answer)
            last = calls.problem(answer)
        if attempt + 1 < retry.attempts:
            time.sleep(retry.delay(attempt))
    raise GaveUp(f"upload of {path} to {machine}: no answer after {retry.attempts} tries") from last
