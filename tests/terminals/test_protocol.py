"""The session protocol's words and messages: one vocabulary for the worker, the consumer and the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from terminals.models import CloseReason
from terminals.protocol import (
    TO_OWNER,
    Attach,
    Attached,
    CloseCode,
    Exited,
    Input,
    Output,
    ProtocolError,
    Reason,
    Request,
    decode_to_owner,
    grid,
    integer,
    page,
    wire_js,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_reads_the_words_the_server_speaks():
    """frontend/wire.js is generated from terminals/protocol/: edited by hand, or left behind by a change
    to the protocol, it differs, and the page would misread a close."""
    assert (ROOT / "frontend" / "wire.js").read_text() == wire_js(), "run: manage.py wire_js"


def test_the_page_has_no_close_code_or_reason_of_its_own():
    """Every number and protocol word the page branches on comes from wire.js, never a literal."""
    for script in ("protocol.js", "session-client.js", "attached-stream.js", "terminal.js"):
        text = (ROOT / "frontend" / script).read_text()
        assert not re.search(r"\b40\d\d\b", text), f"{script} spells a close code"
        for code in ("no_worker", "not_held", "attach_refused", "observer", "share link"):
            assert f'"{code}"' not in text, f"{script} spells {code}"


def test_every_stored_close_reason_is_a_protocol_reason_with_its_close_code():
    stored = {value for value in CloseReason.values if value}
    assert stored == {reason.value for reason in Reason if reason.stored}
    assert Reason.close_code_for("exited") == CloseCode.EXITED
    assert Reason.close_code_for("idle") == CloseCode.IDLE
    assert Reason.close_code_for("controller_lost") == CloseCode.SERVER_RESTART
    assert Reason.close_code_for("no-such-reason") == CloseCode.CLOSED


def test_only_ends_with_a_known_outcome_start_a_fresh_shell_by_themselves():
    assert Reason.EXITED.auto_reset and Reason.SERVER_RESTART.auto_reset and Reason.NEVER_STARTED.auto_reset
    # An unknown outcome waits for an operator; a limit the user hit is theirs to reopen.
    assert not Reason.CONTROLLER_LOST.auto_reset
    assert not any(reason.auto_reset for reason in (Reason.IDLE, Reason.DEADLINE, Reason.OUTPUT_LIMIT))


def test_each_request_names_the_reason_the_process_ends_with():
    assert {request: request.reason for request in Request} == {
        Request.CANCEL: Reason.KILLED,
        Request.KILL: Reason.KILLED,
        Request.FAIL: Reason.FAILED,
        Request.RESET: Reason.RESET,
        Request.COMPLETE: Reason.COMPLETED,
    }


def test_messages_round_trip_through_the_layers_dict():
    attach = Attach(execution=3, viewer="v", reply="r", attach=2, since=10, generation=1, epoch=7, cols=80, rows=24)
    assert decode_to_owner(attach.encode()) == attach
    assert attach.encode()["type"] == "session.attach"
    typed = Input(execution=3, viewer="v", reply="r", data=b"ls\r", seq=4)
    assert decode_to_owner(typed.encode()) == typed
    output = Output(offset=5, data=b"x", epoch=1)
    assert output.encode() == {"type": "terminal.output", "offset": 5, "data": b"x", "epoch": 1}
    attached = Attached(attach=1, offset=0, end=4, lost=0, generation=1, epoch=2, execution=3)
    assert Attached.decode(attached.encode()) == attached
    assert set(TO_OWNER) == {
        f"session.{kind}"
        for kind in "attach observe input resize ack resend keepalive detach reset peek api_input api_resize".split()
    }


def test_an_exit_tells_the_browser_who_asked_only_when_someone_did():
    plain = Exited("completed", "exit_code", 7, "Exited with code 7", Reason.EXITED, 1, 2)
    said = page.Exit.of(plain).encode()
    assert said["type"] == "exit" and said["exit_code"] == 7 and "by" not in said
    assert json.loads(page.Exit.of(plain).dumps())["reason"] == "exited"
    asked = Exited("completed", "killed", None, "Killed", Reason.KILLED, 1, 2, by="ops", action="kill", why="")
    told = page.Exit.of(asked).encode()
    assert set(told) == set(said) | {"by", "action", "why"} and (told["by"], told["why"]) == ("ops", "")


def test_each_frame_the_page_sends_is_decoded_once_into_its_type():
    frames = {
        '{"type": "observe", "since": 5, "generation": 2, "epoch": 9}': page.Observe(page.Position(5, 2, 9)),
        '{"type": "attach", "since": 0, "cols": 80, "rows": 24}': page.Attach(page.Position(), (80, 24)),
        '{"type": "takeover", "since": 3}': page.TakeOver(page.Position(3), None, takeover=True),
        '{"type": "resize", "cols": 100, "rows": 30}': page.Resize(100, 30),
        '{"type": "reset"}': page.Reset(),
        '{"type": "ack", "offset": 4096}': page.Ack(4096),
        '{"type": "keepalive"}': page.Keepalive(),
        '{"type": "ping", "echo_ms": [1.5]}': page.Ping([1.5]),
    }
    for text, frame in frames.items():
        assert page.decode(text) == frame, text
    assert {frame.TYPE for frame in frames.values()} == set(page.FROM_PAGE)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "malformed JSON"),
        ("[1, 2]", "JSON object with a string 'type'"),
        ('{"type": 7}', "JSON object with a string 'type'"),
        ('{"type": "format_disk"}', "unknown message type 'format_disk'"),
        ('{"type": "ack"}', "ack offset must be an integer"),
        ('{"type": "ack", "offset": -1}', "ack offset must be an integer"),
        ('{"type": "resize"}', "resize needs cols and rows"),
        ('{"type": "resize", "cols": 900, "rows": 24}', "out of range"),
        ('{"type": "attach", "since": "0"}', "since must be an integer"),
        ('{"type": "observe", "epoch": true}', "epoch must be an integer"),
        ('{"type": "attach", "pad": "' + "x" * 70_000 + '"}', "over the 65536-byte limit"),
        ("[" * 30_000 + "]" * 30_000, "malformed JSON"),  # nested past the parser: refused, no crash
    ],
)
def test_a_bad_frame_from_the_page_says_what_is_wrong(text, said):
    with pytest.raises(ProtocolError, match=re.escape(said)):
        page.decode(text)


def test_what_the_page_is_told_keeps_its_shape():
    """The page reads these objects (frontend/session-client.js): the types and fields it has always had."""
    assert page.Status(page.StatusCode.STARTING, "Starting", process_state="starting").encode() == {
        "type": "status", "code": "starting", "text": "Starting", "process_state": "starting",
    }  # fmt: skip
    assert page.Status(page.StatusCode.NO_WORKER, "None").encode() == {
        "type": "status",
        "code": "no_worker",
        "text": "None",
    }
    assert page.Superseded("Superseded by another window").encode() == {
        "type": "superseded",
        "text": "Superseded by another window",
    }
    assert page.Superseded("Taken over by ops", "ops").encode()["by"] == "ops"
    attached = Attached(attach=1, offset=3, end=9, lost=2, generation=1, epoch=7, execution=4, screen=b"\x1b[H")
    told = page.Attached.of(attached).encode()
    assert told["screen"] == "G1tI" and (told["offset"], told["end"], told["lost"], told["role"]) == (3, 9, 2, "writer")
    assert "attach" not in told and "execution" not in told  # the worker's bookkeeping stays on the server
    assert page.Fresh().encode() == {"type": "reset", "text": "Started a fresh session"}
    # A message with a field named as a method of every message (a status's ``text``) still goes out whole.
    assert json.loads(page.Status(page.StatusCode.STARTING, "Starting").dumps())["text"] == "Starting"


def test_the_page_handles_every_message_the_server_sends():
    """Each type in wire.js's FromServer has its on_<type> handler in the page's client; a message without one
    would be dropped there in silence."""
    client = (ROOT / "frontend" / "session-client.js").read_text()
    handled = set(re.findall(r"^  (?:async )?on_([a-z_]+)\(", client, re.M))
    assert {kind.TYPE for kind in page.TO_PAGE} <= handled
    assert len(page.TO_PAGE) == len({kind.TYPE for kind in page.TO_PAGE})  # one type, one meaning


def test_a_broken_message_is_a_protocol_error_not_a_crash():
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode_to_owner({"type": "session.format_disk"})
    with pytest.raises(ProtocolError, match=r"session\.input"):
        decode_to_owner({"type": "session.input", "data": b"x"})  # names no execution, viewer or reply
    with pytest.raises(ProtocolError, match="2\\^53"):
        integer(2**53 + 1, "since")
    with pytest.raises(ProtocolError):
        integer(True, "since")
    with pytest.raises(ProtocolError, match="out of range"):
        grid({"cols": 0, "rows": 24})
    with pytest.raises(ProtocolError, match="integers"):
        grid({"cols": "80", "rows": 24})
    assert grid({}) is None and grid({"cols": 500, "rows": 200}) == (500, 200)


def test_a_stream_that_filled_the_least_flow_window_is_acked_without_waiting_for_the_pages_timer():
    """A worker resumes a paused stream once what is unacknowledged falls to a third of its window; the page
    acks at once from ACK_AT_ONCE_BYTES (less waits ACK_IDLE_MS), so that must fit in a third of the least
    window a session streaming beside others is given, or such a stream would stall for the timer."""
    from terminals.owner.live import MIN_WINDOW_BYTES
    from terminals.protocol import ACK_AT_ONCE_BYTES

    assert 3 * ACK_AT_ONCE_BYTES <= MIN_WINDOW_BYTES
