"""Refusals, as Tether says them: an RFC 9457 problem with a stable ``code`` to branch on."""

from __future__ import annotations

from typing import Any


class TetherError(Exception):
    """Anything this client raises."""


class Problem(TetherError):
    """The API refused the call: ``code`` (e.g. ``not_found``, ``identity_conflict``), ``status``, ``detail``,
    and the problem's other members in ``extra`` (both digests of a conflict, where the output ends, ...)."""

    def __init__(self, status: int, code: str, detail: str, extra: dict[str, Any] | None = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.extra = status, code, detail, extra or {}


class InputUnconfirmed(Problem):
    """Keys were sent and their writing never confirmed: they may have arrived, and are never written again.
    Read the output to see; the next keys take the next number."""


class GaveUp(TetherError):
    """Retried as long as the client's policy allows, with no answer: the last error is the cause. A
    submission retried this way may still have been made: submit it again (the same call is the same one)."""
