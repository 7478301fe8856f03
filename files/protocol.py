"""A web process's questions to the worker serving a machine's files, and its answers (over the channel layer,
one answer each, on the asker's own channel)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from terminals.protocol import Message

# A chunk: the bytes of one question or answer, which the channel layer carries whole (at most
# TETHER_LAYER_MESSAGE_BYTES a message, 1 MiB by default, 128 KiB at the least): that, less room for the
# message's other fields. The web process chooses it and says it in each question (``chunk``).
ROOM_BYTES = 64 * 1024
SMALLEST_CHUNK = 4096


def chunk_bytes() -> int:
    from django.conf import settings

    return max(SMALLEST_CHUNK, settings.TETHER_LAYER_MESSAGE_BYTES - ROOM_BYTES)


MAX_ENTRIES = 5000  # a listing's entries at most (one answer carries them)


class Op(StrEnum):
    LIST = "list"
    READ = "read"  # chunk number ``offset // chunk``
    WRITE = "write"  # ``data`` at ``offset`` of upload ``transfer``
    FINISH = "finish"  # ``offset`` bytes in all: into place (``tar``: extracted into the path)
    ABORT = "abort"


class Failure(StrEnum):
    """Why a question failed: the API's problem code where the caller is told it as one."""

    REFUSED = "path_refused"
    MISSING = "not_found"
    WRONG_KIND = "wrong_kind"
    DENIED = "permission_denied"
    FAILED = "file_failed"
    ELSEWHERE = "offset_mismatch"  # an upload's earlier chunks are not there (the web process says what to do)
    NOT_HERE = "not_served_here"  # this worker does not serve that machine (its host, its backend)


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
    digest: str = ""  # a finish: the SHA-256 of every byte sent, checked before the file is put in place
    chunk: int = 0  # bytes a chunk (``offset`` is a whole number of them)


@dataclass(frozen=True, slots=True)
class FilesAnswer(Message):
    TYPE = "files.answer"
    ok: bool
    failure: str = ""
    text: str = ""
    data: bytes = b""
    size: int = 0  # a read: the file's size; a failed write: the bytes the upload has
    modified: int = 0  # a read: the file's modification time (seconds)
    version: str = ""  # a read: its modification and change times and inode (another version: another file)
    path: str = ""  # as it resolved on the machine (a listing)
    entries: list = field(default_factory=list)  # [type, size, mode, modified, name]
    truncated: bool = False  # a listing of more than MAX_ENTRIES
    sha256: str = ""
