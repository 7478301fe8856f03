"""Recordings and share links in the portal: a workspace's recordings, playing one, downloading it (asciicast v3
or v2), and the links that share a live session or a recording. Every play, download and link opened is
audited on the session; who may see a recording is who may see its session."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST, require_safe

from access.policy import Do, may
from executions.errors import ExecutionError
from recordings import actions, asciicast
from recordings.models import Recording, RecordingState, ShareLink
from terminals.actions.permissions import may_share, may_view_session
from terminals.models import TerminalSession
from terminals.protocol import Role, Via
from terminals.views import seen_machine, terminal_page_state

SHARE_MINUTES = (15, 60, 8 * 60, 24 * 60)  # the choices the share form offers


def _recording(request: HttpRequest, pk: int) -> Recording:
    recording = Recording.objects.select_related("session__machine", "session__user", "execution").filter(pk=pk).first()
    if recording is None or not may_view_session(request.user, recording.session):
        raise Http404("No such recording")
    return recording


@login_required
@require_GET
def machine_recordings(request: HttpRequest, name: str) -> HttpResponse:
    """A workspace's recordings that this user may see, newest first."""
    machine = seen_machine(request.user, name)
    recordings = Recording.objects.filter(session__machine=machine).select_related("session__user", "execution")
    if not may(request.user, Do.WATCH, machine):  # others' shells are for those who may watch them
        recordings = recordings.filter(session__user=request.user)
    visible = list(recordings[:200])
    context = {"machine": machine, "recordings": visible, "retention_days": settings.TETHER_RECORDING_RETENTION_DAYS}
    return render(request, "recordings/recordings.html", context)


async def _streamed(lines: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A file read (and decompressed, or assembled from chunks) a batch of lines at a time in the sync thread,
    sent as it is read: under ASGI a plain iterator would be read whole into memory first."""
    batch = sync_to_async(lambda: b"".join(itertools.islice(lines, 512)))
    while data := await batch():
        yield data


def _cast_response(recording: Recording, fmt: str, download: bool) -> StreamingHttpResponse:
    lines = actions.cast_lines(recording)
    if fmt == "v2":
        lines = asciicast.v2_from_v3(lines)
    response = StreamingHttpResponse(_streamed(lines), content_type="application/x-asciicast; charset=utf-8")
    if download:
        name = f"{recording.session.machine.name}-{recording.session_id}-{recording.generation}"
        suffix = "-v2" if fmt == "v2" else ""
        response["Content-Disposition"] = f'attachment; filename="{name}{suffix}.cast"'
    response["Cache-Control"] = "private, no-store"
    return response


def _format(request: HttpRequest) -> str:
    fmt = request.GET.get("format", "v3")
    if fmt not in ("v3", "v2"):
        raise Http404("format is v3 or v2")
    return fmt


@login_required
@require_GET
def recording_cast(request: HttpRequest, pk: int) -> HttpResponse:
    """The recording as a .cast file (``format`` v3 or v2); ``download=1`` saves it (audited as a download;
    the player's own fetch is audited as its page's play)."""
    recording = _recording(request, pk)
    if not recording.playable:
        raise Http404("This recording is past its retention")
    fmt, download = _format(request), request.GET.get("download") == "1"
    if download:
        actions.note_recording_seen(recording, request.user, "downloaded", format=fmt)
    return _cast_response(recording, fmt, download)


def player_state(recording: Recording, cast_url: str) -> dict:
    """What the player's script (frontend/player.js) is told, in the portal and in the admin."""
    return {"castUrl": cast_url, "markers": recording.markers, "live": recording.state == RecordingState.RECORDING}


def _player_context(recording: Recording, cast_url: str, *, downloads: bool, link: ShareLink | None = None) -> dict:
    return {
        "recording": recording,
        "session": recording.session,
        "link": link,
        "downloads": downloads,
        "player_state": player_state(recording, cast_url),
    }


@login_required
@require_GET
def recording_player(request: HttpRequest, pk: int) -> HttpResponse:
    recording = _recording(request, pk)
    if recording.playable:
        actions.note_recording_seen(recording, request.user, "played")
    context = _player_context(recording, reverse("recordings:recording_cast", args=[pk]), downloads=True)
    context["may_share"] = may_share(request.user, recording.session)
    return render(request, "recordings/recording.html", context)


# --- share links -------------------------------------------------------------------------------


def _share_panel(request: HttpRequest, session: TerminalSession, **extra) -> HttpResponse:
    context = {
        "session": session,
        "links": actions.share_links_of(session, request.user),
        "recordings": list(session.recordings.filter(state=RecordingState.SAVED).select_related("execution")[:20]),
        "now": timezone.now(),
        "minutes": SHARE_MINUTES,
        "default_minutes": settings.TETHER_SHARE_LINK_SECONDS // 60,
        **extra,
    }
    # htmx swaps the panel in place; a plain request (or no JS) gets the whole page.
    return render(request, "recordings/shares.html#share-panel" if request.htmx else "recordings/shares.html", context)


def _shared_session(request: HttpRequest, session_id: UUID) -> TerminalSession:
    session = TerminalSession.objects.select_related("machine", "user").filter(pk=session_id).first()
    if session is None or not may_share(request.user, session):
        raise Http404("No such terminal")
    return session


@login_required
@require_http_methods(["GET", "POST"])
def session_shares(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The session's share links (GET), or a new one (POST: ``recording`` for a recording's, else the live
    session's; ``minutes`` it lasts). The new link's address is shown this once."""
    session = _shared_session(request, session_id)
    if request.method == "GET":
        return _share_panel(request, session)
    recording = None
    if raw := request.POST.get("recording"):
        recording = Recording.objects.filter(pk=int(raw) if raw.isdigit() else 0, session=session).first()
        if recording is None:
            return _share_panel(request, session, error="No such recording of this session")
    raw_minutes = request.POST.get("minutes", str(settings.TETHER_SHARE_LINK_SECONDS // 60))
    if not raw_minutes.isdigit():
        return _share_panel(request, session, error=f"minutes must be a whole number, not {raw_minutes[:20]!r}")
    try:
        seconds = int(raw_minutes) * 60
        link, token = actions.create_share_link(request.user, session, recording=recording, seconds=seconds)
    except ExecutionError as refused:
        return _share_panel(request, session, error=str(refused))
    address = request.build_absolute_uri(reverse("recordings:share", args=[token]))
    return _share_panel(request, session, new_link=link, new_address=address)


@login_required
@require_POST
def revoke_share(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        link = actions.revoke_share_link(pk, request.user)
    except ExecutionError as refused:
        link = ShareLink.objects.select_related("session").filter(pk=pk).first()
        if link is None or not actions.may_revoke_share(request.user, link):
            raise Http404("No such share link") from None
        return _share_panel(request, link.session, error=str(refused))
    return _share_panel(request, link.session, revoked=link)


def _link(token: str) -> ShareLink:
    link = actions.valid_share_link(token)
    if link is None:
        raise Http404("This share link does not exist, was revoked, or has expired")
    return link


@login_required
@require_safe
def share(request: HttpRequest, token: str) -> HttpResponse:
    """Open a share link: a live session watched read-only, or a recording played. (The page asks with HEAD
    whether it is still welcome, when its socket cannot connect: that is no opening.)"""
    link = _link(token)
    opened = request.method == "GET"
    if opened:
        actions.note_share_opened(link, request.user)
    if link.recording is not None:
        recording = link.recording
        recording.session = link.session
        if recording.playable and opened:
            actions.note_recording_seen(recording, request.user, "played", link=link)
        cast_url = reverse("recordings:share_cast", args=[token])
        return render(
            request, "recordings/recording.html", _player_context(recording, cast_url, downloads=True, link=link)
        )
    session = link.session
    page_state = terminal_page_state(
        request,
        session,
        ws_path=f"/ws/shares/{token}/",
        owner=session.user.get_username(),
        role=Role.OBSERVER,
        via=Via.SHARE_LINK,
        canTakeOver=False,
        expiresAt=link.expires_at.isoformat(),
        commandsUrl="",  # the typed commands are not the link holder's to list
    )
    return render(request, "terminals/terminal.html", {"session": session, "page_state": page_state, "link": link})


@login_required
@require_GET
def share_cast(request: HttpRequest, token: str) -> HttpResponse:
    link = _link(token)
    if link.recording is None or not link.recording.playable:
        raise Http404("This link shares no recording that is still kept")
    recording = link.recording
    recording.session = link.session
    fmt, download = _format(request), request.GET.get("download") == "1"
    if download:
        actions.note_recording_seen(recording, request.user, "downloaded", format=fmt, link=link)
    return _cast_response(recording, fmt, download)
