"""The two modes tmux 3.3a does not tell (bracketed paste, focus events), followed in a pane's output by its owner
(terminals/backends/tmux_screen.py, ModeWatch)."""

from __future__ import annotations

from terminals.backends.tmux_screen import Modes, ModeWatch, Snapshot


def test_each_change_is_said_once_and_the_last_of_a_read_wins():
    watch = ModeWatch()
    assert watch.feed(b"plain text, no escape") == {}
    assert watch.feed(b"\x1b[?2004h$ ") == {"paste": True}
    assert watch.feed(b"\x1b[?2004h$ again") == {}  # bash sets it at every prompt: nothing new
    assert watch.feed(b"\x1b[?2004l\x1b[?1004h\x1b[?2004h") == {"focus": True}  # paste off, then on again
    assert watch.known == {"paste": True, "focus": True}


def test_several_modes_in_one_sequence_and_others_left_alone():
    watch = ModeWatch()
    assert watch.feed(b"\x1b[?1000;1004;2004h\x1b[?25l\x1b[4h\x1b[2004l") == {"focus": True, "paste": True}
    assert watch.feed(b"\x1b[?1049;1004l") == {"focus": False}


def test_a_sequence_cut_between_two_reads_is_seen():
    whole = b"output \x1b[?2004h"
    for cut in range(1, len(b"\x1b[?2004h")):
        watch = ModeWatch()
        assert watch.feed(whole[: 7 + cut]) == {}
        assert watch.feed(whole[7 + cut :] + b" more") == {"paste": True}


def test_what_the_owner_saw_is_drawn_over_what_the_session_kept():
    kept = Snapshot(b"$ ", 2, 0, 80, 24, Modes(paste=False, focus=True))
    assert b"\x1b[?1004h" in kept.render() and b"\x1b[?2004h" not in kept.render()
    watch = ModeWatch()
    assert watch.over(kept) is kept  # nothing seen: the session's record stands
    watch.feed(b"\x1b[?2004h")
    drawn = watch.over(kept).render()
    assert b"\x1b[?2004h" in drawn and b"\x1b[?1004h" in drawn  # focus as kept, paste as seen
