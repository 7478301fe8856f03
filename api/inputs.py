"""Numbered input from API clients, to a terminal session's shell or to a command on pipes: each number
claimed before it is sent, so a retry is never written twice, and confirmed once the owner wrote it.

The contract (docs/api.md): a client's first number is its own choice; from then on each is the one after the
highest taken (``input_gap`` names it otherwise), or one taken before, sent again with the same bytes (a retry:
written once) — with other bytes it is ``input_conflict``. A number given back (never written: the worker was
not reached) may be sent again."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time

from channels.db import database_sync_to_async as db
from django.db import IntegrityError, transaction
from django.db.models import Max, Min
from ninja import Field, Router, Schema

from access.policy import Do, may
from api.auth import need
from api.models import ApiInput, InputState, Scope
from api.owner_calls import NotSent, ask
from api.problems import ApiProblem, answers
from api.schemas import NO_NUL, Body
from api.seen import mine
from executions import pipes
from executions.locks import Lock, held_until_commit
from executions.models import ENDED_STATES, State
from terminals.owner_client import owner_of_execution
from terminals.protocol import MAX_FRAME_BYTES, ErrorCode
from terminals.protocol import ApiInput as InputMessage

router = Router(tags=["executions"])
START_WAIT_SECONDS = 5.0  # input to a command not started yet waits this long for it before a 503
MAX_INPUT_BYTES = MAX_FRAME_BYTES  # the most one input call writes (keys, or a command's stdin)


class NumberedIn(Body):
    """Numbered input: to a shell (its keys) or to a command's stdin."""

    KEYSTROKES = frozenset({"data"})  # a NUL in the text is a byte like any other (Ctrl-@)
    seq: int = Field(..., ge=0, le=2**53, description="Your number for this input: a retry of it is written once")
    data: str | None = Field(None, max_length=MAX_INPUT_BYTES, description="The bytes as text (UTF-8)")
    data_b64: str | None = Field(
        None,
        max_length=(MAX_INPUT_BYTES + 2) // 3 * 4,
        pattern=r"^[A-Za-z0-9+/]*={0,2}$",
        description="The bytes as base64, for bytes that are not text",
    )
    client: str = Field(
        "", max_length=100, pattern=NO_NUL, description="Which of your programs sends it (numbers are per client)"
    )

    def bytes(self, *, required: bool = True) -> bytes:
        """The bytes sent, as one of ``data`` or ``data_b64`` (or none, unless ``required``)."""
        if (self.data is not None and self.data_b64 is not None) or (required and self.data is self.data_b64):
            raise ApiProblem("validation_error", "send the bytes as exactly one of data or data_b64")
        try:
            data = self.data.encode() if self.data is not None else base64.b64decode(self.data_b64 or "", validate=True)
        except (binascii.Error, ValueError):
            raise ApiProblem("validation_error", "data_b64 is not base64") from None
        if len(data) > MAX_INPUT_BYTES:
            raise ApiProblem("too_large", f"at most {MAX_INPUT_BYTES} bytes of input a call", limit=MAX_INPUT_BYTES)
        return data


class InputOut(Schema):
    written: bool
    repeated: bool = Field(description="This seq had been written before: not written again")
    seq: int


def _key(target: dict) -> str:
    """``target``: {"session": a TerminalSession} or {"execution": an Execution}, as a lock's part."""
    ((kind, value),) = target.items()
    return str(value.pk) if kind == "session" else f"execution:{value.pk}"


def _claim(token, target: dict, seq: int, client: str, data: bytes, closes: bool) -> ApiInput | None:
    """Claim the number before sending it; None when it was claimed before with the same bytes (a retry).
    ``closes``: it ends a command's stdin, after which no other input is taken (from anyone)."""
    digest = hashlib.sha256(data).hexdigest()
    with transaction.atomic():
        # One claim at a time for this (token, target, client): the numbers checked stay true until it commits.
        held_until_commit(Lock.INPUT_ORDER, token.pk, _key(target), client)
        taken = ApiInput.objects.filter(token=token, client=client, **target)
        earlier = taken.filter(seq=seq).first()
        span = taken.aggregate(lowest=Min("seq"), highest=Max("seq"))
        expected = span["highest"] + 1 if span["highest"] is not None else seq
        if earlier is not None:
            if earlier.digest and earlier.digest != digest:
                raise ApiProblem(
                    "input_conflict",
                    f"input {seq} was sent before with other bytes; nothing is written (send new input as {expected})",
                    expected=expected,
                )
            return None
        given_back = span["lowest"] is not None and span["lowest"] < seq < expected
        if seq != expected and not given_back:
            raise ApiProblem(
                "input_gap", f"input {seq} is out of order; the next this client sends is {expected}",
                expected=expected,
            )  # fmt: skip
        try:
            with transaction.atomic():
                return ApiInput.objects.create(
                    token=token, client=client, seq=seq, size=len(data), digest=digest, closes=closes, **target
                )
        except IntegrityError:  # taken meanwhile (SQLite, without the lock): a retry
            return None


def closed(target: dict) -> bool:
    """An input that closes it (a command's stdin) was sent and not given back: nothing more is taken."""
    return ApiInput.objects.filter(closes=True, **target).exclude(state=InputState.SENDING).exists()


def written_before(token, target: dict, seq: int, client: str, data: bytes) -> bool:
    """This number was written before with these bytes: a retry, answered so whatever became of the target
    since (a command that has ended meanwhile)."""
    earlier = ApiInput.objects.filter(token=token, client=client, seq=seq, state=InputState.WRITTEN, **target)
    return earlier.filter(digest=hashlib.sha256(data).hexdigest()).exists()


async def deliver(
    token, target: dict, owner, seq: int, client: str, data: bytes, what: str, closes: bool = False
) -> dict:
    """Write ``data`` as input number ``seq`` of ``client`` through ``owner`` (the worker holding ``what``,
    "the shell" or "the command"), at most once however often it is sent."""
    if owner is None:
        text = f"no worker holds {what} right now; send the same seq again"
        raise ApiProblem("owner_unavailable", text, retry_after=1)
    claim = await db(_claim)(token, target, seq, client, data, closes)
    if claim is None:
        earlier = await db(ApiInput.objects.get)(token=token, client=client, seq=seq, **target)
        if earlier.state == InputState.WRITTEN:
            return {"written": True, "repeated": True, "seq": seq}
        raise ApiProblem(
            "input_unconfirmed",
            f"input {seq} was sent before and its writing was never confirmed; it is not written again "
            "(read the output to see whether it arrived)",
        )
    viewer = f"api:{token.pk}:{client}"
    by = token.user.get_username()
    try:
        answer = await ask(owner, InputMessage, viewer=viewer, data=data, seq=seq, by=by, claim=claim.pk)
    except NotSent as error:  # it never left (Redis away): nothing was written, so the number is free again
        await db(ApiInput.objects.filter(pk=claim.pk).delete)()
        text = f"could not reach the worker ({type(error).__name__}); send the same seq again"
        raise ApiProblem("owner_unavailable", text, retry_after=1) from None
    if answer is None:
        # No answer: given up here unless the owner took it first (one of the two wins the row). Not taken,
        # it can never be written (a worker that wakes later finds it given up): the number is free again.
        given_up, _ = await db(ApiInput.objects.filter(pk=claim.pk, state=InputState.SENDING).delete)()
        if given_up:
            text = f"no worker answers for {what} right now (it may be changing hands); send the same seq again"
            raise ApiProblem("owner_unavailable", text, retry_after=1)
        raise ApiProblem(
            "input_unconfirmed",
            f"the worker took input {seq} and did not confirm it; it may have been written, and is not written again",
        )
    if answer.get("ok"):
        await db(ApiInput.objects.filter(pk=claim.pk).update)(state=InputState.WRITTEN)
        return {"written": True, "repeated": False, "seq": seq}
    await db(ApiInput.objects.filter(pk=claim.pk).delete)()  # refused, so not written: the number is free again
    if answer.get("code") == ErrorCode.NOT_WRITER:
        raise ApiProblem("not_writer", answer.get("text", ""))
    raise ApiProblem("owner_unavailable", answer.get("text", "") + "; send the same seq again", retry_after=1)


# --- a command's stdin (pty: false) ---------------------------------------------------------------------


class CommandInputIn(NumberedIn):
    eof: bool = Field(False, description="Close its stdin after these bytes (the program reads its end)")


@router.post(
    "/executions/{pk}/input",
    **answers(
        InputOut,
        "not_found",
        "forbidden",
        "wrong_kind",
        "state_conflict",
        "input_unconfirmed",
        "input_gap",
        "input_conflict",
        "too_large",
        "owner_unavailable",
    ),
    summary="Write to a command's stdin, or close it (pty: false; numbered, written once)",
)
async def execution_input(request, pk: int, body: CommandInputIn):
    """For a command on pipes: bytes for its stdin, and with `eof` its end. Each `seq` is written at most once
    however often it is sent (the same contract as a terminal's input)."""
    token = await db(need)(request, Scope.RUN)
    execution = await db(mine)(request, pk)
    if not await db(may)(token, Do.OPERATE, execution):
        raise ApiProblem("forbidden", f"you may not write to execution {pk}")
    if execution.spec.get("pty", True):
        raise ApiProblem(
            "wrong_kind", "this command runs on a terminal: it has no stdin of its own (submit it with pty: false)"
        )
    data = body.bytes(required=False)
    if not data and not body.eof:
        raise ApiProblem("validation_error", "send some bytes, or eof: true to close its stdin")
    encoded = pipes.encode_input(data, close=body.eof)
    target = {"execution": execution}
    if await db(written_before)(token, target, body.seq, body.client, encoded):  # a retry: so said, whenever
        return {"written": True, "repeated": True, "seq": body.seq}
    if await db(closed)(target):  # said before the state: whether it has ended yet or not, this is the answer
        raise ApiProblem("state_conflict", "its stdin was closed before: nothing more is written to it")
    deadline = time.monotonic() + START_WAIT_SECONDS  # input sent just after the submit: it waits for the start
    while execution.state in (State.PENDING, State.DISPATCHED) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        execution = await db(mine)(request, pk)
    if execution.state in ENDED_STATES:
        raise ApiProblem("state_conflict", f"the command is {execution.state}: it takes no input now")
    if execution.state != State.RUNNING:
        raise ApiProblem("owner_unavailable", "it has not started yet; send the same seq again", retry_after=1)
    owner = await db(owner_of_execution)(execution.pk)
    return await deliver(token, target, owner, body.seq, body.client, encoded, "the command", closes=body.eof)
