"""The worker's side: it answers a web process's file questions about a machine it serves (its host's local
and tmux machines, docker machines on its engine), each in a task of its own so a slow transfer never holds
up the shells' messages, a few at a time."""

from __future__ import annotations

import asyncio
import logging
import shlex
from concurrent.futures import ThreadPoolExecutor

import docker
from channels.db import database_sync_to_async as db

from executions.models import Backend, Machine
from files import scripts
from files.protocol import MAX_ENTRIES, SMALLEST_CHUNK, Failure, FilesAnswer, FilesAsk, Op, chunk_bytes
from terminals.backends.docker import engine_client

log = logging.getLogger(__name__)

AT_ONCE = 4  # file questions answered at once by one worker (each holds at most one chunk)
EXITS = {
    scripts.REFUSED: Failure.REFUSED,
    scripts.MISSING: Failure.MISSING,
    scripts.WRONG_KIND: Failure.WRONG_KIND,
    scripts.ELSEWHERE: Failure.ELSEWHERE,
    scripts.DENIED: Failure.DENIED,
}
PROGRAMS = {Op.LIST: scripts.LIST, Op.READ: scripts.READ, Op.WRITE: scripts.WRITE, Op.FINISH: scripts.FINISH,
            Op.ABORT: scripts.ABORT}  # fmt: skip
KINDS = {"directory": "dir", "symbolic link": "link", "regular file": "file", "regular empty file": "file"}


def _machine(pk: int) -> Machine | None:
    return Machine.objects.filter(pk=pk).first()


class FileService:
    def __init__(self, context, outbox):
        self.context, self.outbox = context, outbox
        self.slots = asyncio.Semaphore(AT_ONCE)
        self.engines: dict[str, docker.APIClient] = {}
        # Its own threads for docker exec: a transfer never waits for, nor holds up, the shells' engine calls.
        self.threads = ThreadPoolExecutor(AT_ONCE, thread_name_prefix="files")

    def take(self, raw: dict) -> None:
        """A question off the worker's channel: answered in a task of its own."""
        try:
            ask = FilesAsk.decode(raw)
        except Exception as error:
            log.warning("dropped a files question: %s", error)
            return
        self.context.tasks.start(self._answer(ask), name=f"files:{ask.reply}:{ask.op}:{ask.offset}")

    async def _answer(self, ask: FilesAsk) -> None:
        async with self.slots:
            try:
                answer = await self.answer(ask)
            except Exception:
                log.exception("files %s of %s failed", ask.op, ask.path)
                answer = FilesAnswer(ok=False, failure=Failure.FAILED, text="the worker failed (its log says why)")
        await self.outbox.send(ask.reply, answer)

    async def answer(self, ask: FilesAsk) -> FilesAnswer:
        machine = await db(_machine)(ask.machine)
        worker = self.context.worker
        if (
            machine is None
            or machine.backend not in self.context.backends
            or (machine.host and worker is not None and machine.host != worker.host)
        ):
            return FilesAnswer(ok=False, failure=Failure.NOT_HERE, text="this worker does not serve that machine")
        roots = "\n".join(machine.file_roots or [])
        op = Op(ask.op)
        size = ask.chunk
        if op in (Op.READ, Op.WRITE) and not (SMALLEST_CHUNK <= size <= chunk_bytes() and ask.offset % size == 0):
            return FilesAnswer(ok=False, failure=Failure.FAILED, text=f"chunks of {size} bytes are not taken here")
        kind, chunk = "tar" if ask.tar else "file", str(ask.offset // size if size else 0)
        arguments = {
            Op.LIST: [ask.path, str(MAX_ENTRIES)],
            Op.READ: [ask.path, chunk, str(size)],
            Op.WRITE: [ask.path, ask.transfer, chunk, str(ask.offset), kind, str(size)],
            Op.FINISH: [ask.path, ask.transfer, str(ask.offset), ask.digest, kind],
            Op.ABORT: [ask.path, ask.transfer, kind],
        }[op]
        argv = ["sh", "-c", PROGRAMS[op], "sh", roots, *arguments]
        stdin = ask.data if op == Op.WRITE else None
        try:
            code, out, err = await self._run(machine, argv, stdin)
        except scripts.RunFailed as error:
            return FilesAnswer(ok=False, failure=Failure.FAILED, text=str(error))
        said = (out or err).decode(errors="replace").strip()
        if code != 0:
            failure = EXITS.get(code, Failure.FAILED)
            size = int(said) if failure == Failure.ELSEWHERE and said.isdigit() else 0
            text = said.splitlines()[0][:500] if said else f"the file program ended with {code}"
            return FilesAnswer(ok=False, failure=failure, text=text, size=size)
        if op == Op.LIST:
            return _listing(out)
        if op == Op.READ:
            head, _, data = out.partition(b"\n")
            size, modified, *rest = head.decode().split()
            version = " ".join([modified, *rest])
            return FilesAnswer(ok=True, data=data, size=int(size), modified=int(modified), version=version)
        if op == Op.FINISH:
            return FilesAnswer(ok=True, sha256=out.decode().strip())
        return FilesAnswer(ok=True)

    async def _run(self, machine: Machine, argv: list[str], stdin: bytes | None) -> tuple[int, bytes, bytes]:
        if machine.backend != Backend.DOCKER:
            return await scripts.run_here(argv, stdin)
        api = await self._engine(machine.engine)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.threads, scripts.run_in_container, api, machine.ref, argv, stdin)
        except docker.errors.NotFound:
            raise scripts.RunFailed(f"container {shlex.quote(machine.ref)} is not there") from None
        except (docker.errors.DockerException, OSError) as error:
            raise scripts.RunFailed(f"docker exec failed: {error}") from None

    async def _engine(self, engine: str) -> docker.APIClient:
        if engine not in self.engines:
            try:
                self.engines[engine] = await asyncio.to_thread(engine_client, engine, scripts.SECONDS)
            except docker.errors.DockerException as error:
                raise scripts.RunFailed(f"the docker engine is unreachable: {error}") from None
        return self.engines[engine]


def _listing(out: bytes) -> FilesAnswer:
    """The LIST program's answer: the directory, then an entry a NUL-ended record ("TYPE/SIZE/MODE/MTIME<tab>NAME":
    a name may hold any byte but NUL and /), then "more" when there were more."""
    records = out.split(b"\0")
    entries, truncated = [], False
    for record in records[1:]:
        if record == b"more":
            truncated = True
            break
        meta, _, name = record.partition(b"\t")
        try:
            kind, size, mode, modified = meta.decode(errors="replace").rsplit("/", 3)
            entries.append([KINDS.get(kind, "other"), int(size), mode, int(modified), name.decode(errors="replace")])
        except ValueError:
            continue
    return FilesAnswer(ok=True, path=records[0].decode(errors="replace"), entries=entries, truncated=truncated)
