"""Admin for recordings (played here with asciinema-player, for those who may see the session) and share links
(revoked here, at once, behind confirmation and the permission to revoke another user's link)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from executions.admin import badge
from recordings import actions
from recordings.models import Recording, RecordingState, ShareLink
from recordings.views import player_state
from terminals.actions.permissions import may_view_session
from terminals.admin_common import Watched, WrittenElsewhere, confirmed_action

STATE_COLOURS = {
    RecordingState.RECORDING: "#2563eb",
    RecordingState.SAVED: "#16a34a",
    RecordingState.EXPIRED: "#6b7280",
}


@admin.register(Recording)
class RecordingAdmin(Watched, WrittenElsewhere, admin.ModelAdmin):
    """Recordings: written by the shells' owners, read-only here; their change page plays them."""

    machine_path, owner_paths = "session__machine", ("session__user",)

    list_display = ["id", "session", "machine", "owner", "generation", "state_badge", "length", "size", "started_at"]
    list_filter = ["state", "input_recorded", "session__machine"]
    search_fields = ["session__id", "session__machine__name", "session__user__username"]
    list_select_related = ["session__machine", "session__user"]
    exclude = ["markers"]
    readonly_fields = [
        *(f.name for f in Recording._meta.fields if f.name != "markers"),
        "commands",
        "links",
    ]
    change_form_template = "admin/recordings/recording/change_form.html"

    def get_readonly_fields(self, request, obj=None):
        """The typed commands are the session's to show: only to those who may see it."""
        fields = super().get_readonly_fields(request, obj)
        if obj is not None and not may_view_session(request.user, obj.session):
            return [name for name in fields if name != "commands"]
        return fields

    @admin.display(description="machine", ordering="session__machine__name")
    def machine(self, obj):
        return obj.session.machine.name

    @admin.display(description="whose", ordering="session__user__username")
    def owner(self, obj):
        return obj.session.user.get_username()

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        title = f"cut at output offset {obj.truncated_at}" if obj.truncated_at is not None else obj.state
        return badge(obj.state + (" (cut)" if obj.truncated_at is not None else ""), STATE_COLOURS[obj.state], title)

    @admin.display(description="length")
    def length(self, obj):
        return "recording now" if obj.state == RecordingState.RECORDING else f"{obj.duration:.0f} s"

    @admin.display(description="file size")
    def size(self, obj):
        return f"{obj.file_bytes / 1024:.1f} KiB" if obj.file_bytes else "—"

    @admin.display(description="commands (markers)")
    def commands(self, obj):
        return format_html("<br>".join(["{}"] * len(obj.markers)), *(f"{t:.1f} s  {label}" for t, label in obj.markers))

    @admin.display(description="share links")
    def links(self, obj):
        count = obj.share_links.count()
        url = reverse("admin:recordings_sharelink_changelist") + f"?recording__id__exact={obj.pk}"
        return format_html('<a href="{}">{} share link(s)</a>', url, count)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Played here only for those who may see its session (its owner, or staff who may watch others'
        shells); each play is on the record, as in the portal."""
        extra = dict(extra_context or {})
        recording = Recording.objects.select_related("session").filter(pk=object_id).first()
        if recording and recording.playable and may_view_session(request.user, recording.session):
            actions.note_recording_seen(recording, request.user, "played", format="admin")
            extra["player_state"] = player_state(recording, reverse("recordings:recording_cast", args=[recording.pk]))
            extra["portal_url"] = reverse("recordings:recording", args=[recording.pk])
        elif recording and recording.playable:
            extra["not_playable"] = "Playing another user's recording needs the permission to watch their shells."
        return super().change_view(request, object_id, form_url, extra)


# Revoke share links now (their open sockets close), after confirmation, with a reason on the record.
revoke_links = confirmed_action(
    "revoke_links",
    "Revoke",
    lambda link, actor, reason: actions.revoke_share_link(link.pk, actor.user, reason=reason),
    permission="revoke",
    noun="share links",
    label="Revoke the selected share links…",
    title="Revoke these share links?",
)


@admin.register(ShareLink)
class ShareLinkAdmin(Watched, WrittenElsewhere, admin.ModelAdmin):
    """Share links: made by people in the portal (only a fingerprint of each is kept), revoked here."""

    machine_path, owner_paths = "session__machine", ("created_by", "session__user")

    list_display = ["id", "session", "kind", "created_by", "created_at", "expires_at", "revoked", "opened"]
    list_filter = ["revoked_at", "created_at"]
    search_fields = ["session__id", "created_by__username", "session__machine__name"]
    list_select_related = ["session__machine", "created_by", "revoked_by"]
    readonly_fields = [f.name for f in ShareLink._meta.fields if f.name != "token_hash"]
    exclude = ["token_hash"]
    actions = [revoke_links]

    @admin.display(description="revoked")
    def revoked(self, obj):
        return f"{obj.revoked_at:%Y-%m-%d %H:%M} by {obj.revoked_by}" if obj.revoked_at else "—"

    def has_revoke_permission(self, request):
        return request.user.has_perm("recordings.revoke_sharelink")
