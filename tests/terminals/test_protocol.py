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
    wire_js,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_reads_the_words_the_server_speaks():
    """frontend/wire.js is generated from terminals/protocol.py: edited by hand, or left behind by a change
    to the protocol, it differs, and the page would misread a close."""
    assert (ROOT / "frontend" / "wire.js").read_text() == wire_js(), "run: manage.py wire_js"


def test_the_page_has_no_close_code_or_reason_of_its_own():
    """Every number and protocol word the page branches on comes from wire.js, never a literal."""
    for script in ("protocol.js", "session-client.js", "attached-stream.js"):
        text = (ROOT / "frontend" / script).read_text()
        assert not re.search(r"\b40\d\d\b", text), f"{script} spells a close code"
        for code in ("no_worker", "not_held", "attach_refused"):
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
    said = plain.to_browser()
    assert said["type"] == "exit" and said["exit_code"] == 7 and "by" not in said
    assert json.loads(json.dumps(said))["reason"] == "exited"
    asked = Exited("completed", "killed", None, "Killed", Reason.KILLED, 1, 2, by="ops", action="kill", why="")
    assert asked.to_browser() | {} == {**said, **asked.to_browser()} and asked.to_browser()["by"] == "ops"


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
