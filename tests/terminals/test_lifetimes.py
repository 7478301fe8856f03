"""The lifetime rules on their own: who is warned, who is closed, and why."""

from terminals.lifetimes import Limits, Verdict, judge, warning_lead


def verdict(limits: Limits, *, age: float, quiet: float, produced: int = 0, interactive: bool = True):
    return judge(
        limits,
        now=1000.0,
        started=1000.0 - age,
        last_activity=1000.0 - quiet,
        produced=produced,
        interactive=interactive,
    )


def test_idle_warns_first_then_closes():
    limits = Limits(idle_seconds=1800)
    assert warning_lead(1800) == 300
    assert verdict(limits, age=2000, quiet=1000) is None
    assert verdict(limits, age=2000, quiet=1600) == Verdict("warn", "idle", 200)
    assert verdict(limits, age=2000, quiet=1800) == Verdict("close", "idle")


def test_idle_does_not_apply_to_commands_but_deadline_and_output_do():
    limits = Limits(idle_seconds=10, session_seconds=60, output_limit_bytes=100)
    assert verdict(limits, age=30, quiet=30, interactive=False) is None
    assert verdict(limits, age=61, quiet=0, interactive=False) == Verdict("close", "deadline")
    assert verdict(limits, age=1, quiet=0, produced=101, interactive=False) == Verdict("close", "output_limit")


def test_deadline_wins_over_idle_and_zero_means_no_limit():
    assert verdict(Limits(idle_seconds=10, session_seconds=10), age=11, quiet=11) == Verdict("close", "deadline")
    assert verdict(Limits(), age=10**6, quiet=10**6, produced=10**12) is None


def test_a_short_limit_is_always_warned_before_it_closes_whatever_the_check_phase():
    """The worker checks about once a second, never exactly: some check must land in the warning window."""
    limits = Limits(idle_seconds=4)
    for phase in range(20):
        seen = []
        for k in range(12):
            quiet = phase * 0.05 + k * 1.08  # checks a little over a second apart
            result = verdict(limits, age=100, quiet=quiet)
            if result is not None:
                seen.append(result.action)
        assert seen and seen[0] == "warn", (phase, seen)
        assert "close" in seen
