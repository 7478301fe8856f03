"""Admin for inspection and rare intervention. State fields are read-only; actions go through actions.py.

Resolving an unknown execution needs checks only the terminals app can run; its admin adds that page.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html

from executions import actions
from executions.errors import ExecutionError, UsageError
from executions.models import Execution, ExecutionEvent, Machine, MachineEvent, MachineState, State


def badge(text: str, colour: str, title: str = ""):
    """A state as the admin's lists show it: a coloured pill, the sentence behind it on hover."""
    return format_html(
        '<span style="background:{};color:#fff;padding:1px 6px;border-radius:8px" title="{}">{}</span>',
        colour,
        title,
        text,
    )


_BADGE_COLOURS = {
    State.PENDING: "#6b7280",
    State.DISPATCHED: "#2563eb",
    State.RUNNING: "#16a34a",
    State.COMPLETED: "#0f766e",
    State.CANCELLED: "#6b7280",
    State.UNKNOWN: "#d97706",
    State.RESOLVED: "#7c3aed",
}


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ExecutionEventInline(ReadOnlyInline):
    model = ExecutionEvent
    fields = ["at", "from_state", "to_state", "evidence", "actor", "reason", "detail"]
    readonly_fields = fields


class MachineEventInline(ReadOnlyInline):
    model = MachineEvent
    fields = ["at", "kind", "from_state", "to_state", "actor", "reason", "detail"]
    readonly_fields = fields


class NothingEditableOnChange:
    """A change page that only shows: no save buttons, and a forged or stale POST saves nothing.

    ``obj.save()`` would write back every field as read at request start, silently reverting a
    transition a worker made meanwhile; state changes only through actions.py, with an event.
    Subclasses make ``save_model`` a no-op on change; the event inlines grant no add, change or delete.
    """

    _view_only = {"show_save": False, "show_save_and_continue": False, "show_save_and_add_another": False}

    def change_view(self, request, object_id, form_url="", extra_context=None):
        view_only = {**self._view_only, "title": f"View {self.opts.verbose_name}"}
        return super().change_view(request, object_id, form_url, {**view_only, **(extra_context or {})})


def apply_each(modeladmin, request, queryset, operation, done: str) -> None:
    """Run ``operation`` per object; a refusal is reported with its reason and the rest carry on."""
    succeeded = 0
    for obj in queryset:
        try:
            operation(obj)
        except ExecutionError as error:
            modeladmin.message_user(request, f"{obj}: {error}", messages.ERROR)
        else:
            succeeded += 1
    if succeeded:
        modeladmin.message_user(request, f"{done}: {succeeded}", messages.SUCCESS)


@admin.register(Machine)
class MachineAdmin(NothingEditableOnChange, admin.ModelAdmin):
    list_display = ["name", "backend", "ref", "host", "scope", "state", "slot_holder", "updated_at"]
    list_filter = ["backend", "state", "scope", "host"]
    search_fields = ["name", "ref", "scope", "host"]
    list_select_related = ["active_execution"]
    readonly_fields = ["state", "instance", "incarnation", "active_execution", "created_at", "updated_at"]
    inlines = [MachineEventInline]
    actions = ["stop_machines", "start_machines", "track_commands", "stop_tracking_commands"]

    @admin.display(description="command slot")
    def slot_holder(self, obj: Machine) -> str:
        holder = obj.active_execution
        return f"{holder} ({holder.state})" if holder else "free"

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.readonly_fields
        # Identity of an existing machine is fixed: a new container is a new machine.
        return [*self.readonly_fields, "name", "backend", "ref", "engine", "host", "scope", "track_commands",
                "file_roots"]  # fmt: skip

    def has_delete_permission(self, request, obj=None):
        return False  # machines are marked deleted through actions, never removed

    def save_model(self, request, obj, form, change):
        if change:
            return  # nothing on an existing machine is editable here (its file paths: manage.py machine_files)
        created = actions.add_machine(
            name=obj.name,
            backend=obj.backend,
            ref=obj.ref,
            scope=obj.scope,
            engine=obj.engine,
            host=obj.host,
            track_commands=obj.track_commands,
            labels=obj.labels or {},
            actor=actions.Actor.for_user(request.user),
        )
        if obj.file_roots:
            self._file_roots(request, created, obj.file_roots)
        obj.pk = created.pk
        obj.refresh_from_db()

    def _file_roots(self, request, machine: Machine, roots) -> None:
        try:
            actions.set_file_roots(machine, list(roots or []), actor=actions.Actor.for_user(request.user))
        except UsageError as error:
            self.message_user(request, str(error), level=messages.ERROR)

    @admin.action(description="Track the commands typed in their next shells", permissions=["change"])
    def track_commands(self, request, queryset):
        self._track(request, queryset, True)

    @admin.action(description="Stop tracking the commands typed in their next shells", permissions=["change"])
    def stop_tracking_commands(self, request, queryset):
        self._track(request, queryset, False)

    def _track(self, request, queryset, track: bool) -> None:
        actor = actions.Actor.for_user(request.user)
        changed = sum(actions.set_track_commands(machine, track, actor=actor) for machine in queryset)
        said = "tracks" if track else "no longer tracks"
        self.message_user(request, f"{changed} machine(s) changed: each {said} the commands of its next shells.")

    @admin.action(description="Stop selected machines (refused while a slot is held)", permissions=["change"])
    def stop_machines(self, request, queryset):
        actor = actions.Actor.for_user(request.user)
        apply_each(
            self,
            request,
            queryset,
            lambda m: actions.set_machine_state(m, MachineState.STOPPED, actor=actor),
            "Stopped",
        )

    @admin.action(description="Start selected machines", permissions=["change"])
    def start_machines(self, request, queryset):
        actor = actions.Actor.for_user(request.user)
        apply_each(
            self,
            request,
            queryset,
            lambda m: actions.set_machine_state(m, MachineState.RUNNING, actor=actor),
            "Started",
        )


@admin.register(Execution)
class ExecutionAdmin(NothingEditableOnChange, admin.ModelAdmin):
    list_display = ["__str__", "machine", "kind", "state_badge", "evidence", "exit_code", "created_at"]
    list_filter = ["state", "kind", "machine"]
    search_fields = ["scope", "execution_id", "aliases__alias_id"]
    list_select_related = ["machine"]
    inlines = [ExecutionEventInline]
    actions = ["cancel_pending"]
    readonly_fields = [
        "scope",
        "execution_id",
        "kind",
        "machine",
        "state",
        "resolution",
        "evidence",
        "exit_code",
        "exit_signal",
        "close_reason",
        "spec",
        "spec_digest",
        "parent",
        "requested_by",
        "created_at",
        "dispatched_at",
        "started_at",
        "ended_at",
        "resolved_at",
        "resolved_by",
        "resolution_note",
        "ran_on_ref",
        "ran_on_incarnation",
        "output_truncated",
    ]
    exclude = ["output"]

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Execution):
        return badge(obj.state, _BADGE_COLOURS.get(obj.state, "#6b7280"), obj.outcome_label)

    def has_add_permission(self, request):
        return False  # executions are submitted, never typed in

    def has_delete_permission(self, request, obj=None):
        return False  # never deleted to "fix" a state

    def save_model(self, request, obj, form, change):
        return  # executions are never added here, and nothing on one is editable

    @admin.action(description="Cancel selected pending executions", permissions=["change"])
    def cancel_pending(self, request, queryset):
        actor = actions.Actor.for_user(request.user)
        apply_each(
            self, request, queryset, lambda e: actions.cancel_execution(e, actor=actor, reason="admin"), "Cancelled"
        )

    @admin.display(description="resolution")
    def resolution(self, obj: Execution):
        return obj.outcome_label
