"""The recording format, with no I/O: events as they are taken, the file they make, and v2 from v3."""

from __future__ import annotations

import json

from terminals.asciicast import EventLog, event_line, output_of, parse_lines, v2_from_v3, write_v3

HEADER = {"term": {"cols": 80, "rows": 24, "type": "xterm-256color"}, "timestamp": 1000}


def file_of(log: EventLog, *closing: bytes) -> list[bytes]:
    """The file of what ``log`` took, then ``closing`` lines (how the shell ended, as finishing adds it)."""
    return b"".join(write_v3(HEADER, [log.take().lines, *closing], log.started)).splitlines(keepends=True)


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


def test_a_character_split_across_a_write_is_left_to_the_next_owner_whole():
    log = EventLog(started=0.0, limit=1 << 20)
    check = "✓".encode()
    log.output(0, 0, b"ok " + check[:1], 1.0)
    taken = log.take()
    assert taken.end == 3 and output_of([b"{}\n", taken.lines]) == b"ok "  # the split character is not counted
    log.output(0, 4, check[1:], 2.0)
    assert output_of([b"{}\n", log.take().lines]) == check
    log.output(0, 6, check[:2], 3.0)
    log.close(4.0)  # the output ended inside a character: it is written as U+FFFD, not lost silently
    assert output_of([b"{}\n", log.take().lines]) == "\ufffd".encode()


def test_a_recording_still_being_made_reads_as_v3_and_v2_line_by_line():
    log = EventLog(started=0.0, limit=1 << 20)
    for n in range(3):
        log.output(0, n * 2, f"{n}\n".encode(), float(n))
    chunks = [log.take().lines, log.take().lines]  # as its chunks hold it: many lines to a chunk
    lines = list(write_v3(HEADER, chunks, 0.0))
    assert all(line.count(b"\n") == 1 for line in lines) and len(lines) == 4
    v2 = [json.loads(line) for line in v2_from_v3(lines)]
    assert [event[1:] for event in v2[1:]] == [["o", "0\n"], ["o", "1\n"], ["o", "2\n"]]
