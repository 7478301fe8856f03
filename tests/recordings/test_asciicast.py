"""The recording format, with no I/O: events as they are taken, the file they make, and v2 from v3."""

from __future__ import annotations

import json

from recordings.asciicast import EventLog, event_line, output_of, parse_lines, v2_from_v3, write_v3

HEADER = {"term": {"cols": 80, "rows": 24, "type": "xterm-256color"}, "timestamp": 1000}


def file_of(log: EventLog, closing: bytes = b"") -> list[bytes]:
    """The file of what ``log`` took, then ``closing`` (how the shell ended, as finishing adds it)."""
    return lines_of(write_v3(HEADER, [log.take().lines], log.started, closing))


def lines_of(written) -> list[bytes]:
    return b"".join(written).splitlines(keepends=True)


def test_output_split_inside_a_character_is_the_same_bytes_in_the_file():
    log = EventLog(started=1000.0, limit=1 << 20)
    text = "naïve — 日本語 ✓\r\n".encode()
    for cut in range(len(text)):  # every split point, one character's bytes across two reads included
        log.output(0, log.end, text[:cut], 1001.0)
        log.output(0, log.end, text[cut:], 1001.5)
    assert output_of(file_of(log)) == text * len(text)


def test_a_holder_replaying_what_was_recorded_is_not_recorded_twice_and_a_hole_is_said():
    log = EventLog(started=0.0, limit=1 << 20)
    log.output(0, 0, b"hello ", 1.0)
    log.output(0, 3, b"lo world", 2.0)  # a new owner replays from offset 3: only " world" is new
    log.output(0, 20, b"!", 3.0)  # 9 bytes between 11 and 20 never reached the recording
    lines = file_of(log)
    assert output_of(lines) == b"hello world!"
    markers = [json.loads(line)[2] for line in lines[1:] if json.loads(line)[1] == "m"]
    assert markers == ["9 bytes of output were not recorded here"]


def test_intervals_count_from_the_previous_event_and_never_go_back():
    log = EventLog(started=100.0, limit=1 << 20)
    log.output(0, 0, b"a", 101.0)
    log.resize(100, 30, 103.5)
    log.output(0, 1, b"b", 103.0)  # another owner's clock a little behind
    events = [json.loads(line) for line in file_of(log, event_line(104.0, "x", "7"))[1:]]
    assert events == [[1.0, "o", "a"], [2.5, "r", "100x30"], [0.0, "o", "b"], [0.5, "x", "7"]]


def test_past_the_size_bound_the_file_says_where_it_was_cut():
    log = EventLog(started=0.0, limit=2000)
    for n in range(100):
        log.output(0, n * 50, b"y" * 50, float(n))
        log.marker(f"command {n}", float(n))
    assert log.truncated_at is not None and 0 < log.truncated_at < 5000
    lines = file_of(log)
    assert len(output_of(lines)) == log.truncated_at
    comment = [line for line in lines if line.startswith(b"#")]
    assert comment and b"size bound" in comment[0]
    events = [json.loads(line) for line in lines[1:] if not line.startswith(b"#")]
    assert events[-1][1] == "m" and f"output offset {log.truncated_at}" in events[-1][2]  # nothing after it


def test_v2_has_absolute_times_width_and_height_and_the_exit_as_a_marker():
    log = EventLog(started=0.0, limit=1 << 20)
    log.output(0, 0, b"a", 1.0)
    log.marker("make test", 2.0)
    v2 = [json.loads(line) for line in v2_from_v3(file_of(log, event_line(4.0, "x", "3")))]
    assert v2[0]["version"] == 2 and (v2[0]["width"], v2[0]["height"]) == (80, 24)
    assert v2[1:] == [[1.0, "o", "a"], [2.0, "m", "make test"], [4.0, "m", "the shell exited with status 3"]]


def test_stored_lines_parse_back_with_their_absolute_times():
    log = EventLog(started=0.0, limit=1 << 20)
    log.input(b"ls\r", 5.25)
    taken = log.take()
    assert list(parse_lines(taken.lines)) == [(5.25, "i", "ls\r")] and taken.markers == []


def test_output_is_taken_as_read_and_made_text_once_when_the_file_is_made():
    log = EventLog(started=0.0, limit=1 << 20)
    log.output(0, 0, b"\x1b[1mbold\x1b[0m \xff\r\n", 1.0)
    taken = log.take()
    assert taken.lines == b"O1.000000 16\n\x1b[1mbold\x1b[0m \xff\r\n" and taken.end == taken.output_bytes == 16
    events = [json.loads(line) for line in lines_of(write_v3(HEADER, [taken.lines], 0.0))[1:]]
    assert events == [[1.0, "o", "\x1b[1mbold\x1b[0m \ufffd\r\n"]]  # not UTF-8: U+FFFD, as asciinema does


def test_a_character_split_across_two_owners_chunks_is_one_character_in_the_file():
    check = "✓".encode()
    first = EventLog(started=0.0, limit=1 << 20)
    first.output(0, 0, b"ok " + check[:1], 1.0)
    taken = first.take()
    assert taken.end == 4  # every byte read is recorded: the next owner goes on from the next one
    second = EventLog(started=0.0, limit=1 << 20, end=taken.end, size=taken.size)
    second.output(0, 0, b"ok " + check, 2.0)  # the holder replays what the first owner recorded
    second.output(0, 6, check[:2], 3.0)
    chunks = [taken.lines, second.take().lines]
    # While it is being made the unfinished character is not shown; once the shell has ended it is U+FFFD.
    assert output_of(lines_of(write_v3(HEADER, chunks, 0.0))) == b"ok " + check
    ended = lines_of(write_v3(HEADER, chunks, 0.0, event_line(4.0, "x", "0")))
    assert output_of(ended) == b"ok " + check + "\ufffd".encode()
    assert [json.loads(line)[1] for line in ended[1:]] == ["o", "o", "o", "x"]  # the U+FFFD before the exit


def test_a_hole_drops_a_character_left_unfinished_before_it():
    log = EventLog(started=0.0, limit=1 << 20)
    log.output(0, 0, b"a" + "✓".encode()[:2], 1.0)
    log.output(0, 10, b"b", 2.0)
    lines = file_of(log, event_line(3.0, "x", "0"))
    assert output_of(lines) == b"ab"
    assert [json.loads(line)[1:] for line in lines[1:]] == [
        ["o", "a"], ["m", "7 bytes of output were not recorded here"], ["o", "b"], ["x", "0"]
    ]  # fmt: skip


def test_chunks_written_before_output_was_taken_raw_still_make_the_file():
    """A recording begun by an older worker holds its output as event lines: one file with what came after."""
    old = event_line(1.0, "o", "héllo ") + event_line(1.5, "m", "ls") + b"# a comment\n"
    log = EventLog(started=0.0, limit=1 << 20, end=len("héllo ".encode()))
    log.output(0, 7, "wörld".encode(), 2.0)
    lines = lines_of(write_v3(HEADER, [old, log.take().lines], 0.0, event_line(3.0, "x", "0")))
    assert output_of(lines) == "héllo wörld".encode()
    assert lines[3] == b"# a comment\n"
    events = [json.loads(line) for line in lines[1:] if not line.startswith(b"#")]
    assert events == [[1.0, "o", "héllo "], [0.5, "m", "ls"], [0.5, "o", "wörld"], [1.0, "x", "0"]]


def test_a_recording_still_being_made_reads_as_v3_and_v2_line_by_line():
    log = EventLog(started=0.0, limit=1 << 20)
    for n in range(3):
        log.output(0, n * 2, f"{n}\n".encode(), float(n))
    chunks = [log.take().lines, log.take().lines]  # as its chunks hold it: many lines to a chunk
    lines = list(write_v3(HEADER, chunks, 0.0))
    assert all(line.count(b"\n") == 1 for line in lines) and len(lines) == 4
    v2 = [json.loads(line) for line in v2_from_v3(lines)]
    assert [event[1:] for event in v2[1:]] == [["o", "0\n"], ["o", "1\n"], ["o", "2\n"]]


def test_a_hole_met_at_the_size_bound_cuts_the_recording_once_where_the_hole_began():
    log = EventLog(started=0.0, limit=40)
    log.output(0, 0, b"12345", 1.0)
    log.output(0, 1000, b"after the hole", 2.0)  # its marker does not fit: the cut is where the hole began
    lines = file_of(log)
    assert log.truncated_at == 5
    assert sum(line.startswith(b"# recording cut here") for line in lines) == 1
    assert output_of(lines) == b"12345"
