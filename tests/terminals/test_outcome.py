"""The outcome value: what an owner saw, turned into what is recorded, with no process and no database."""

from __future__ import annotations

import signal

from executions.models import Evidence, State
from terminals.backends.base import Exit
from terminals.outcome import Outcome
from terminals.protocol import Reason


def test_an_observed_exit_is_recorded_as_the_programs_own():
    outcome = Outcome.of(Exit(code=7, source="waitpid"), ended_for=None, lost="")
    assert (outcome.state, outcome.evidence, outcome.close_reason) == (State.COMPLETED, Evidence.EXITED, Reason.EXITED)
    assert outcome.fields == {"exit_code": 7} and outcome.note == "Exited with code 7"
    signalled = Outcome.of(Exit(signal=signal.SIGSEGV, source="waitpid"), ended_for=None, lost="")
    assert (signalled.evidence, signalled.fields) == (Evidence.SIGNALED, {"exit_signal": signal.SIGSEGV})
    ambiguous = Outcome.of(Exit(code=137, source="docker", ambiguous=True), ended_for=None, lost="")
    assert ambiguous.evidence == Evidence.EXIT_STATUS


def test_no_exit_or_an_end_not_proven_is_unknown():
    assert Outcome.of(None, ended_for=None, lost="no exit could be observed").state == State.UNKNOWN
    # We ended it, and an exit came, but the tree could not be proven gone: its end is not known.
    unproven = Outcome.of(Exit(signal=9, source="waitpid"), ended_for=Reason.KILLED, lost="terminate failed")
    assert (unproven.state, unproven.evidence, unproven.close_reason) == (
        State.UNKNOWN,
        Evidence.CONTROLLER_LOST,
        Reason.CONTROLLER_LOST,
    )
    assert unproven.note == "terminate failed"


def test_an_end_we_caused_says_why_and_keeps_how_the_program_took_it():
    idle = Outcome.of(Exit(signal=signal.SIGHUP, source="waitpid"), ended_for=Reason.IDLE, lost="")
    assert (idle.evidence, idle.close_reason, idle.fields) == (Evidence.IDLE_REAPED, Reason.IDLE, {"exit_signal": 1})
    stopped = Outcome.of(Exit(signal=signal.SIGKILL, source="waitpid"), ended_for=Reason.SERVER_RESTART, lost="")
    assert (stopped.evidence, stopped.close_reason) == (Evidence.KILLED, Reason.SERVER_RESTART)
    # Asked to finish, the program's own exit is its outcome (it may have finished well).
    finished = Outcome.of(Exit(code=0, source="waitpid"), ended_for=Reason.COMPLETED, lost="")
    assert (finished.evidence, finished.close_reason, finished.fields) == (
        Evidence.EXITED,
        Reason.COMPLETED,
        {"exit_code": 0},
    )


def test_recovery_and_launch_outcomes():
    assert Outcome.unknown("lost").close_reason == Reason.CONTROLLER_LOST
    assert Outcome.spawn_failed("program not found: x").evidence == Evidence.SPAWN_FAILED
    assert (Outcome.never_started("n").state, Outcome.never_started("n").close_reason) == (
        State.COMPLETED,
        Reason.NEVER_STARTED,
    )
    read = Outcome.read_back(Exit(code=3, source="tmux"), "Exited with code 3: read back")
    assert (read.state, read.fields, read.close_reason) == (State.COMPLETED, {"exit_code": 3}, Reason.EXITED)
