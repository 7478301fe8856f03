"""Observers and share links over the real path: read-only beside the writer, on the writer's grid, never holding
the shell back; a share link's socket closes at once when the link is revoked, and at its expiry."""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission
from django.utils import timezone
from websockets.exceptions import InvalidStatus

from recordings import actions
from recordings.models import ShareLink
from terminals.models import SessionEvent
from terminals.protocol import CloseCode, ErrorCode
from tests.bridge.harness import Stack, Viewer, http_post, open_viewer, session_cookie

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def watcher(django_user_model):
    """Staff who may watch other users' shells, but not write into them."""
    user = django_user_model.objects.create_user(username="watcher", password="watcher-password", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="observe_terminalsession"))
    return user


async def test_an_observer_sees_the_stream_on_the_writers_grid_and_cannot_type_resize_or_reset(
    stack, terminal, operator, watcher
):
    writer, session, _ = await open_viewer(stack, terminal, operator, cols=91, rows=27)
    await writer.type("echo first-$((1+1))\r")
    await writer.read_until(b"first-2")
    observer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(watcher))
    attached = await observer.observe()
    assert (attached["role"], attached["cols"], attached["rows"]) == ("observer", 91, 27)
    await observer.read_until(b"first-2")  # what came before it joined is replayed
    told = await writer.wait_for("observers")
    assert told["observers"] == [{"name": "watcher", "via": "staff"}]

    await writer.type("echo second-$((2+2))\r")
    await observer.read_until(b"second-4")
    await observer.type("echo typed-by-the-observer\r")
    refused = await observer.wait_for("error")
    assert refused["code"] == ErrorCode.READ_ONLY and "read-only" in refused["message"]
    await observer.send_json({"type": "resize", "cols": 40, "rows": 10})
    await observer.send_json({"type": "reset"})
    await observer.send_json({"type": "attach", "since": 0, "cols": 40, "rows": 10})  # not the writer: refused
    await asyncio.sleep(1.0)
    assert b"typed-by-the-observer" not in writer.output
    await writer.type("stty size\r")
    await writer.read_until(b"27 91")  # the observer changed nothing
    # The writer's new grid reaches the observer, at the point of the stream it applies from.
    await writer.send_json({"type": "resize", "cols": 120, "rows": 30})
    grid = await observer.wait_for("grid")
    assert (grid["cols"], grid["rows"]) == (120, 30)
    # The observer leaves: the writer is told; its watching is on the record.
    await observer.close()
    assert (await writer.wait_for("observers"))["observers"] == []
    kinds = await sync_to_async(
        lambda: list(SessionEvent.objects.filter(session=session).values_list("kind", "user__username"))
    )()
    assert ("observed", "watcher") in kinds


async def test_staff_without_the_permission_cannot_watch_and_a_watcher_cannot_take_over(
    stack, terminal, operator, watcher, django_user_model
):
    _, session, _ = await open_viewer(stack, terminal, operator)
    plain_staff = await sync_to_async(django_user_model.objects.create_user)(username="plain", is_staff=True)
    with pytest.raises(InvalidStatus):
        await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(plain_staff))
    observer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(watcher))
    await observer.send_json({"type": "takeover", "since": 0, "cols": 80, "rows": 24})
    refused = await observer.wait_for("error")
    assert "you may watch it" in refused["message"]


async def test_a_share_link_watches_until_revoked_and_its_socket_closes_at_once(stack, terminal, operator, alice):
    writer, session, _ = await open_viewer(stack, terminal, operator)
    link, token = await sync_to_async(actions.create_share_link)(operator, session)
    alice_cookie = await sync_to_async(session_cookie)(alice)
    shared = await Viewer.open(stack.ports[0], None, alice_cookie, path=f"/ws/shares/{token}/")
    attached = await shared.observe()
    assert attached["role"] == "observer"
    assert (await writer.wait_for("observers"))["observers"] == [{"name": "alice", "via": "share link"}]
    await writer.type("echo shared-$((3+3))\r")
    await shared.read_until(b"shared-6")
    await shared.send_json({"type": "attach", "since": 0, "cols": 80, "rows": 24})
    assert "read-only" in (await shared.wait_for("error"))["message"]
    # Another token, or none, opens nothing; neither does the session's own socket for alice.
    for path in (f"/ws/shares/{token[:-2]}xx/", f"/ws/terminals/{session.id}/"):
        with pytest.raises(InvalidStatus):
            await Viewer.open(stack.ports[0], session.id, alice_cookie, path=path)

    # Revoked the way the share dialog does it, through daphne.
    operator_cookie = await sync_to_async(session_cookie)(operator)
    started = asyncio.get_running_loop().time()
    status, body = await asyncio.to_thread(http_post, stack.ports[0], f"/shares/{link.pk}/revoke/", operator_cookie)
    assert status == 200 and b"was revoked" in body
    assert (await writer.wait_for("observers", timeout=2))["observers"] == []  # the writer is told at once too
    closed = await shared.wait_for("closed", timeout=5)
    assert closed["reason"] == "share_revoked"
    assert await shared.wait_closed() == CloseCode.SHARE_ENDED
    assert asyncio.get_running_loop().time() - started < 2.0  # at once, not at the next periodic check
    with pytest.raises(InvalidStatus):
        await Viewer.open(stack.ports[0], None, alice_cookie, path=f"/ws/shares/{token}/")
    kinds = await sync_to_async(
        lambda: list(SessionEvent.objects.filter(session=session).values_list("kind", flat=True))
    )()
    assert {"share_created", "share_revoked", "observed"} <= set(kinds)


async def test_a_share_links_socket_closes_when_the_link_expires(stack, terminal, operator, alice):
    _, session, _ = await open_viewer(stack, terminal, operator)
    link, token = await sync_to_async(actions.create_share_link)(operator, session)
    soon = timezone.now() + timedelta(seconds=3)
    await sync_to_async(ShareLink.objects.filter(pk=link.pk).update)(expires_at=soon)
    shared = await Viewer.open(
        stack.ports[0], None, await sync_to_async(session_cookie)(alice), path=f"/ws/shares/{token}/"
    )
    await shared.observe()
    closed = await shared.wait_for("closed", timeout=10)
    assert closed["reason"] == "share_expired"
    assert await shared.wait_closed() == CloseCode.SHARE_ENDED


async def test_an_observer_forgotten_while_its_daphne_was_stopped_watches_again_once_it_runs(
    operator, watcher, terminal
):
    stack = Stack(extra_env={"TETHER_VIEWER_CHECK_SECONDS": "1"})
    try:
        await sync_to_async(stack.start_daphne)()
        await sync_to_async(stack.start)("local")
        writer, session, _ = await open_viewer(stack, terminal, operator)
        observer = await Viewer.open(stack.ports[1], session.id, await sync_to_async(session_cookie)(watcher))
        await observer.observe()
        assert (await writer.wait_for("observers"))["observers"] == [{"name": "watcher", "via": "staff"}]
        stopped = stack.daphnes[1]
        stopped.send_signal(signal.SIGSTOP)  # its keep-alives stop: after three checks the worker forgets it
        try:
            assert (await writer.wait_for("observers", timeout=10))["observers"] == []
        finally:
            stopped.send_signal(signal.SIGCONT)
        # Its next keep-alive is answered with not_watching, and its consumer observes again by itself.
        assert (await writer.wait_for("observers", timeout=10))["observers"] == [{"name": "watcher", "via": "staff"}]
        await writer.type("echo back-$((4+4))\r")
        await observer.read_until(b"back-8")
    finally:
        await sync_to_async(stack.stop)()


async def test_watching_ends_when_the_permission_that_allowed_it_is_taken_away(
    operator, watcher, terminal, alice, django_user_model
):
    stack = Stack(extra_env={"TETHER_VIEWER_CHECK_SECONDS": "1"})
    try:
        await sync_to_async(stack.start)("local")
        writer, session, _ = await open_viewer(stack, terminal, operator)
        observer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(watcher))
        await observer.observe()
        # A link the watcher made, watched by alice.
        await sync_to_async(watcher.user_permissions.add)(
            await sync_to_async(Permission.objects.get)(codename="add_sharelink")
        )
        watcher = await sync_to_async(django_user_model.objects.get)(pk=watcher.pk)  # its permissions read afresh
        _, token = await sync_to_async(actions.create_share_link)(watcher, session)
        shared = await Viewer.open(
            stack.ports[0], None, await sync_to_async(session_cookie)(alice), path=f"/ws/shares/{token}/"
        )
        await shared.observe()

        await sync_to_async(watcher.user_permissions.clear)()
        closed = await observer.wait_for("closed", timeout=5)
        assert closed["reason"] == "not_allowed" and "no longer watch" in closed["text"]
        assert await observer.wait_closed() == CloseCode.CLOSED
        closed = await shared.wait_for("closed", timeout=8)  # the link's maker may no longer share it
        assert closed["reason"] == "share_revoked" and "no longer works" in closed["text"]
        await writer.type("echo after-$((5+5))\r")
        await writer.read_until(b"after-10")  # the writer is untouched
    finally:
        await sync_to_async(stack.stop)()
