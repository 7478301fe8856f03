"""PostgreSQL advisory locks held to the end of a transaction, each kind with its own class key, so that the
locks of one kind never wait on another's. On SQLite (the embedded mode: one process, one writer at a time)
they are nothing."""

from __future__ import annotations

import enum
import hashlib

from django.db import connection


class Lock(enum.IntEnum):
    """The class key of each kind of advisory lock (the first of the two 32-bit keys)."""

    FENCE = 0x7E7E_0041  # access/fence.py: every change of access, exclusive; the acts that rely on it, shared
    INPUT_ORDER = 0x7E7E_0042  # api/terminals.py: one numbered-input claim at a time per (token, session, client)
    IDENTITY = 0x7E7E_0043  # one claim of a (namespace, scope, id) at a time: a submission's or an alias's


def held_until_commit(kind: Lock, *parts: object, shared: bool = False) -> None:
    """Take the ``kind`` lock on ``parts`` until the transaction ends. With no parts it is the kind's one lock, on
    the single 64-bit key (PostgreSQL keeps those apart from the two-key ones: the fence was always taken so,
    and processes of the last release still running in a rolling deploy must meet this one on it)."""
    assert connection.in_atomic_block, "an advisory lock is taken inside the transaction it guards"
    if connection.vendor != "postgresql":
        return
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        if not parts:
            cursor.execute(f"SELECT {function}(%s)", [int(kind)])
            return
        name = ":".join(str(part) for part in parts)
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big", signed=True)
        cursor.execute(f"SELECT {function}(%s, %s)", [int(kind), key])
