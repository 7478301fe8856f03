"""Where finished recordings are kept: gzip-compressed ``.cast`` files in Django's ``recordings`` storage
(files under ``TETHER_RECORDINGS_DIR`` by default, or any storage ``TETHER_RECORDINGS_STORAGE`` names)."""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.utils._os import safe_makedirs

SPOOL_BYTES = 8 * 1024 * 1024  # a file larger than this is compressed on disk, not in memory


def storage() -> Storage:
    return storages["recordings"]


def save(name: str, lines: Iterable[bytes]) -> tuple[str, int]:
    """Compress ``lines`` into ``name`` (replacing a file an interrupted save left there); returns the name the
    storage gave it and its compressed size."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        with gzip.GzipFile(fileobj=spool, mode="wb", mtime=0, compresslevel=6) as packed:
            for line in lines:
                packed.write(line)
        size = spool.tell()
        spool.seek(0)
        store = storage()
        if store.exists(name):
            store.delete(name)
        return store.save(name, File(spool, name=name)), size


def read(name: str) -> Iterator[bytes]:
    """The file's lines, decompressed as they are read."""
    with storage().open(name, "rb") as stored, gzip.GzipFile(fileobj=stored) as unpacked:
        yield from unpacked


def remove(name: str) -> None:
    if name and storage().exists(name):
        storage().delete(name)


# --- chunks of recordings still being made ---------------------------------------------------------
#
# While a shell prints, its owner writes the recording's events in chunks (recordings/actions/recordings.py):
# each chunk a file of its own under ``chunks/<recording>/`` in this storage, and a small row in the database
# naming it (written after the file, fenced by the owner's lease). The files are removed once the recording is
# made into its one file, by the cleanup (recordings.actions.remove_leftover_chunks), with any chunk whose row
# was never written (its writer died between the two).

CHUNKS = "chunks"


def save_chunk(recording_pk: int, number: int, data: bytes) -> str:
    """Write one chunk of a recording as a new file (never over another: a name of its own for each write) and
    return its name. On a local disk the file is on the disk (fsync) before this returns: the row that names
    it is committed next, and PostgreSQL's commit is on its disk too."""
    store = storage()
    name = f"{CHUNKS}/{recording_pk}/{number:09d}-{uuid.uuid4().hex[:12]}"
    try:
        path = store.path(name)
    except NotImplementedError:  # an object store: its own put
        return store.save(name, ContentFile(data, name=name))
    directory = os.path.dirname(path)
    made = not os.path.isdir(directory)
    if made and getattr(store, "directory_permissions_mode", None) is not None:
        safe_makedirs(directory, store.directory_permissions_mode, exist_ok=True)
    elif made:
        os.makedirs(directory, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # as Django's storage: the umask, then
    try:
        if getattr(store, "file_permissions_mode", None) is not None:  # ... its mode, when it names one
            os.fchmod(fd, store.file_permissions_mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    # The file's name on the disk too (its directory's entry; the directory's own, when it is new).
    for synced in (directory, os.path.dirname(directory)) if made else (directory,):
        _fsync_directory(synced)
    return name


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_chunk(name: str) -> bytes | None:
    """A chunk's bytes; None when the storage no longer has it (any other error is raised: try again later)."""
    try:
        with storage().open(name, "rb") as stored:
            return stored.read()
    except FileNotFoundError:
        return None


def remove_chunk(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        storage().delete(name)


def has_chunks(recording_pk: int) -> bool:
    """Whether this storage holds any chunk file of the recording."""
    try:
        return bool(storage().listdir(f"{CHUNKS}/{recording_pk}")[1])
    except FileNotFoundError:
        return False


def remove_chunks(recording_pk: int, *, dry_run: bool = False) -> int:
    """Remove every chunk file of a recording (those its rows name and any a writer left without a row);
    returns how many (would go, with ``dry_run``)."""
    store, directory = storage(), f"{CHUNKS}/{recording_pk}"
    try:
        _, files = store.listdir(directory)
    except FileNotFoundError:
        return 0
    if dry_run:
        return len(files)
    for file in files:
        remove_chunk(f"{directory}/{file}")
    with contextlib.suppress(NotImplementedError, OSError):
        os.rmdir(store.path(directory))  # a local directory stays behind otherwise (an object store has none)
    return len(files)


def chunk_dirs() -> list[int]:
    """The recordings that have chunk files in the storage."""
    try:
        directories, _ = storage().listdir(CHUNKS)
    except FileNotFoundError:
        return []
    return [int(directory) for directory in directories if directory.isdigit()]
