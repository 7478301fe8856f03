"""The viewer's stream with no socket: what reaches the browser is every byte once, in order, or a said gap."""

from __future__ import annotations

from terminals.protocol import Attached, Gap, Output
from terminals.stream import ACK_BATCH_BYTES, Deliver, FetchFrom, ViewerStream


def attached(stream: ViewerStream, offset: int = 0, generation: int = 1, epoch: int = 9) -> ViewerStream:
    attach, _ = stream.next_attach(generation)
    assert stream.confirmed(Attached(attach, offset, offset, 0, generation, epoch, execution=1))
    return stream


def test_each_byte_reaches_the_browser_once_and_a_hole_is_fetched_again():
    stream = attached(ViewerStream())
    assert stream.output(Output(0, b"hello", 9)) == Deliver(b"hello")
    assert stream.output(Output(0, b"hello", 9)) is None  # a repeat
    assert stream.output(Output(3, b"lo world", 9)) == Deliver(b" world")  # overlapping: only the new part
    assert stream.output(Output(20, b"late", 9)) == FetchFrom(11)  # 11..20 went missing
    assert stream.expected == 11
    assert stream.output(Output(11, b"x" * 9, 9)) == Deliver(b"x" * 9)
    assert stream.output(Output(20, b"late", 9)) == Deliver(b"late")


def test_a_left_behind_owner_and_an_unconfirmed_attach_send_nothing():
    stream = ViewerStream()
    assert stream.output(Output(0, b"early", 9)) is None  # not attached: the attach replays it
    attached(stream, epoch=9)
    assert stream.output(Output(0, b"dead owner", 8)) is None
    assert not stream.gap(Gap(100, 100, 8))


def test_a_repeated_or_replaced_attach_answer_cannot_rewind_the_stream():
    stream = ViewerStream()
    first, _ = stream.next_attach(1)
    second, _ = stream.next_attach(1)
    assert not stream.confirmed(Attached(first, 0, 0, 0, 1, 9, execution=1))  # answers an attach since replaced
    assert stream.confirmed(Attached(second, 0, 0, 0, 1, 9, execution=1))
    stream.output(Output(0, b"abc", 9))
    assert not stream.confirmed(Attached(second, 0, 0, 0, 1, 9, execution=1))  # delivered twice
    assert stream.expected == 3


def test_offsets_of_another_generation_replay_the_new_one_from_its_start():
    stream = ViewerStream()
    stream.want(since=500, generation=1, epoch=9)
    assert stream.next_attach(1)[1] == 500
    stream.want(since=500, generation=1, epoch=9)
    assert stream.next_attach(2)[1] == 0
    stream.next_generation()
    assert (stream.generation, stream.expected, stream.attached) == (None, 0, False)


def test_a_gap_moves_the_stream_forward_only():
    stream = attached(ViewerStream())
    stream.output(Output(0, b"abcd", 9))
    assert stream.gap(Gap(100, 96, 9)) and stream.expected == 100
    assert not stream.gap(Gap(50, 46, 9))  # a repeated delivery of an older gap
    assert stream.output(Output(100, b"z", 9)) == Deliver(b"z")


def test_acks_are_coalesced_and_never_move_backwards():
    stream = attached(ViewerStream(), offset=1000)
    assert stream.ack(1010) is False  # a little: forwarded a moment later
    assert stream.ack(900) is False  # an older ack adds nothing
    assert stream.take_ack() == 1010
    assert stream.take_ack() is None  # nothing new since
    assert stream.ack(1010 + ACK_BATCH_BYTES) is True  # frees a good part of the window: at once
    assert stream.take_ack() == 1010 + ACK_BATCH_BYTES
    stream.leave()
    assert stream.ack(10**9) is None  # not attached: the next attach restarts the window


def test_a_short_replay_is_noticed_and_input_is_numbered():
    stream = attached(ViewerStream())
    stream.output(Output(0, b"abc", 9))
    assert stream.missing(end=10) == 3
    stream.output(Output(3, b"defghij", 9))
    assert stream.missing(end=10) is None
    assert [stream.next_input() for _ in range(3)] == [1, 2, 3]


def test_an_answer_to_an_attach_sent_before_the_browser_asked_again_is_stale():
    """The browser's new attach is numbered only once its owner is looked up: meanwhile a repeated answer to
    the previous attach must not be taken for the answer to this one."""
    stream = attached(ViewerStream(), generation=1)
    previous = stream.attach_id
    stream.want(since=0, generation=2, epoch=9)  # after a reset: the fresh shell's stream is wanted
    assert not stream.confirmed(Attached(previous, 0, 40, 0, 1, 9, execution=1))
    attach, _ = stream.next_attach(2)
    assert stream.confirmed(Attached(attach, 0, 0, 0, 2, 9, execution=2)) and stream.generation == 2


def test_an_observer_that_falls_a_window_behind_is_sent_nothing_more_until_it_catches_up():
    stream = attached(ViewerStream(window=100))
    assert stream.output(Output(0, b"a" * 60, 9)) == Deliver(b"a" * 60)
    assert stream.output(Output(60, b"b" * 60, 9)) == Deliver(b"b" * 60)  # 120 unrendered: over its window
    assert stream.output(Output(120, b"c" * 60, 9)) is None  # dropped here, nothing upstream waits
    assert stream.output(Output(180, b"d" * 60, 9)) is None  # no fetch storm while it is behind
    assert stream.caught_up(30) is None  # still more than half a window behind
    assert stream.caught_up(80) == FetchFrom(120)  # caught up: what it missed, asked for again by offset
    assert stream.output(Output(120, b"c" * 60, 9)) == Deliver(b"c" * 60)
    assert stream.caught_up(500) is None and stream.ack_pending == 180  # an ack never runs past what was sent


def test_a_writers_stream_has_no_window_of_its_own():
    stream = attached(ViewerStream())
    for n in range(10):
        assert stream.output(Output(n * 1000, b"x" * 1000, 9)) == Deliver(b"x" * 1000)
