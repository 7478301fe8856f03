"""Recordings and share links through Django's test client: who may play, download, share and revoke what, a
recording's file as the finisher writes it, the admin's player, and every play, download and link on the record."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission
from django.utils import timezone

from executions.errors import UsageError
from executions.models import Backend
from recordings import actions as recording_actions
from recordings import store
from recordings.asciicast import EventLog, output_of
from recordings.models import Recording, RecordingChunk, ShareLink
from terminals import actions
from terminals.models import SessionEvent
from tests.factories import grant, make_machine
from tests.terminals.test_views import finish, logged_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded(alice):
    """Alice's shell on a docker workspace, recorded and exited with code 7: its recording finished the way an
    owner worker finishes it (chunks, then the file)."""
    machine = make_machine("rec-box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    log = EventLog(started=1_000.0, limit=1 << 20)
    log.output(0, 0, "héllo ✓\r\n".encode(), 1_001.0)
    log.marker("make deploy", 1_002.0)
    log.output(0, log.end, b"deployed\r\n", 1_003.0)
    taken = log.take()
    recording = Recording.objects.create(
        session=session, execution=session.execution, generation=1, started_at=timezone.now(), started_epoch=1_000.0,
        cols=80, rows=24, markers=taken.markers, chunks=1, output_end=taken.end,
    )  # fmt: skip
    chunk = store.save_chunk(recording.pk, 0, taken.lines)  # as the owner writes it, then names it
    RecordingChunk.objects.create(recording=recording, number=0, file=chunk)
    finish(session, 7)
    assert recording_actions.finish_recording(recording.pk) is not None
    assert recording_actions.finish_recording(recording.pk) is None  # finished once
    recording.refresh_from_db()
    return recording


def body_of(response) -> bytes:
    """A streamed cast, read the way the ASGI server reads it (a batch of lines at a time)."""

    async def read() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(read)()


def events(session, kind: str) -> list[dict]:
    return list(SessionEvent.objects.filter(session=session, kind=kind).values_list("detail", flat=True))


def test_a_finished_recording_is_one_file_with_the_output_the_markers_and_the_observed_exit(recorded, alice):
    assert recorded.state == "saved" and not RecordingChunk.objects.filter(recording=recorded).exists()
    client = logged_in(alice)
    body = body_of(client.get(f"/recordings/{recorded.pk}/cast"))
    lines = body.splitlines(keepends=True)
    header = json.loads(lines[0])
    assert header["tether"]["outcome"] == "Exited with code 7" and header["term"] == {
        "cols": 80,
        "rows": 24,
        "type": "xterm-256color",
    }
    assert output_of(lines) == "héllo ✓\r\ndeployed\r\n".encode()
    assert [json.loads(line)[1:] for line in lines[1:]][-2:] == [["o", "deployed\r\n"], ["x", "7"]]
    assert events(recorded.session, "recording_downloaded") == []  # the player's own fetch is its page's play


def test_the_player_page_lists_the_commands_and_each_play_and_download_is_audited(recorded, alice):
    client = logged_in(alice)
    page = client.get(f"/recordings/{recorded.pk}/")
    assert page.status_code == 200
    assert b"make deploy" in page.content and b"Exited with code 7" in page.content
    download = client.get(f"/recordings/{recorded.pk}/cast?download=1&format=v2")
    assert download["Content-Disposition"].startswith('attachment; filename="rec-box-')
    assert json.loads(body_of(download).splitlines()[0])["version"] == 2
    assert [d["format"] for d in events(recorded.session, "recording_downloaded")] == ["v2"]
    assert len(events(recorded.session, "recording_played")) == 1
    assert client.get(f"/recordings/{recorded.pk}/cast?format=v9").status_code == 404


def test_recordings_follow_the_sessions_permissions(recorded, bob, operator, django_user_model):
    for user in (bob, django_user_model.objects.create_user("plain-staff", is_staff=True)):
        client = logged_in(user)
        for path in (f"/recordings/{recorded.pk}/", f"/recordings/{recorded.pk}/cast?download=1"):
            assert client.get(path).status_code == 404, (user, path)
        assert b"generation 1" not in client.get("/machines/rec-box/recordings/").content
    watcher = logged_in(operator)  # staff with the permission to watch others' shells
    assert watcher.get(f"/recordings/{recorded.pk}/").status_code == 200
    assert b"generation 1" in watcher.get("/machines/rec-box/recordings/").content


def test_the_admin_plays_a_recording_for_staff_who_may_watch_and_not_others(recorded, admin_user, django_user_model):
    url = f"/admin/recordings/recording/{recorded.pk}/change/"
    page = logged_in(admin_user).get(url)
    assert page.status_code == 200 and b'id="recording-state"' in page.content and b"make deploy" in page.content
    assert events(recorded.session, "recording_played")[-1]["format"] == "admin"
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_recording"))
    page = logged_in(viewer).get(url)  # a workspace he may not watch: the recording is not there for him
    assert page.status_code == 302 and b"make deploy" not in page.content
    assert b"generation" not in logged_in(viewer).get("/admin/recordings/recording/").content


def test_a_share_link_to_a_recording_plays_for_anyone_signed_in_until_revoked(recorded, alice, bob):
    link, token = recording_actions.create_share_link(alice, recorded.session, recording=recorded, seconds=600)
    assert link.token_hash != token and token not in ShareLink.objects.values_list("token_hash", flat=True)
    client = logged_in(bob)
    page = client.get(f"/shares/{token}/")
    assert page.status_code == 200 and b"Shared by alice" in page.content
    cast = body_of(client.get(f"/shares/{token}/cast?download=1"))
    assert b"deployed" in cast
    assert events(recorded.session, "share_opened")[0]["share_link"] == link.pk
    assert events(recorded.session, "recording_downloaded")[0]["share_link"] == link.pk
    # Signed out, nothing; a wrong token, nothing; revoked, nothing.
    assert logged_in(bob).get(f"/shares/{token[:-3]}abc/").status_code == 404
    anonymous = client.__class__().get(f"/shares/{token}/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    recording_actions.revoke_share_link(link.pk, alice)
    gone = client.get(f"/shares/{token}/")
    assert gone.status_code == 404 and b"was revoked, or has expired" in gone.content
    assert client.get(f"/shares/{token}/cast").status_code == 404


def test_an_expired_share_link_opens_nothing(recorded, alice, bob):
    link, token = recording_actions.create_share_link(alice, recorded.session, recording=recorded)
    assert abs((link.expires_at - timezone.now()) - timedelta(hours=1)) < timedelta(seconds=5)  # an hour by default
    ShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert logged_in(bob).get(f"/shares/{token}/").status_code == 404


def test_sharing_through_the_page_with_csrf_limits_and_only_by_those_allowed(recorded, alice, bob):
    session = recorded.session
    client = logged_in(alice, enforce_csrf_checks=True)
    assert client.post(f"/terminals/{session.id}/shares/", {"minutes": "60"}).status_code == 403  # no CSRF token
    client = logged_in(alice)
    made = client.post(f"/terminals/{session.id}/shares/", {"minutes": "15"}, headers={"HX-Request": "true"})
    assert made.status_code == 200 and b'id="new-share-link"' in made.content and b"<html" not in made.content
    too_long = client.post(f"/terminals/{session.id}/shares/", {"minutes": str(8 * 24 * 60)})
    assert b"a share link lasts from 60 to" in too_long.content
    assert b"must be a whole number" in client.post(f"/terminals/{session.id}/shares/", {"minutes": "abc"}).content
    assert ShareLink.objects.count() == 1
    assert logged_in(bob).post(f"/terminals/{session.id}/shares/", {"minutes": "15"}).status_code == 404
    link = ShareLink.objects.get()
    assert logged_in(bob).post(f"/shares/{link.pk}/revoke/").status_code == 404
    assert ShareLink.objects.get().revoked_at is None
    revoked = client.post(f"/shares/{link.pk}/revoke/")
    assert b"was revoked" in revoked.content and ShareLink.objects.get().revoked_by == alice
    assert b"revoked already" in client.post(f"/shares/{link.pk}/revoke/").content


def test_the_admin_revokes_share_links_after_confirmation_and_only_with_the_permission(
    recorded, alice, operator, django_user_model
):
    link, _ = recording_actions.create_share_link(alice, recorded.session)
    changelist = "/admin/recordings/sharelink/"
    action = {"action": "revoke_links", "_selected_action": [link.pk]}
    staff = operator  # staff with every terminals permission, revoking another user's link
    asked = logged_in(staff).post(changelist, action)
    assert b"Revoke for these share links" in asked.content and ShareLink.objects.get().revoked_at is None
    logged_in(staff).post(changelist, {**action, "post": "yes", "reason": "left the team"})
    link.refresh_from_db()
    assert link.revoked_by == staff and link.revoked_at is not None
    # Staff who may only look at links are not offered the action.
    looker = django_user_model.objects.create_user("looker", is_staff=True)
    looker.user_permissions.add(Permission.objects.get(codename="view_sharelink"))
    assert b"revoke_links" not in logged_in(looker).get(changelist).content
    assert SessionEvent.objects.get(session=recorded.session, kind="share_revoked").reason == "left the team"


def test_a_recording_is_shared_once_its_shell_has_ended(alice):
    machine = make_machine("live-rec-box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    recording = Recording.objects.create(
        session=session, execution=session.execution, generation=1, started_at=timezone.now(), started_epoch=0.0,
        cols=80, rows=24,
    )  # fmt: skip
    with pytest.raises(UsageError, match="once its shell has ended"):
        recording_actions.create_share_link(alice, session, recording=recording)
    panel = logged_in(alice).get(f"/terminals/{session.id}/shares/")
    assert b"the recording of generation" not in panel.content  # not offered either
