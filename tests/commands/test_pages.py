"""Where the records show, through Django's test client: the page's list is the session's and no one
else's; the workspace list's last command; the admin's commands with their evidence; turning tracking off
for a machine is an admin action with its event."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from executions.models import Backend, MachineEvent
from terminals import actions
from terminals.models import CommandRecord, TerminalSession
from tests.factories import grant, make_machine

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _record(session, command: str, state: str, status: int | None = None, offset: int = 0) -> CommandRecord:
    return CommandRecord.objects.create(
        session=session,
        execution=session.execution,
        generation=session.generation,
        stream=0,
        command=command,
        state=state,
        exit_status=status,
        started_at=timezone.now(),
        ended_at=timezone.now() if state != "running" else None,
        output_start=offset,
        evidence="started: the shell's command mark at offset 0",
    )


@pytest.fixture
def session(alice):
    machine = make_machine("box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    _record(session, "make test", "exited", 2, offset=10)
    _record(session, "make deploy", "running", offset=20)
    return session


def test_the_commands_list_is_the_sessions_own(session, alice, bob, client):
    body = _client(alice).get(f"/terminals/{session.id}/commands/").json()
    assert [(c["command"], c["state"], c["exit_status"]) for c in body["commands"]] == [
        ("make test", "exited", 2),
        ("make deploy", "running", None),
    ]
    assert body["tracking"] == {"tracked": False, "why": "this shell was started without Tether's shell integration"}
    # Started with the integration, but no mark has come (the user's own setup replaced the hook): said so.
    TerminalSession.objects.filter(pk=session.pk).update(marks_nonce="n")
    body = _client(alice).get(f"/terminals/{session.id}/commands/").json()
    assert not body["tracking"]["tracked"] and "its own setup may replace" in body["tracking"]["why"]
    TerminalSession.objects.filter(pk=session.pk).update(marks_generation=session.generation)
    assert _client(alice).get(f"/terminals/{session.id}/commands/").json()["tracking"]["tracked"]
    # Another user's session is no more visible than one that does not exist; nobody logged in is sent to log in.
    assert _client(bob).get(f"/terminals/{session.id}/commands/").status_code == 404
    assert client.get(f"/terminals/{session.id}/commands/").status_code == 302
    assert _client(alice).post(f"/terminals/{session.id}/commands/").status_code in (403, 405)


def test_my_workspaces_shows_the_last_command(session, alice, bob):
    page = _client(alice).get("/").content.decode()
    assert "make deploy" in page and "running since" in page
    assert "make deploy" not in _client(bob).get("/").content.decode()


def test_the_admin_lists_a_sessions_commands_and_turns_tracking_off(session, operator):
    admin = _client(operator)
    page = admin.get(f"/admin/terminals/terminalsession/{session.id}/change/").content.decode()
    assert "make test" in page and "started: the shell&#x27;s command mark at offset 0" in page
    assert "All 2 commands of this session" in page
    assert "marks_nonce" not in page
    listed = admin.get("/admin/terminals/commandrecord/", {"q": "deploy"}).content.decode()
    assert "make deploy" in listed and "make test" not in listed

    machine = session.machine
    response = admin.post(
        "/admin/executions/machine/",
        {"action": "stop_tracking_commands", "_selected_action": [machine.pk]},
        follow=True,
    )
    assert "1 machine(s) changed" in response.content.decode()
    machine.refresh_from_db()
    assert not machine.track_commands
    event = MachineEvent.objects.filter(machine=machine).last()
    assert event.reason == "command tracking turned off for its next shells" and event.user == operator


def _held(operator, name: str):
    """A local machine's terminal session whose execution a registered worker holds (its lease, token)."""
    from django.conf import settings

    session, _ = actions.open_terminal(make_machine(name, backend=Backend.LOCAL), operator)
    worker = actions.register_worker(
        worker_id=f"w-{name}", host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name=name
    )
    _, lease = actions.claim_next_execution(worker, {"local"})
    return session, {"worker": worker, "token": lease.token, "execution_pk": session.execution_id}


def _start(session, where, *, stream: int, offset: int, prompt: int | None, line: str = "make"):
    return actions.command_started(
        **where, session_pk=session.pk, generation=1, stream=stream, output_start=offset, command=line,
        source="history", shell_time=None, prompt=prompt,
    )[0]  # fmt: skip


def test_an_end_mark_closes_only_its_own_command(operator):
    """The end a shell marks is believed only when it is the command's: the next prompt after the one it
    was typed at. A later prompt's (its own end came while no worker read the shell), one from another
    owner's stream without prompt numbers, or a stop (Ctrl-Z) leaves it unknown."""
    session, where = _held(operator, "ends-box")
    record = _start(session, where, stream=7, offset=100, prompt=4)
    ended = actions.command_finished(**where, stream=7, offset=150, status=2, shell_time=None, prompt=5)
    assert (ended.state, ended.exit_status) == ("exited", 2)
    # Read again (a holder's stream replayed to a new owner): nothing new.
    assert actions.command_finished(**where, stream=7, offset=150, status=2, shell_time=None, prompt=5) is None

    record = _start(session, where, stream=7, offset=200, prompt=5)
    missed = actions.command_finished(**where, stream=8, offset=10, status=130, shell_time=None, prompt=7)
    assert missed.pk == record.pk and missed.state == "unknown" and missed.exit_status is None
    assert "prompt 7 came after it" in missed.evidence

    record = _start(session, where, stream=8, offset=20, prompt=None, line="cat")
    other = actions.command_finished(**where, stream=9, offset=5, status=0, shell_time=None)
    assert other.pk == record.pk and other.state == "unknown" and "no worker read" in other.evidence

    record = _start(session, where, stream=9, offset=30, prompt=8, line="vim")
    stopped = actions.command_finished(**where, stream=9, offset=40, status=148, shell_time=None, prompt=9)
    assert stopped.state == "unknown" and "Ctrl-Z" in stopped.evidence
