"""The staff command line: names, --json output, exit statuses and one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from executions import actions
from executions.models import Evidence, Execution, Machine, State
from tests.factories import TEST_ACTOR, make_machine, make_spec

ROOT = Path(__file__).resolve().parents[2]
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

    assert data["created"] is True

    again = manage(*submit)
    assert again.returncode == 0
    resubmitted = json.loads(again.stdout)
    assert resubmitted["created_at"] == data["created_at"] and resubmitted["created"] is False

    shown = manage("exec_show", "team-a", "job-1")
    assert shown.returncode == 0
    assert "team-a/job-1 on box1: Pending" in shown.stdout


def test_exit_statuses_and_one_line_errors(operator):
    make_machine("box2", scope="team-a")
    submit = ["exec_submit", "--scope", "team-a", "--id", "job", "--machine", "box2", "--"]
    assert manage(*submit, "true").returncode == 0

    conflict = manage(*submit, "false")
    assert conflict.returncode == 3
    assert "different spec" in conflict.stderr and len(conflict.stderr.strip().splitlines()) == 1

    busy = manage("exec_submit", "--scope", "team-a", "--id", "other", "--machine", "box2", "--", "true")
    assert busy.returncode == 4
    assert "held by team-a/job (pending)" in busy.stderr

    refused = manage("exec_resolve", "team-a", "job", "--note", "gone", "--by", "operator")
    assert refused.returncode == 4
    assert "is pending; cannot move it to resolved" in refused.stderr

    missing = manage("exec_show", "team-a", "nope")
    assert missing.returncode == 5 and "no execution team-a/nope" in missing.stderr

    usage = manage("exec_submit", "--scope", "team-a", "--id", "x", "--machine", "box2", "--cols", "999", "--", "sh")
    assert usage.returncode == 2 and "cols" in usage.stderr

    assert manage("exec_show").returncode == 2  # argparse usage error


def test_exec_resolve_frees_the_slot_of_an_unknown_execution(operator, alice):
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
    assert no_note.returncode == 2  # usage: the note is part of the request
    assert one_line(no_note) == "CommandError: --note is required: say what evidence shows the process is gone"

    # Who resolves is named: the login this runs as is no Tether user here, and alice lacks the permission.
    anonymous = manage("exec_resolve", "team-a", "lost", "--note", "container removed")
    assert anonymous.returncode == 2
    assert "say who resolves it: --by USERNAME" in one_line(anonymous)
    unpermitted = manage("exec_resolve", "team-a", "lost", "--note", "container removed", "--by", "alice")
    assert unpermitted.returncode == 2 and "alice may not resolve executions" in one_line(unpermitted)

    resolved = manage("exec_resolve", "team-a", "lost", "--note", "container removed", "--by", "operator", "--json")
    assert resolved.returncode == 0, resolved.stderr
    data = json.loads(resolved.stdout)
    assert (data["state"], data["evidence"], data["exit_code"]) == ("resolved", "operator_resolved", None)
    assert data["resolved_by"] == "operator"
    event = execution.events.get(to_state=State.RESOLVED)
    assert (event.actor, event.user, event.detail["via"]) == ("user:operator", operator, "command:exec_resolve")
    machine.refresh_from_db()
    assert machine.active_execution is None


def test_exec_await_returns_at_a_final_state_and_waits_out_an_unknown_one():
    machine = make_machine("box-await", scope="team-a")
    submitted, _ = actions.submit_execution(
        scope="team-a", execution_id="never", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
    )
    actions.cancel_execution(submitted, actor=TEST_ACTOR, reason="not needed")
    cancelled = manage("exec_await", "team-a", "never", "--timeout", "5", "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "cancelled"

    lost, _ = actions.submit_execution(
        scope="team-a", execution_id="lost", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
    )
    lost = actions.transition(
        lost, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR, ran_on_ref="", ran_on_incarnation=1
    )
    actions.transition(lost, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)
    # Unknown is not an outcome: a script waiting on it must not read success.
    waited = manage("exec_await", "team-a", "lost", "--timeout", "1", "--json")
    assert waited.returncode == 6
    assert json.loads(waited.stdout)["state"] == "unknown"
    assert "unknown until an operator resolves it" in one_line(waited)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The error, asserted to be exactly one line on stderr (no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_exec_show_json_prints_one_object_with_the_documented_fields():
    machine = make_machine("box4", scope="team-a")
    execution, _ = actions.submit_execution(
        scope="team-a", execution_id="shown", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
    )
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    actions.transition(execution, State.COMPLETED, evidence=Evidence.EXITED, exit_code=7, actor=TEST_ACTOR)
    shown = manage("exec_show", "team-a", "shown", "--json")
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.strip().splitlines()) == 1
    data = json.loads(shown.stdout)
    assert {k: data[k] for k in ("scope", "execution_id", "state", "evidence", "exit_code", "machine")} == {
        "scope": "team-a",
        "execution_id": "shown",
        "state": "completed",
        "evidence": "exited",
        "exit_code": 7,
        "machine": "box4",
    }


def test_identity_conflicts_exit_3():
    make_machine("box5", scope="team-a")
    make_machine("box6", scope="team-a")
    submit = ["exec_submit", "--scope", "team-a", "--id", "placed", "--json"]
    assert manage(*submit, "--machine", "box5", "--", "true").returncode == 0
    elsewhere = manage(*submit, "--machine", "box6", "--", "true")
    assert elsewhere.returncode == 3
    assert one_line(elsewhere) == "CommandError: team-a/placed already exists on machine box5, not box6"
    assert elsewhere.stdout == ""

    twice = manage("machine_add", "box5", "--backend", "local")
    assert twice.returncode == 3
    assert one_line(twice) == "CommandError: a machine named 'box5' already exists"


def test_not_found_exits_5(operator):
    missing_machine = manage("exec_submit", "--scope", "team-a", "--id", "j", "--machine", "nope", "--", "true")
    assert missing_machine.returncode == 5
    assert one_line(missing_machine) == "CommandError: no machine named 'nope'"

    missing_execution = manage("exec_resolve", "team-a", "ghost", "--note", "container removed", "--by", "operator")
    assert missing_execution.returncode == 5
    assert one_line(missing_execution) == "CommandError: no execution team-a/ghost"


def test_blank_resolution_note_is_a_usage_error():
    missing = manage("exec_resolve", "team-a", "ghost", "--note", "")
    assert missing.returncode == 2  # the request is malformed before anything is looked up
    assert one_line(missing) == "CommandError: --note is required: say what evidence shows the process is gone"


def test_values_too_long_for_their_column_are_usage_errors():
    def refused(*args: str) -> str:
        result = manage(*args)
        assert result.returncode == 2, result.stderr
        return one_line(result)

    assert refused("machine_add", "n" * 300, "--backend", "local") == (
        "CommandError: NAME is 300 characters long; at most 100 fit"
    )
    assert refused("machine_add", "long-ref", "--backend", "docker", "--ref", "r" * 256) == (
        "CommandError: --ref is 256 characters long; at most 255 fit"
    )
    assert refused("machine_add", "long-engine", "--backend", "docker", "--ref", "c", "--engine", "e" * 300) == (
        "CommandError: --engine is 300 characters long; at most 255 fit"
    )
    assert refused("machine_add", "long-scope", "--backend", "local", "--scope", "s" * 201) == (
        "CommandError: --scope is 201 characters long; at most 200 fit"
    )
    assert not Machine.objects.exists()

    make_machine("box7", scope="team-a")
    submit = ["exec_submit", "--machine", "box7"]
    assert refused(*submit, "--scope", "s" * 300, "--id", "j", "--", "true") == (
        "CommandError: --scope is 300 characters long; at most 200 fit"
    )
    assert refused(*submit, "--scope", "team-a", "--id", "i" * 201, "--", "true") == (
        "CommandError: --id is 201 characters long; at most 200 fit"
    )
    assert not Execution.objects.exists()


def test_refused_resolve_lists_each_check_once_then_one_error_line(operator):
    machine = make_machine("box8", scope="team-a")
    execution, _ = actions.submit_execution(
        scope="team-a", execution_id="moved", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
    )
    # It ran on another incarnation of the machine than the one there now: the machine check fails.
    execution = actions.transition(
        execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR, ran_on_ref="", ran_on_incarnation=2
    )
    actions.transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)
    refused = manage("exec_resolve", "team-a", "moved", "--note", "looked", "--by", "operator")
    assert refused.returncode == 4
    lines = refused.stderr.strip().splitlines()
    assert lines[-1] == "CommandError: team-a/moved cannot be resolved: check failed: machine"
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "[ok] owner",
        "[FAILED] machine",
        "[ok] process",
        "[ok] note",
    ]


def test_machine_add_refuses_an_engine_off_docker_or_one_that_is_not_a_url():
    def refused(*args: str) -> str:
        result = manage("machine_add", *args)
        assert result.returncode == 2, result.stderr
        return one_line(result)

    assert refused("box9", "--backend", "tmux", "--engine", "unix:///var/run/docker.sock") == (
        "CommandError: --engine: an engine URL is only for docker machines, not tmux"
    )
    assert refused("box9", "--backend", "local", "--engine", "tcp://docker.example:2376") == (
        "CommandError: --engine: an engine URL is only for docker machines, not local"
    )
    assert refused("box9", "--backend", "docker", "--ref", "web", "--engine", "docker.example:2375").startswith(
        "CommandError: --engine: engine 'docker.example:2375' is not a docker engine URL; use unix:///PATH, tcp://"
    )
    assert not Machine.objects.exists()
    added = manage("machine_add", "box9", "--backend", "docker", "--ref", "web", "--engine", "ssh://deploy@builder")
    assert added.returncode == 0, added.stderr
    assert Machine.objects.get(name="box9").engine == "ssh://deploy@builder"


def test_machines_are_listed_stopped_started_and_deleted_but_never_under_a_held_slot(operator):
    assert manage("machine_add", "web", "--backend", "local", "--scope", "team-a").returncode == 0
    placed = manage("machine_add", "far", "--backend", "tmux", "--ref", "s", "--host", "host-b")
    assert placed.returncode == 0 and "on host host-b" in placed.stdout
    holder, _ = actions.submit_execution(
        scope="team-a", execution_id="busy", machine_name="web", spec=make_spec("true"), actor=TEST_ACTOR
    )
    listed = manage("machine_list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert (rows["web"]["slot"], rows["web"]["slot_state"], rows["far"]["host"]) == ("team-a/busy", "pending", "host-b")
    assert "slot: team-a/busy (pending)" in manage("machine_list").stdout

    for verb in ("stop", "delete"):
        refused = manage(f"machine_{verb}", "web")
        assert refused.returncode == 4
        assert "command slot is held by team-a/busy (pending)" in one_line(refused)
    assert Machine.objects.get(name="web").state == "running"

    actions.cancel_execution(holder, actor=TEST_ACTOR)
    assert manage("machine_stop", "web", "--reason", "maintenance").stdout.strip() == "machine web stopped"
    assert manage("machine_start", "web").returncode == 0
    assert manage("machine_delete", "web").returncode == 0
    assert Machine.objects.get(name="web").state == "deleted"
    events = list(Machine.objects.get(name="web").events.values_list("to_state", "actor"))
    assert events[-3:] == [
        ("stopped", "command:machine_stop"),
        ("running", "command:machine_start"),
        ("deleted", "command:machine_delete"),
    ]
    assert "web" not in manage("machine_list").stdout and "web" in manage("machine_list", "--all").stdout
    assert manage("machine_stop", "nope").returncode == 5


def test_ensure_admin_never_changes_an_admin_made_by_someone_else(django_user_model, tmp_path, monkeypatch):
    admin = django_user_model.objects.create_superuser(username="admin", email="", password="Operators-Own-1234")
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path))  # no stored login of ensure_admin's there
    ran = manage("ensure_admin")
    assert ran.returncode == 0, ran.stderr
    assert "admin exists with a password of its own (not shown)" in ran.stdout
    admin.refresh_from_db()
    assert admin.check_password("Operators-Own-1234")
    fresh = manage("ensure_admin", "--username", "embedded-admin")
    username, password = re.search(r"Admin login: (\S+) / (\S+)", fresh.stdout).groups()
    assert django_user_model.objects.get(username=username).check_password(password)
    assert manage("ensure_admin", "--username", "embedded-admin").stdout == fresh.stdout  # the same every time
