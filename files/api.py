"""Files over the HTTP API: list a directory, download a file, upload a file or a tar (docs/api.md, Files).
The web process streams, a chunk at a time, to or from the worker serving the machine (files/service.py),
each chunk answered before the next: nothing is held whole, and a slow reader or writer slows the transfer."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import posixpath
import uuid
from datetime import UTC, datetime, timedelta

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.http import StreamingHttpResponse
from django.utils import timezone
from ninja import Field, Path, Query, Router, Schema, Status

from access.policy import Do, machine_named
from api.auth import need
from api.executions import actor_of, still
from api.models import Scope
from api.owner_calls import NotSent, question
from api.problems import CODES, ApiProblem, answers
from api.schemas import MACHINE_NAME
from executions.actions import note_machine
from executions.models import Machine, MachineState
from files.paths import MAX_PATH, PathRefused, allowed
from files.protocol import MAX_ENTRIES, Failure, FilesAnswer, FilesAsk, Op, chunk_bytes
from terminals.models import Worker, WorkerState

log = logging.getLogger(__name__)
router = Router(tags=["files"])

ANSWER_SECONDS = 70.0  # a chunk's program may take up to a minute on the machine (files.scripts.SECONDS)
TRIES = 3  # a chunk whose answer was lost is asked again (each one is safe to repeat)
PATH = Query(..., min_length=1, max_length=MAX_PATH, pattern="^/[^\x00]*$", description="An absolute path")
NAME = Path(..., max_length=100, pattern=MACHINE_NAME, description="The machine's name")


class Entry(Schema):
    name: str
    type: str = Field(description="file, dir, link or other")
    size: int
    mode: str = Field(description="Permission bits, octal")
    modified: str = Field(description="When it was last modified (UTC)")


class Listing(Schema):
    path: str = Field(description="The directory, as it resolved on the machine (links followed)")
    entries: list[Entry]
    truncated: bool = Field(description=f"It has more than {MAX_ENTRIES} entries: these are the first")


class Uploaded(Schema):
    path: str
    size: int
    sha256: str = Field(description="Of the bytes received, checked on the machine before they were put in place")
    tar: bool = Field(description="The body was a tar, extracted into path")


def _place(request, name: str, path: str, scope: str) -> tuple[Machine, str]:
    """The machine (one this token may use) and the path, when the machine allows it."""
    token = need(request, scope)
    machine = machine_named(token, name, Do.USE)
    if machine is None:
        raise ApiProblem("not_found", f"no machine {name!r} you may use")
    if machine.state != MachineState.RUNNING:  # a stopped machine is left as it is (resolution reads it)
        raise ApiProblem("state_conflict", f"machine {name} is {machine.state}: files move on a running machine",
                         state=machine.state)  # fmt: skip
    try:
        return machine, allowed(path, machine.file_roots or [])
    except PathRefused as refused:
        raise ApiProblem("path_refused", str(refused), allowed=machine.file_roots or []) from None


def _still_allowed(request, machine: Machine) -> None:
    """Between chunks: a revoked token or a grant taken away ends the transfer at once."""
    still(request)
    if machine_named(request.auth, machine.name, Do.USE) is None:
        raise ApiProblem("not_found", f"no machine {machine.name!r} you may use")


def _workers(machine: Machine) -> list[str]:
    """The channels of live workers that serve the machine (its host's, with its backend), freshest first."""
    fresh = timezone.now() - timedelta(seconds=settings.TETHER_LEASE_TTL_SECONDS)
    workers = Worker.objects.filter(state=WorkerState.RUNNING, heartbeat_at__gte=fresh).exclude(channel_name="")
    if machine.host:
        workers = workers.filter(host=machine.host)
    return [w.channel_name for w in workers.order_by("-heartbeat_at")[:20] if machine.backend in (w.backends or [])]


def _audit(machine: Machine, request, kind: str, said: str, **detail) -> None:
    note_machine(machine, actor_of(request.auth), said, kind=kind, **detail)


async def _ask(machine: Machine, op: Op, path: str, channels: list[str] | None = None, **fields) -> FilesAnswer:
    """One question to a worker serving the machine (one of ``channels``, found when not given), asked again
    (of the next one) when no answer came; a failure said as the problem it is."""
    channels = channels or await db(_workers)(machine)
    if not channels:
        raise ApiProblem("owner_unavailable", f"no worker serving {machine.name} is running; try again", retry_after=1)
    for attempt in range(TRIES):
        channel = channels[attempt % len(channels)]
        try:
            raw = await question(
                channel, lambda reply: FilesAsk(reply=reply, machine=machine.pk, op=op, path=path, **fields),
                ANSWER_SECONDS,
            )  # fmt: skip
        except NotSent as error:
            text = f"could not reach a worker ({error}); try again"
            raise ApiProblem("owner_unavailable", text, retry_after=1) from None
        if raw is None:
            continue
        answer = FilesAnswer.decode(raw)
        if answer.ok or answer.failure == Failure.ELSEWHERE:
            return answer
        if answer.failure == Failure.NOT_HERE:
            continue
        raise ApiProblem(answer.failure if answer.failure in CODES else "file_failed", answer.text)
    raise ApiProblem("owner_unavailable", f"no worker serving {machine.name} answered; try again", retry_after=1)


@router.get(
    "/machines/{name}/files",
    **answers(Listing, "not_found", "path_refused", "wrong_kind", "permission_denied", "file_failed",
              "owner_unavailable", "state_conflict"),
    summary="List a directory on a machine",
)  # fmt: skip
async def list_files(request, name: str = NAME, path: str = PATH):
    """Its entries (not recursive), each with its type, size, mode and when it was modified."""
    machine, clean = await db(_place)(request, name, path, Scope.READ)
    answer = await _ask(machine, Op.LIST, clean)
    entries = [
        {"type": kind, "size": size, "mode": mode, "modified": _when(modified), "name": entry_name}
        for kind, size, mode, modified, entry_name in answer.entries
    ]
    return {"path": answer.path, "entries": entries, "truncated": answer.truncated}


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


DOWNLOAD = {
    "description": "The file's bytes (`Content-Length` is its size). A file that changes while it is read ends "
    "the body early and closes the connection: the body is then shorter than Content-Length, which a client "
    "sees as a failed download.",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}


@router.get(
    "/machines/{name}/files/content",
    **answers(None, "not_found", "path_refused", "wrong_kind", "permission_denied", "file_failed",
              "owner_unavailable", "state_conflict", "too_large", raw={200: DOWNLOAD}),
    summary="Download a file from a machine",
)  # fmt: skip
async def download(request, name: str = NAME, path: str = PATH):
    machine, clean = await db(_place)(request, name, path, Scope.READ)
    chunk, channels = chunk_bytes(), await db(_workers)(machine)
    first = await _ask(machine, Op.READ, clean, channels, offset=0, chunk=chunk)
    limit = settings.TETHER_FILE_MAX_BYTES  # what a web process may come to hold of a reader that stops reading
    if first.size > limit:
        raise ApiProblem("too_large", f"{clean} is {first.size} bytes; at most {limit} are served", limit=limit)
    said = f"download of {clean} ({first.size} bytes) started"
    await db(_audit)(machine, request, "file.downloaded", said, path=clean, size=first.size)

    async def body():
        at = 0
        piece = first
        while True:
            data = piece.data[: first.size - at]
            if piece.version != first.version or (len(data) < chunk and at + len(data) < first.size):
                raise Interrupted(f"download of {clean} from {machine.name} stopped at {at}: the file changed")
            yield data
            at += len(data)
            if at >= first.size:
                return
            try:
                await db(_still_allowed)(request, machine)
                piece = await _ask(machine, Op.READ, clean, channels, offset=at, chunk=chunk)
            except ApiProblem as problem:
                where = f"download of {clean} from {machine.name} stopped at {at}"
                raise Interrupted(f"{where}: {problem.detail}") from None

    response = StreamingHttpResponse(body(), content_type="application/octet-stream")
    response["Content-Length"] = str(first.size)
    response["Connection"] = "close"  # a body cut short is then seen as such, never as the next answer
    response["Content-Disposition"] = f"attachment; filename*=UTF-8''{_quoted(posixpath.basename(clean))}"
    response["Cache-Control"] = "no-store"
    return response


class Interrupted(Exception):
    """A download ended before its Content-Length: its connection is dropped, which its client sees."""


def _quoted(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


UPLOAD_BODY = {
    "required": True,
    "description": "The file's bytes (application/octet-stream), or a tar (application/x-tar) extracted into "
    "the path, a directory made if needed. Send Content-Length; at most TETHER_FILE_MAX_BYTES.",
    "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/x-tar": {"schema": {"type": "string", "format": "binary"}},
    },
}


UPLOAD_ANSWERS = answers({201: Uploaded}, "not_found", "path_refused", "wrong_kind", "permission_denied",
                         "file_failed", "owner_unavailable", "unsupported_media_type", "state_conflict")  # fmt: skip
UPLOAD_ANSWERS["openapi_extra"]["requestBody"] = UPLOAD_BODY


@router.put("/machines/{name}/files/content", **UPLOAD_ANSWERS, summary="Upload a file (or a tar) to a machine")
async def upload(request, name: str = NAME, path: str = PATH):
    """Written beside the path first and moved into place once every byte arrived (a reader never sees half a
    file); a tar is extracted into the path. Answered with the SHA-256 of the bytes as read back there."""
    machine, clean = await db(_place)(request, name, path, Scope.RUN)
    tar = request.content_type == "application/x-tar"
    transfer, chunk, channels = uuid.uuid4().hex, chunk_bytes(), await db(_workers)(machine)
    digest, at = hashlib.sha256(), 0
    try:
        while data := await asyncio.to_thread(request.read, chunk):
            digest.update(data)
            if at + len(data) > settings.TETHER_FILE_MAX_BYTES:
                raise ApiProblem("too_large", f"at most {settings.TETHER_FILE_MAX_BYTES} bytes a file")
            written = await _ask(
                machine, Op.WRITE, clean, channels, transfer=transfer, offset=at, data=data, tar=tar, chunk=chunk
            )
            if not written.ok:  # the chunks before it are not there (its temporary file was removed)
                raise ApiProblem("file_failed", f"the upload has {written.size} bytes there, not {at}; send it again")
            at += len(data)
            await db(_still_allowed)(request, machine)
        sent = digest.hexdigest()
        done = await _ask(machine, Op.FINISH, clean, channels, transfer=transfer, offset=at, tar=tar, digest=sent)
        if not done.ok:
            raise ApiProblem("file_failed", f"the machine has {done.size} bytes of the {at} sent; send it again")
    except BaseException:
        await _abort(machine, clean, transfer, tar)
        raise
    said = f"{'tar extracted into' if tar else 'upload of'} {clean} ({at} bytes)"
    await db(_audit)(machine, request, "file.uploaded", said, path=clean, size=at, sha256=sent, tar=tar)
    return Status(201, {"path": clean, "size": at, "sha256": sent, "tar": tar})


async def _abort(machine: Machine, path: str, transfer: str, tar: bool) -> None:
    try:
        await _ask(machine, Op.ABORT, path, transfer=transfer, tar=tar)
    except Exception as error:  # its temporary file stays (named .NAME.tether-upload-ID, beside the path)
        log.warning("could not remove the partial upload %s of %s: %r", transfer, path, error)
