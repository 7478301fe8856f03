"""The staff command line: names, --json output, exit statuses and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from executions import actions
from executions.models import Evidence, State
from tests.factories import TEST_ACTOR, make_machine, make_spec

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def manage(*args: str) -> subprocess.CompletedProcess:
    """Run manage.py as staff would, against the test database."""
    db = connection.settings_dict
    url = f"postgres:///{db['NAME']}?host={db['HOST'] or '/var/run/postgresql'}"
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_machine_add_then_submit_show_and_resubmit():
    added = manage("machine_add", "box1", "--backend", "local", "--scope", "team-a")
    assert added.returncode == 0, added.stderr
    submit = [
        "exec_submit",
        "--scope",
        "team-a",
        "--id",
        "job-1",
        "--machine",
        "box1",
        "--json",
        "--",
        "echo",
        "-n",
        "hi",
    ]
    first = manage(*submit)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert {k: data[k] for k in ("scope", "execution_id", "state", "evidence", "exit_code", "machine")} == {
        "scope": "team-a",
        "execution_id": "job-1",
        "state": "pending",
        "evidence": "submitted",
        "exit_code": None,
        "machine": "box1",
    }
    assert data["spec"]["argv"] == ["echo", "-n", "hi"]

    again = manage(*submit)
    assert again.returncode == 0
    assert json.loads(again.stdout)["created_at"] == data["created_at"]

    shown = manage("exec_show", "team-a", "job-1")
    assert shown.returncode == 0
    assert "team-a/job-1 on box1: Pending" in shown.stdout


def test_exit_statuses_and_one_line_errors():
    make_machine("box2", scope="team-a")
    submit = ["exec_submit", "--scope", "team-a", "--id", "job", "--machine", "box2", "--"]
    assert manage(*submit, "true").returncode == 0

    conflict = manage(*submit, "false")
    assert conflict.returncode == 3
    assert "different spec" in conflict.stderr and len(conflict.stderr.strip().splitlines()) == 1

    busy = manage("exec_submit", "--scope", "team-a", "--id", "other", "--machine", "box2", "--", "true")
    assert busy.returncode == 4
    assert "held by team-a/job (pending)" in busy.stderr

    refused = manage("exec_resolve", "team-a", "job", "--note", "gone")
    assert refused.returncode == 4
    assert "is pending; cannot move it to resolved" in refused.stderr

    missing = manage("exec_show", "team-a", "nope")
    assert missing.returncode == 5 and "no execution team-a/nope" in missing.stderr

    usage = manage("exec_submit", "--scope", "team-a", "--id", "x", "--machine", "box2", "--cols", "999", "--", "sh")
    assert usage.returncode == 2 and "cols" in usage.stderr

    assert manage("exec_show").returncode == 2  # argparse usage error


def test_exec_resolve_frees_the_slot_of_an_unknown_execution():
    machine = make_machine("box3", scope="team-a")
    execution, _ = actions.submit_execution(
        scope="team-a",
        execution_id="lost",
        machine_name=machine.name,
        spec=make_spec("sleep", "100"),
        actor=TEST_ACTOR,
    )
    execution = actions.transition(
        execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR, ran_on_ref="", ran_on_incarnation=1
    )
    actions.transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)

    no_note = manage("exec_resolve", "team-a", "lost", "--note", " ")
    assert no_note.returncode == 4  # refused: a failed check, named
    assert "[FAILED] note" in no_note.stderr

    resolved = manage("exec_resolve", "team-a", "lost", "--note", "container removed", "--json")
    assert resolved.returncode == 0, resolved.stderr
    data = json.loads(resolved.stdout)
    assert (data["state"], data["evidence"], data["exit_code"]) == ("resolved", "operator_resolved", None)
    machine.refresh_from_db()
    assert machine.active_execution is None
