"""The grids an attach says its screen and replayed bytes were drawn for (terminals/owner/replay.py, drawn_for)."""

from __future__ import annotations

from types import SimpleNamespace

from terminals.owner.replay import drawn_for


def shell(grids, now, adopted=False):
    return SimpleNamespace(grids=grids, grid=now, adopted=adopted)


def test_the_grid_at_the_start_then_each_change_up_to_the_end():
    live = shell([(0, 80, 24), (500, 100, 30), (900, 120, 40), (2000, 60, 20)], (60, 20))
    assert drawn_for(live, 600, 1500) == ((600, 100, 30), (900, 120, 40))
    assert drawn_for(live, 900, 2000) == ((900, 120, 40), (2000, 60, 20))  # (a change at its very start counts)
    assert drawn_for(live, 0, 100) == ((0, 80, 24),)


def test_nothing_when_all_is_the_grid_now_or_the_changes_kept_do_not_reach_back():
    assert drawn_for(shell([(0, 80, 24)], (80, 24)), 300, 900) == ()
    assert drawn_for(shell([(0, 100, 30), (700, 80, 24)], (80, 24)), 700, 900) == ()
    assert drawn_for(shell([(500, 100, 30)], (80, 24)), 300, 900) == ()  # how it was drawn before 500 is not known


def test_a_screen_is_drawn_for_its_own_grid_and_a_change_at_its_offset_comes_after_it():
    """The emulator takes a change at the offset its screen is at only with the next byte (a review found the page
    told the new grid for a screen drawn for the old)."""
    live = shell([(0, 80, 24), (5000, 100, 30)], (100, 30))
    assert drawn_for(live, 5000, 9000, screen=(80, 24)) == ((5000, 80, 24), (5000, 100, 30))
    assert drawn_for(live, 6000, 9000, screen=(100, 30)) == ()


def test_an_adopted_shells_first_grid_is_not_taken_for_its_grid():
    """An adopter records the grid the shell was started with, not the one it had since: only the changes this
    owner saw count (a review found a page drawn at the launch grid after an adoption)."""
    live = shell([(0, 120, 40), (9000, 160, 50)], (160, 50), adopted=True)
    assert drawn_for(live, 4000, 9000) == ()
    assert drawn_for(live, 9000, 9500) == ()  # (drawn at the grid it has now)
    live = shell([(0, 120, 40), (9000, 160, 50), (9500, 100, 30)], (100, 30), adopted=True)
    assert drawn_for(live, 9000, 9800) == ((9000, 160, 50), (9500, 100, 30))
