"""One call of the API and its retries: what may be tried again (``safe``: a retry cannot do it twice), how
long to wait (``Retry``, or what a ``Retry-After`` says), and an answer read as its JSON or its problem."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from tether_client.errors import GaveUp, InputUnconfirmed, Problem

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


def call(
    http: httpx.Client,
    retry: Retry,
    method: str,
    path: str,
    *,
    json: Any = None,
    params: dict | None = None,
    safe: bool = True,
) -> Any:
    """One call, tried again as the policy allows; its JSON answer, or the ``Problem`` it was refused with."""
    last: Exception | None = None
    for attempt in range(retry.attempts):
        wait = retry.delay(attempt)
        try:
            response = http.request(method, path, json=json, params=params)
        except httpx.ConnectError as error:  # never sent: trying again cannot do it twice
            last = error
        except httpx.TransportError as error:  # sent, and the answer lost: it may have been done
            if not safe:
                raise GaveUp(f"{method} {path}: the answer was lost; it may have been done") from error
            last = error
        else:
            if response.status_code in (DONE_NOTHING_STATUS if not safe else RETRIED_STATUS):
                last = problem(response)
                wait = max(wait, retry_after(response))
            else:
                return answer(response)
        if attempt + 1 < retry.attempts:
            time.sleep(wait)
    raise GaveUp(f"{method} {path}: no answer after {retry.attempts} tries") from last


def retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("Retry-After", 0)), 60.0)
    except ValueError:
        return 0.0


def problem(response: httpx.Response) -> Problem:
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


def answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise problem(response)
    return response.json()
