"""The Python client (clients/python, installed by `make venv` as its users install it) against daphne and a
real worker: its retries keep the API's rules (a submission whose answer was lost runs once, keys whose answer
was lost are written once), its output stream resumes by offset across a cut and a worker kill, and an unknown
outcome stays unknown. The answers are lost in the client's own transport: the server did the work each time."""

from __future__ import annotations

import hashlib
import uuid

import httpx
import pytest
from tether_client import Client, GaveUp, Outcome, Output, Problem, Retry

from api.tokens import create_token
from tests.bridge.harness import Stack
from tests.factories import make_unknown_execution

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]

FAST = Retry(attempts=20, first_delay=0.1, max_delay=1.0)


class LosingAnswers(httpx.HTTPTransport):
    """Sends each request for real; loses the answer of the next ``lose[(method, path)]`` ones (a dropped
    connection after the server did the work), and cuts a stream after ``cut_after`` bytes, once."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lose: dict[tuple[str, str], int] = {}
        self.cut_after: int | None = None
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        key = (request.method, request.url.path.removeprefix("/api/v1"))
        if self.lose.get(key, 0) > 0:
            self.lose[key] -= 1
            self.lost += 1
            response.read()
            response.close()
            raise httpx.ReadError("the answer was lost on its way", request=request)
        if self.cut_after is not None and key[1].endswith("/output/stream"):
            limit, self.cut_after = self.cut_after, None
            response.stream = _Cut(response.stream, limit, request)
        return response


class _Cut(httpx.SyncByteStream):
    def __init__(self, stream, limit: int, request: httpx.Request):
        self.stream, self.limit, self.request = stream, limit, request

    def __iter__(self):
        sent = 0
        for chunk in self.stream:
            if sent + len(chunk) > self.limit:
                self.stream.close()
                raise httpx.RemoteProtocolError("the stream was cut", request=self.request)
            sent += len(chunk)
            yield chunk

    def close(self):
        self.stream.close()


def _client(stack: Stack, user, *scopes: str) -> tuple[Client, LosingAnswers]:
    name = f"client-{uuid.uuid4().hex[:8]}"
    raw = create_token(user, name=name, scopes=list(scopes or ("read", "run", "terminals")))[1]
    transport = LosingAnswers()
    return Client(f"http://127.0.0.1:{stack.ports[0]}", raw, retry=FAST, transport=transport), transport


def test_a_submission_whose_answers_were_lost_runs_once_and_its_outcome_and_output_are_read(
    stack, place, operator, tmp_path
):
    machine = place("local")
    client, transport = _client(stack, operator)
    launches = tmp_path / "launches"
    argv = ["sh", "-c", f"echo launched >> {launches}; printf 'it ran\\n'; exit 3"]
    transport.lose[("POST", "/executions")] = 3
    with client:
        submitted = client.submit("agent-7", "task-42", machine=machine.name, argv=argv, aliases=[("ci", "run-9")])
        assert transport.lost == 3
        # The first try made it; the retries found it: the same execution, nothing run again.
        assert submitted.created is False and submitted.execution.aliases == (("ci", "run-9"),)
        assert client.lookup("ci", "run-9").id == submitted.execution.id
        outcome = client.wait(submitted.execution.id, timeout=60)
        assert (outcome.final, outcome.execution.state, outcome.execution.exit_code) == (True, "completed", 3)
        assert launches.read_text() == "launched\n"
        assert b"".join(piece.data for piece in client.output(submitted.execution.id)) == b"it ran\r\n"

        # Refusals are problems with their code and members.
        with pytest.raises(Problem) as conflict:
            client.submit("agent-7", "task-42", machine=machine.name, argv=["true"])
        assert (conflict.value.status, conflict.value.code) == (409, "identity_conflict")
        assert conflict.value.extra["existing_digest"] != conflict.value.extra["submitted_digest"]
        with pytest.raises(Problem) as missing:
            client.lookup("agent-7", "never-made")
        assert (missing.value.status, missing.value.code) == (404, "not_found")


def test_the_stream_goes_on_from_its_offset_after_a_cut_and_a_worker_kill(place, operator):
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"}
    try:
        stack.start("local")
        machine = place("local")
        client, transport = _client(stack, operator, "read", "run")
        argv = ["sh", "-c", "sleep 1; seq 1 300000; echo END"]
        transport.cut_after = 200_000  # the first connection is cut mid-stream
        with client:
            pk = client.submit("sse", "client-stream", machine=machine.name, argv=argv).execution.id
            seen, outcome, killed = bytearray(), None, False
            for item in client.stream(pk):
                if isinstance(item, Outcome):
                    outcome = item
                    break
                assert isinstance(item, Output) and item.offset == len(seen) and item.lost == 0, item
                seen += item.data
                if not killed and len(seen) > 600_000:
                    stack.workers[0].kill()
                    stack.workers[0].wait()
                    stack.start_worker("local")
                    killed = True
        assert killed and transport.cut_after is None
        assert (outcome.execution.state, outcome.execution.exit_code, outcome.complete) == ("completed", 0, True)
        expected = "".join(f"{n}\r\n" for n in range(1, 300_001)) + "END\r\n"
        assert hashlib.sha256(bytes(seen)).hexdigest() == hashlib.sha256(expected.encode()).hexdigest()
    finally:
        stack.stop()


def test_keys_whose_answers_were_lost_are_written_once(stack, place, operator):
    machine = place("local", "client-shell")
    client, transport = _client(stack, operator, "terminals")
    with client:
        terminal = client.open_terminal(machine.name)
        assert client.open_terminal(machine.name).id == terminal.id  # the open one, reattached
        transport.lose[("POST", f"/terminals/{terminal.id}/input")] = 2
        written = terminal.send("echo once-$((40+2))\r")
        assert (written.seq, written.repeated, transport.lost) == (1, True, 2)  # written by the first try
        assert terminal.send(b"echo twice-$((1+1))\r").seq == 2
        seen = terminal.read_until(b"twice-2\r\n", timeout=30)
        assert seen.count(b"once-42\r\n") == 1, seen

        # Given up (every try's answer lost): the keys are sent again, under their number, before the next ones.
        impatient, lossy = _client(stack, operator, "terminals")
        impatient.retry = Retry(attempts=2, first_delay=0.1, max_delay=0.1)
        with impatient:
            other = impatient.terminal(terminal.id)
            lossy.lose[("POST", f"/terminals/{terminal.id}/input")] = 2
            with pytest.raises(GaveUp):
                other.send("echo thrice-$((2+1))\r")
            assert other.send("echo four-$((2+2))\r").seq == 2
            seen = other.read_until(b"four-4\r\n", timeout=30)
            assert seen.count(b"thrice-3\r\n") == 1, seen
        assert terminal.close().process_state in ("closing", "closed")


def test_an_unknown_outcome_is_waited_for_as_unknown(stack, place, operator):
    execution = make_unknown_execution(place("local", "client-unknown"), operator, "lost")
    client, _ = _client(stack, operator, "read")
    with client:
        outcome = client.wait(execution.pk, timeout=5)
        assert (outcome.final, outcome.awaiting, outcome.execution.unknown) == (False, "operator", True)
        assert outcome.execution.exit_code is None
        streamed = list(client.stream(execution.pk))
        assert [type(item) for item in streamed] == [Outcome] and streamed[0].awaiting == "operator"
