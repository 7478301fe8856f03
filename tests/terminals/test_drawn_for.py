"""The grids an attach says its screen and replayed bytes were drawn for (terminals/owner/replay.py, drawn_for)."""

from __future__ import annotations

from types import SimpleNamespace

from terminals.owner.replay import drawn_for


def shell(grids, now):
    return SimpleNamespace(grids=grids, grid=now)


def test_the_grid_at_the_start_then_each_change_up_to_the_end():
    live = shell([(0, 80, 24), (500, 100, 30), (900, 120, 40), (2000, 60, 20)], (60, 20))
    assert drawn_for(live, 600, 1500) == ((600, 100, 30), (900, 120, 40))
    assert drawn_for(live, 900, 2000) == ((900, 120, 40), (2000, 60, 20))  # (a change at its very start counts)
    assert drawn_for(live, 0, 100) == ((0, 80, 24),)


def test_nothing_when_all_is_the_grid_now_or_the_changes_kept_do_not_reach_back():
    assert drawn_for(shell([(0, 80, 24)], (80, 24)), 300, 900) == ()
    assert drawn_for(shell([(0, 100, 30), (700, 80, 24)], (80, 24)), 700, 900) == ()
    assert drawn_for(shell([(500, 100, 30)], (80, 24)), 300, 900) == ()  # how it was drawn before 500 is not known
