"""Access in the admin: grants (made and taken away through access.actions, each an audit event naming who),
grants on a machine's page and on a group's, a machine's labels, and "who can reach this workspace": every user
with a role on it and why."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import ActionLocation
from django.contrib.auth.admin import GroupAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from access import actions
from access.management.commands.access_report import grant_history
from access.models import Grant, GrantEvent
from access.policy import Do, reach_of
from access.report import who_can_reach
from executions.actions import Actor, set_labels
from executions.admin import MachineAdmin, ReadOnlyInline
from executions.errors import ExecutionError
from executions.labels import parse_labels, said
from executions.models import Machine


class GrantForm(forms.ModelForm):
    label = forms.CharField(required=False, help_text="key=value: every machine carrying this label (or a machine)")

    class Meta:
        model = Grant
        fields = ["user", "group", "machine", "label", "role", "note"]

    def clean(self):
        data = super().clean()
        if bool(data.get("user")) == bool(data.get("group")):
            raise ValidationError("Grant to exactly one user or one group.")
        if bool(data.get("machine")) == bool(data.get("label")):
            raise ValidationError("Grant on exactly one machine or one label (key=value).")
        return data


@admin.register(Grant)
class GrantAdmin(admin.ModelAdmin):
    form = GrantForm
    list_display = ["role", "subject", "target", "created_by", "created_at", "note"]
    list_filter = ["role", "group"]
    search_fields = ["user__username", "group__name", "machine__name", "label_key", "label_value"]
    list_select_related = ["user", "group", "machine"]
    actions = ["revoke_grants"]

    def get_changeform_initial_data(self, request):
        return {**super().get_changeform_initial_data(request)}  # ?machine=ID / ?group=ID prefill the form

    def get_readonly_fields(self, request, obj=None):
        # What a grant is on, and to whom, is fixed: another subject or target is another grant.
        return ["user", "group", "machine", "label_key", "label_value", "created_by"] if obj else []

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["user", "group", "machine", "label", "role", "note"]
        return ["user", "group", "machine", "label_key", "label_value", "role", "note", "created_by"]

    def save_model(self, request, obj, form, change):
        actor = Actor.for_user(request.user)
        if change:
            label = f"{obj.label_key}={obj.label_value}" if obj.label_key else None
            who = {"user": obj.user} if obj.user_id else {"group": obj.group}
            where = {"machine": obj.machine} if obj.machine_id else {"label": label}
            made, _ = actions.grant(role=obj.role, actor=actor, note=obj.note, **who, **where)
        else:
            data = form.cleaned_data
            who = {"user": data["user"]} if data.get("user") else {"group": data["group"]}
            where = {"machine": data["machine"]} if data.get("machine") else {"label": data["label"]}
            try:
                made, _ = actions.grant(role=data["role"], actor=actor, note=data.get("note", ""), **who, **where)
            except ExecutionError as refused:
                raise PermissionDenied(str(refused)) from None
            if data.get("label") and not actions.matching(*data["label"].split("=", 1)):
                messages.warning(request, f"label {data['label']} matches no machine yet: the grant waits for one")
        obj.pk = made.pk
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        actions.revoke_grant(obj.pk, actor=Actor.for_user(request.user), reason="revoked in the admin")

    def delete_queryset(self, request, queryset):
        for grant in queryset:
            self.delete_model(request, grant)

    @admin.action(description="Revoke selected grants (their holders' open sockets close)", permissions=["delete"])
    def revoke_grants(self, request, queryset):
        count = queryset.count()
        self.delete_queryset(request, queryset)
        self.message_user(request, f"revoked {count} grant(s)")

    def get_actions(self, request, action_location=ActionLocation.CHANGE_LIST):
        found = super().get_actions(request, action_location)
        found.pop("delete_selected", None)  # revoking goes through the action that records it
        return found


@admin.register(GrantEvent)
class GrantEventAdmin(admin.ModelAdmin):
    list_display = ["at", "kind", "role", "was", "subject", "target", "actor", "reason"]
    list_filter = ["kind", "role"]
    search_fields = ["subject", "target", "actor"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class GrantToGroupInline(ReadOnlyInline):
    model = Grant
    fk_name = "group"
    fields = ["role", "machine", "label_key", "label_value", "created_by", "created_at"]
    readonly_fields = fields


class LabelsForm(forms.Form):
    labels = forms.CharField(required=False, help_text="key=value pairs, separated by commas: team=payments, env=prod")

    def clean_labels(self):
        texts = [text.strip() for text in self.cleaned_data["labels"].split(",") if text.strip()]
        try:
            return parse_labels(texts)
        except ExecutionError as error:
            raise ValidationError(str(error)) from None


def manages_machines(user) -> bool:
    """Who keeps the machines or gives access to them sees every machine in the admin; anyone else only those
    they may reach (a machine they may not answers as a missing one here too)."""
    return user.is_superuser or user.has_perm("executions.change_machine") or user.has_perm("access.add_grant")


class AccessMachineAdmin(MachineAdmin):
    """The machine's page, with its grants, its labels and who can reach it (shown, not a formset: the page
    saves nothing, NothingEditableOnChange)."""

    def get_queryset(self, request):
        found = super().get_queryset(request)
        if manages_machines(request.user):
            return found
        return found.filter(pk__in=[machine.pk for machine in reach_of(request.user).machines(Do.SEE)])

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "labels", "grants", "access"] if obj is not None else fields

    @admin.display(description="grants on it")
    def grants(self, obj: Machine):
        found = Grant.objects.filter(machine=obj).select_related("user", "group")
        if not found:
            return "none on the machine itself (grants on its labels: who can reach it)"
        rows = format_html_join("", "<li>{} for {} (by {})</li>", ((g.role, g.subject, g.created_by) for g in found))
        return format_html("<ul>{}</ul>", rows)

    @admin.display(description="access")
    def access(self, obj: Machine):
        grant = reverse("admin:access_grant_add") + f"?machine={obj.pk}"
        return format_html(
            '<a href="{}">Who can reach this workspace</a> · <a href="{}">Grant access</a> · '
            '<a href="{}">Set labels</a>',
            reverse("admin:executions_machine_reach", args=[obj.pk]), grant,
            reverse("admin:executions_machine_labels", args=[obj.pk]),
        )  # fmt: skip

    def get_urls(self):
        mine = [
            path("<int:pk>/reach/", self.admin_site.admin_view(self.reach_view), name="executions_machine_reach"),
            path("<int:pk>/labels/", self.admin_site.admin_view(self.labels_view), name="executions_machine_labels"),
        ]
        return mine + super().get_urls()

    def reach_view(self, request, pk: int):
        if not (self.has_view_permission(request) and request.user.has_perm("access.view_grant")):
            raise PermissionDenied
        machine = get_object_or_404(self.get_queryset(request), pk=pk)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Who can reach {machine.name}",
            "machine": machine,
            "labels": said(machine.labels or {}),
            "reached": who_can_reach(machine),
            "history": grant_history(machine),
            "opts": self.opts,
        }
        return TemplateResponse(request, "admin/access/reach.html", context)

    def labels_view(self, request, pk: int):
        # A label can carry grants: changing one gives or takes access, so it is a grant-maker's to do.
        if not (self.has_change_permission(request) and request.user.has_perm("access.add_grant")):
            raise PermissionDenied
        machine = get_object_or_404(self.get_queryset(request), pk=pk)
        current = ", ".join(f"{key}={value}" for key, value in sorted((machine.labels or {}).items()))
        form = LabelsForm(request.POST or None, initial={"labels": current})
        if request.method == "POST" and form.is_valid():
            changed = set_labels(machine, form.cleaned_data["labels"], actor=Actor.for_user(request.user))
            self.message_user(request, f"labels of {machine.name}: {said(machine.labels)}" if changed else "unchanged")
            return redirect("admin:executions_machine_change", machine.pk)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Labels of {machine.name}",
            "machine": machine,
            "form": form,
            "opts": self.opts,
        }
        return TemplateResponse(request, "admin/access/labels.html", context)


admin.site.unregister(Machine)
admin.site.register(Machine, AccessMachineAdmin)


class AccessGroupAdmin(GroupAdmin):
    inlines = [GrantToGroupInline]


admin.site.unregister(Group)
admin.site.register(Group, AccessGroupAdmin)
