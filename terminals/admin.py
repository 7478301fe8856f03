"""Admin for sessions, leases and workers: inspection, and operator actions behind confirmation and permissions.
Also the executions' resolve page, since its checks are this app's."""

from __future__ import annotations

import re

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince

from access.policy import RESOLVE_PERMISSION, Do, may
from executions import actions as exec_actions
from executions import admin as executions_admin
from executions.actions import Actor
from executions.admin import badge
from executions.errors import ExecutionError, Refused
from executions.models import Execution, State
from terminals import actions
from terminals.admin_common import Watched, WrittenElsewhere, confirmed_action
from terminals.models import CommandRecord, ProcessLease, SessionEvent, TerminalSession
from terminals.resolution import ResolveRefused, resolve, run_checks

# Terminal control sequences: CSI (colours, cursor moves, modes), OSC (titles), and two-byte escapes.
# CSI, OSC, then any other escape (keypad ESC = and ESC >, a charset's ESC ( B, DECSC ESC 7, ...).
_ESCAPES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]")


COMMANDS_SHOWN = 50
COMMAND_COLOURS = {"running": "#2563eb", "exited": "#16a34a", "unknown": "#d97706"}


def screen_text(raw: bytes) -> str:
    """A snapshot as plain text for people: escape sequences and stray control bytes removed."""
    text = _ESCAPES.sub(b"", raw).replace(b"\r\n", b"\n").decode("utf-8", "replace")
    lines = [line.rsplit("\r", 1)[-1] for line in text.split("\n")]  # a carriage return redraws the line
    return "\n".join("".join(ch for ch in line if ch == "\t" or ch >= " ") for line in lines)


def _confirmed_action(action: str, description: str):
    """A session action of an operator's (terminals.actions.operator_session_action), confirmed, with a reason:
    the permission lets one into the action, the workspace decides each session (operate there, or one's own)."""

    def each(session, actor, reason):
        if not may(actor.user, Do.OPERATE, session):
            raise Refused(f"your role on {session.machine.name} does not let you {action} another user's shell")
        actions.operator_session_action(session, action, actor=actor, reason=reason)

    return confirmed_action(f"{action}_sessions", description, each, permission=action, noun="sessions")


class SessionEventInline(admin.TabularInline):
    model = SessionEvent
    fields = readonly_fields = ["at", "kind", "actor", "reason", "detail"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TerminalSession)
class TerminalSessionAdmin(Watched, WrittenElsewhere, admin.ModelAdmin):
    list_display = [
        "id",
        "machine",
        "user",
        "generation",
        "state_badge",
        "snapshot_kind",
        "close_reason",
        "lease_owner",
        "heartbeat_age",
        "outlives_worker",
        "last_screen_line",
        "updated_at",
    ]
    list_filter = ["process_state", "snapshot_kind", "close_reason", "machine"]
    search_fields = ["id", "machine__name", "user__username"]
    list_select_related = ["machine", "user", "execution__lease__worker"]
    inlines = [SessionEventInline]
    exclude = ["snapshot", "last_screen", "last_screen_exact", "marks_nonce", "marks_note", "marks_generation"]
    readonly_fields = [
        "id",
        "machine",
        "user",
        "execution",
        "generation",
        "process_state",
        "snapshot_kind",
        "snapshot_hidden",
        "close_reason",
        "output_offset",
        "viewer_id",
        "last_viewer_at",
        "created_at",
        "closed_at",
        "expired_at",
        "lease_owner",
        "lease_token",
        "heartbeat_age",
        "outlives_worker",
        "commands_tracked",
        "commands_table",
        "snapshot_text",
    ]
    actions = [
        _confirmed_action("dismiss", "Dismiss the snapshot"),
        _confirmed_action("complete", "Ask the process to complete"),
        _confirmed_action("fail", "Fail the session (end the process, archive a failed capture)"),
        _confirmed_action("kill", "Kill the session's process tree"),
        _confirmed_action("reset", "Reset to a fresh shell"),
    ]

    @admin.display(description="process state", ordering="process_state")
    def state_badge(self, obj):
        colour = {"live": "#16a34a", "closing": "#d97706"}.get(obj.process_state, "#6b7280")
        return badge(obj.process_state, colour, obj.get_close_reason_display() or obj.process_state)

    def _lease(self, obj) -> ProcessLease | None:
        """The lease as the list's query brought it (``list_select_related``): no query per row and column."""
        try:
            return obj.execution.lease
        except ProcessLease.DoesNotExist:
            return None

    @admin.display(description="owner worker")
    def lease_owner(self, obj):
        lease = self._lease(obj)
        if lease is None or lease.released_at:
            return "—"
        return str(lease.worker)

    @admin.display(description="outlives its worker")
    def outlives_worker(self, obj):
        """No, with why, for a live shell that no session holder (or tmux server) keeps."""
        lease = self._lease(obj)
        if lease is None or lease.released_at or lease.handle is None or not lease.handle.started:
            return "—"
        why = lease.ends_with_worker
        return badge("no", "#d97706", f"ends with its worker: {why}") if why else "yes"

    @admin.display(description="fencing token")
    def lease_token(self, obj):
        lease = self._lease(obj)
        return lease.token if lease else "—"

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj):
        lease = self._lease(obj)
        if lease is None or lease.released_at or lease.worker is None:
            return "—"
        if not lease.covered:  # its worker let go of it: it lasts to its own expiry, then recovery takes it
            return f"not kept by its worker (until {lease.expires_at:%H:%M:%S})"
        return timesince(lease.worker.heartbeat_at)

    @admin.display(description="commands tracked")
    def commands_tracked(self, obj):
        said = actions.tracking(obj)
        return "yes" if said["tracked"] else f"no: {said['why']}"

    @admin.display(description="latest commands")
    def commands_table(self, obj):
        """The latest typed commands with their evidence; all of them in the commands list."""
        records = list(obj.commands.order_by("-id")[:COMMANDS_SHOWN])
        if not records:
            return "—"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    r.generation,
                    r.command or "(kept out of history)",
                    badge(r.state, COMMAND_COLOURS.get(r.state, "#6b7280"), r.state),
                    "—" if r.exit_status is None else r.exit_status,
                    r.started_at.strftime("%Y-%m-%d %H:%M:%S"),
                    r.evidence,
                )
                for r in records
            ),
        )
        link = reverse("admin:terminals_commandrecord_changelist") + f"?session__id__exact={obj.pk}"
        return format_html(
            "<table><tr><th>gen</th><th>command</th><th>state</th><th>status</th><th>started</th><th>evidence</th>"
            '</tr>{}</table><p><a href="{}">All {} commands of this session</a></p>',
            rows,
            link,
            obj.commands.count(),
        )

    @admin.display(description="last screen")
    def last_screen_line(self, obj):
        """The last row a closed shell's page showed (its whole screen is on the session's page)."""
        if obj.snapshot_hidden or obj.expired_at or obj.process_state != "closed" or not obj.last_screen:
            return ""
        line = obj.last_screen.rsplit("\n", 1)[-1].strip()
        return line if len(line) <= 60 else f"{line[:59]}…"

    @admin.display(description="latest snapshot")
    def snapshot_text(self, obj):
        if obj.snapshot_hidden:
            return "(dismissed)"
        if obj.expired_at:
            return "(removed by retention cleanup)"
        # Its last screen as its page showed it (rendered when it ended); else its output's tail, plainly.
        text = obj.last_screen or screen_text(bytes(obj.snapshot))
        if obj.last_screen and not obj.last_screen_exact:
            text = f"[drawn from the output kept: rows drawn before it may be missing]\n{text}"
        if obj.process_state != "closed":
            # The live screen is the worker's; what is kept here is a closed shell's final screen.
            if obj.generation == 1 or not obj.snapshot:
                return "(live: its screen is held by its worker; open the terminal to see it)"
            text = f"[the previous shell's final screen; generation {obj.generation} runs now]\n{text}"
        return format_html(
            '<pre style="max-height:30em;overflow:auto;background:#111;color:#eee;padding:8px">{}</pre>', text
        )

    # Written elsewhere: saving once wrote every field back as read, the viewer id among them, which
    # superseded both open windows with no event. A session changes only through its actions.

    def _has(self, request, action: str) -> bool:
        return request.user.has_perm(f"terminals.{action}_terminalsession")

    def has_dismiss_permission(self, request):
        return self._has(request, "dismiss")

    def has_complete_permission(self, request):
        return self._has(request, "complete")

    def has_fail_permission(self, request):
        return self._has(request, "fail")

    def has_kill_permission(self, request):
        return self._has(request, "kill")

    def has_reset_permission(self, request):
        return self._has(request, "reset")


@admin.register(CommandRecord)
class CommandRecordAdmin(Watched, WrittenElsewhere, admin.ModelAdmin):
    """Typed commands, as their shells' marks told them: read-only (the owner worker writes them)."""

    machine_path, owner_paths = "session__machine", ("session__user",)

    list_display = ["command", "state", "exit_status", "started_at", "ended_at", "session", "generation"]
    list_filter = ["state"]
    search_fields = ["command", "session__id", "session__machine__name"]
    list_select_related = ["session__machine"]
    readonly_fields = [f.name for f in CommandRecord._meta.fields]


# The executions app registers its admin first (it is imported above); this one adds the resolution
# procedure, whose checks look at this app's workers and backends.
admin.site.unregister(Execution)


@admin.register(Execution)
class ExecutionAdmin(Watched, executions_admin.ExecutionAdmin):
    owner_paths = ("requested_by", "terminal_session__user")

    @admin.action(description="Cancel selected pending executions", permissions=["change"])
    def cancel_pending(self, request, queryset):
        """As the executions app's, with the workspace asked first: operate there, or the command one's own."""
        actor = Actor.for_user(request.user)

        def cancel(execution):
            if not may(request.user, Do.OPERATE, execution):
                raise Refused(f"your role on {execution.machine.name} does not let you cancel another user's command")
            exec_actions.cancel_execution(execution, actor=actor, reason="admin")

        executions_admin.apply_each(self, request, queryset, cancel, "Cancelled")

    def get_queryset(self, request):
        # Resolving an unknown outcome is staff's with the permission wherever it happened (access.policy).
        if request.user.has_perm(RESOLVE_PERMISSION):
            return super(Watched, self).get_queryset(request)
        return super().get_queryset(request)

    @admin.display(description="resolution")
    def resolution(self, obj: Execution):
        if obj.state != State.UNKNOWN:
            return obj.outcome_label
        url = reverse("admin:executions_execution_resolve", args=[obj.pk])
        return format_html('{} — <a href="{}">check and resolve…</a>', obj.outcome_label, url)

    def get_urls(self):
        resolve_page = self.admin_site.admin_view(self.resolve_view)
        return [path("<int:pk>/resolve/", resolve_page, name="executions_execution_resolve"), *super().get_urls()]

    def resolve_view(self, request, pk: int):
        """The resolution procedure: the checks shown as Tether ran them; a POST runs them again and resolves."""
        if not request.user.has_perm("executions.resolve_execution"):
            raise PermissionDenied
        execution = get_object_or_404(Execution.objects.select_related("machine"), pk=pk)
        note = request.POST.get("note", "") if request.method == "POST" else ""
        if request.method == "POST":
            try:
                resolve(execution, actor=Actor.for_user(request.user), note=note, via="admin")
            except ResolveRefused as refused:
                failed = ", ".join(c.name for c in refused.checks if not c.ok)
                self.message_user(request, f"Refused: check failed: {failed}", messages.ERROR)
                checks = refused.checks
            except ExecutionError as error:
                self.message_user(request, str(error), messages.ERROR)
                return redirect("admin:executions_execution_change", pk)
            else:
                self.message_user(request, f"{execution} resolved: outcome unknown, slot freed", messages.SUCCESS)
                return redirect("admin:executions_execution_change", pk)
        elif execution.state != State.UNKNOWN:
            self.message_user(
                request, f"{execution} is {execution.state}: only unknown can be resolved", messages.ERROR
            )
            return redirect("admin:executions_execution_change", pk)
        else:
            checks = run_checks(execution, note)
        context = {**self.admin_site.each_context(request), "execution": execution, "checks": checks, "note": note}
        context["title"] = f"Resolve {execution}"
        return TemplateResponse(request, "admin/executions/resolve.html", context)


# The workers and the recovery console have an admin module of their own (recordings and share links are in
# the recordings app's).
from terminals import admin_workers  # noqa: E402, F401
