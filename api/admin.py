"""API tokens in the admin: whose, which scopes, when last used, every call made with them; revoked here at
once (confirmation, a reason, the permission to revoke another user's token). Only their users make them."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from api.models import ApiCall, ApiToken
from api.tokens import revoke_token
from executions.admin import badge
from terminals.admin_common import WrittenElsewhere, confirmed_action

revoke_tokens = confirmed_action(
    "revoke_tokens",
    "Revoke",
    lambda token, actor, reason: revoke_token(token.pk, by=actor.user, reason=reason),
    permission="revoke",
    noun="API tokens",
    label="Revoke the selected API tokens…",
    title="Revoke these API tokens?",
)


@admin.register(ApiToken)
class ApiTokenAdmin(WrittenElsewhere, admin.ModelAdmin):
    list_display = ["name", "user", "scope_list", "state", "created_at", "expires_at", "last_used_at", "calls"]
    list_filter = ["revoked_at", "expires_at"]
    search_fields = ["name", "user__username", "prefix"]
    list_select_related = ["user", "revoked_by"]
    exclude = ["digest"]
    readonly_fields = [f.name for f in ApiToken._meta.fields if f.name != "digest"]
    actions = [revoke_tokens]

    @admin.display(description="scopes")
    def scope_list(self, obj):
        return ", ".join(obj.scopes)

    @admin.display(description="state")
    def state(self, obj):
        ended = obj.ended
        return badge(ended or "active", "#6b7280" if ended else "#16a34a", ended or "usable")

    @admin.display(description="calls")
    def calls(self, obj):
        url = reverse("admin:api_apicall_changelist") + f"?token__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj.calls.count())

    def has_revoke_permission(self, request):
        return request.user.has_perm("api.revoke_apitoken")


@admin.register(ApiCall)
class ApiCallAdmin(WrittenElsewhere, admin.ModelAdmin):
    """The API's audit trail: one line a call made with a known token."""

    list_display = ["at", "token", "method", "path", "status", "problem", "milliseconds"]
    list_filter = ["status", "method", "token"]
    search_fields = ["path", "token__name", "token__user__username"]
    list_select_related = ["token__user"]
    readonly_fields = [f.name for f in ApiCall._meta.fields]
