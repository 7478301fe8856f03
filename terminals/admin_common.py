"""What the terminals app's admin modules share (admin.py, admin_workers.py, and recordings/admin.py): an action
confirmed with a reason, lists cut to what a staff member may watch, rows written only elsewhere."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q
from django.template.response import TemplateResponse

from access.policy import Do, reach_of
from executions.actions import Actor
from executions.admin import NothingEditableOnChange
from executions.errors import ExecutionError


class ReasonForm(forms.Form):
    reason = forms.CharField(required=True, max_length=500, help_text="Recorded with the event.")


def confirmed_action(name: str, description: str, each, *, permission: str, noun: str, label="", title="", then=None):
    """An admin action that asks for confirmation and a reason (Django's delete_selected flow), then runs
    ``each(obj, actor, reason)`` per selected object: a refusal is reported with its reason and the rest carry
    on. ``then(done)``, given the objects it was done to, may answer instead of the list (a progress page).
    ``label`` is the action's name in the menu, ``title`` the confirmation's question."""

    def run(modeladmin, request, queryset):
        form = ReasonForm(request.POST if request.POST.get("post") else None)
        if request.POST.get("post") and form.is_valid():
            actor, reason = Actor.for_user(request.user), form.cleaned_data["reason"]
            done = []
            for obj in queryset:
                try:
                    each(obj, actor, reason)
                except ExecutionError as refused:  # another operator moved it a moment ago
                    modeladmin.message_user(request, f"{obj}: {refused}", messages.ERROR)
                else:
                    done.append(obj)
            if then is not None and (answer := then(done)) is not None:
                return answer
            if done:
                modeladmin.message_user(request, f"{description}: {len(done)}", messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "admin/terminals/confirm_action.html",
            {
                **modeladmin.admin_site.each_context(request),
                "title": title or f"{description}?",
                "description": description,
                "action": name,
                "noun": noun,
                "queryset": queryset,
                "form": form,
                "opts": modeladmin.model._meta,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            },
        )

    run.__name__ = name
    return admin.action(description=label or f"{description}…", permissions=[permission])(run)


class Watched:
    """An admin list of what happens on machines, cut to the workspaces this staff member may watch (their
    grants or permissions) and their own work there; a superuser sees all. What they may not reach is not
    listed, and its change page answers as a missing one."""

    machine_path = "machine"
    owner_paths: tuple[str, ...] = ("user",)

    def get_list_filter(self, request):
        # A filter by machine would list every machine's name: only for who sees them all.
        found = super().get_list_filter(request)
        if request.user.is_superuser:
            return found
        return [name for name in found if name != self.machine_path]

    def get_queryset(self, request):
        found = super().get_queryset(request)
        user = request.user
        if user.is_superuser:
            return found
        reach = reach_of(user)
        mine = Q()
        for owner in self.owner_paths:
            mine |= Q(**{owner: user})
        watched = Q(**{f"{self.machine_path}__in": reach.machines(Do.WATCH)})
        return found.filter(watched | (mine & Q(**{f"{self.machine_path}__in": reach.machines(Do.SEE)})))


class WrittenElsewhere(NothingEditableOnChange):
    """Rows only their owner writes (a worker, the commands its shells mark): shown, never added, changed
    or deleted here."""

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        return
