"""Where finished recordings are kept: gzip-compressed ``.cast`` files in Django's ``recordings`` storage
(files under ``TETHER_RECORDINGS_DIR`` by default, or any storage ``TETHER_RECORDINGS_STORAGE`` names)."""

from __future__ import annotations

import gzip
import tempfile
from collections.abc import Iterable, Iterator

from django.core.files import File
from django.core.files.storage import Storage, storages

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
