"""The recovery procedure in the admin (docs/operations.md): Workers (each with its state, heartbeat and what it
holds; Drain), Recovery (the dry run, and Run recovery) and Unknown outcomes (each check as it stands now, and
what to do next). Every action is the command line's own (``drain_worker``, ``recover_terminals``'s pass,
``resolve``), behind confirmation and a permission of its own; none bypasses a check."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path

from executions.actions import Actor
from executions.admin import badge
from terminals import actions, console
from terminals.admin_common import WrittenElsewhere, confirmed_action
from terminals.models import Worker, WorkerEvent

STATUS_COLOURS = {
    console.Shown.RUNNING: "#16a34a",
    console.Shown.DRAINING: "#d97706",
    console.Shown.STOPPED: "#6b7280",
    console.Shown.PRESUMED_DEAD: "#b91c1c",
    console.Shown.RECOVERY_PASS: "#9ca3af",  # a short-lived owner of a pass run by hand
}


class WorkerEventInline(admin.TabularInline):
    model = WorkerEvent
    fields = readonly_fields = ["at", "from_state", "to_state", "actor", "reason", "detail"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _drain(worker, actor, reason) -> None:
    actions.drain_worker(worker.worker_id, actor=actor, reason=reason)


def _progress(drained):
    """One worker drained: its progress page, refreshing itself until it has stopped."""
    return redirect("admin:terminals_worker_drain", drained[0].pk) if len(drained) == 1 else None


# Drain (confirmation, a reason): the worker takes no new work, leaves what can be adopted, ends and records
# the rest, and stops. Then its progress, until it has stopped.
drain_workers = confirmed_action(
    "drain_workers",
    "Drain (stop taking work; leave tmux and held shells for adoption, end the rest; stop)",
    _drain,
    permission="drain",
    noun="workers",
    label="Drain the selected workers…",
    title="Drain these workers?",
    then=_progress,
)


@admin.register(Worker)
class WorkerAdmin(WrittenElsewhere, admin.ModelAdmin):
    """Workers: their state moves only through drain and their own stop."""

    list_display = ["worker_id", "host", "pid", "status_badge", "heartbeat", "sessions", "commands", "started_at"]
    list_filter = ["state", "host"]
    readonly_fields = [f.name for f in Worker._meta.fields]
    inlines = [WorkerEventInline]
    actions = [drain_workers]
    change_list_template = "admin/terminals/worker/change_list.html"

    def get_queryset(self, request):
        return console.with_holdings(super().get_queryset(request))

    @admin.display(description="state", ordering="state")
    def status_badge(self, obj):
        status = console.status_of(obj)
        return badge(status, STATUS_COLOURS[status], f"state {obj.state}")

    @admin.display(description="heartbeat age (database clock)", ordering="heartbeat_at")
    def heartbeat(self, obj):
        return f"{obj.age.total_seconds():.0f} s"

    @admin.display(description="sessions held", ordering="sessions")
    def sessions(self, obj):
        return obj.sessions

    @admin.display(description="commands held", ordering="commands")
    def commands(self, obj):
        return obj.commands

    def has_drain_permission(self, request):
        return request.user.has_perm("terminals.drain_worker")

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<int:pk>/drain/", view(self.drain_view), name="terminals_worker_drain"),
            path("recovery/", view(self.recovery_view), name="terminals_worker_recovery"),
            path("unknowns/", view(self.unknowns_view), name="terminals_worker_unknowns"),
            *super().get_urls(),
        ]

    def _page(self, request, template: str, title: str, **context) -> TemplateResponse:
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": title, **context}
        return TemplateResponse(request, template, context)

    def drain_view(self, request, pk: int):
        """A drain's progress: refreshed (htmx) until the worker has stopped."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        get_object_or_404(Worker, pk=pk)
        progress = console.drain_progress(pk)
        template = "admin/terminals/worker/drain.html"
        if request.headers.get("HX-Request"):
            template += "#progress"
        title = f"{'Draining' if progress.drained_at else 'Worker'} {progress.worker.worker_id[:12]}"
        return self._page(request, template, title, progress=progress)

    def recovery_view(self, request):
        """The recovery pass, first as a dry run (nothing changes); Run recovery (confirmed, with its
        permission) runs recover_terminals' own pass and shows what it did."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        may_run = request.user.has_perm("terminals.run_recovery")
        done = None
        if request.method == "POST":
            if not may_run:
                raise PermissionDenied
            if request.POST.get("confirm") != "yes":
                return self._page(
                    request, "admin/terminals/worker/recovery.html", "Run recovery?", confirm=True, may_run=may_run
                )
            done = async_to_sync(console.recover_by_hand)(Actor.for_user(request.user), "admin")
            self.message_user(
                request, f"Recovery run: {len(done)} finding(s), each below with what became of it", messages.SUCCESS
            )
        planned = console.recovery_preview()
        return self._page(
            request, "admin/terminals/worker/recovery.html", "Recovery", planned=planned, done=done, may_run=may_run
        )

    def unknowns_view(self, request):
        """Every unknown outcome, oldest first, with each resolution check as it stands now."""
        if not request.user.has_perm("executions.view_execution"):
            raise PermissionDenied
        rows = console.unknown_queue()
        may_resolve = request.user.has_perm("executions.resolve_execution")
        context = {"rows": rows, "may_resolve": may_resolve, "may_drain": self.has_drain_permission(request)}
        context["may_see_workers"] = self.has_view_permission(request)
        return self._page(request, "admin/terminals/worker/unknowns.html", "Unknown outcomes", **context)
