"""A web process's questions to the worker serving a machine's files, and its answers (over the channel layer,
one answer each, on the asker's own channel)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from terminals.protocol import Message

CHUNK_BYTES = 256 * 1024  # bytes in one question or answer (the channel layer carries each whole)


class Op(StrEnum):
    LIST = "list"
    READ = "read"  # chunk number ``offset // CHUNK_BYTES``
    WRITE = "write"  # ``data`` at ``offset`` of upload ``transfer``
    FINISH = "finish"  # ``offset`` bytes in all: into place (``tar``: extracted into the path)
    ABORT = "abort"


class Failure(StrEnum):
    REFUSED = "path_refused"
    MISSING = "not_found"
    WRONG_KIND = "wrong_kind"
    ELSEWHERE = "offset_mismatch"
    DENIED = "permission_denied"
    NOT_HERE = "not_served_here"  # this worker does not serve that machine (its host, its backend)
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FilesAsk(Message):
    TYPE = "files.ask"
    reply: str
    machine: int
    op: str
    path: str
    transfer: str = ""
    offset: int = 0
    data: bytes = b""
    tar: bool = False


@dataclass(frozen=True, slots=True)
class FilesAnswer(Message):
    TYPE = "files.answer"
    ok: bool
    failure: str = ""
    text: str = ""
    data: bytes = b""
    size: int = 0  # a read: the file's size; a failed write: the bytes the upload has
    modified: int = 0  # a read: the file's modification time (seconds)
    path: str = ""  # as it resolved on the machine (a listing)
    entries: list = field(default_factory=list)  # [type, size, mode, modified, name]
    sha256: str = ""
