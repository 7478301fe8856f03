"""Recordings and share links moved from the terminals app to an app of their own: a database made before the
move upgrades with its rows, tables and permissions as they were, and one made after it goes back too."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from executions.models import Backend
from recordings import actions as recording_actions
from recordings.models import Recording
from terminals import actions
from tests.factories import grant, make_machine
from tests.terminals.test_views import logged_in

BEFORE = [("terminals", "0018_worker_backends"), ("recordings", None)]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state([t for t in targets if t[1]]).apps


@pytest.mark.django_db(transaction=True)
def test_a_database_from_before_the_move_keeps_its_recordings_links_and_permissions(alice, django_user_model):
    machine = make_machine("moved-box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    recording = Recording.objects.create(
        session=session, execution=session.execution, generation=1, started_at=session.created_at,
        started_epoch=1_000.0, cols=80, rows=24,
    )  # fmt: skip
    link, token = recording_actions.create_share_link(alice, session)  # the live shell's
    staff = django_user_model.objects.create_user("revoker", is_staff=True)
    staff.user_permissions.add(
        Permission.objects.get(codename="revoke_sharelink"), Permission.objects.get(codename="view_sharelink")
    )
    grant(staff, machine, "watch")  # the links of shells they may watch are in their admin
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()

    before = migrate(BEFORE)  # the schema and state of the release before the move
    old_link = before.get_model("terminals", "ShareLink").objects.get(pk=link.pk)
    assert old_link.session_id == session.pk and old_link.token_hash == link.token_hash
    assert before.get_model("terminals", "Recording").objects.filter(pk=recording.pk).exists()
    revoke = Permission.objects.select_related("content_type").get(codename="revoke_sharelink")
    assert revoke.content_type.app_label == "terminals"  # where the older release looks for it

    migrate(latest)
    revoker = django_user_model.objects.get(pk=staff.pk)  # no permission cache from before
    assert revoker.has_perm("recordings.revoke_sharelink") and not revoker.has_perm("terminals.revoke_sharelink")
    assert recording_actions.valid_share_link(token).pk == link.pk
    assert Recording.objects.get(pk=recording.pk).session.share_links.get().pk == link.pk
    page = logged_in(revoker).get("/admin/recordings/sharelink/")
    assert page.status_code == 200 and b"revoke_links" in page.content  # the admin offers what it offered
    assert recording_actions.revoke_share_link(link.pk, revoker).revoked_at is not None  # the permission works


@pytest.mark.django_db(transaction=True)
def test_grants_follow_when_the_new_apps_permissions_were_made_first(django_user_model):
    """``migrate recordings 0001`` run by itself makes the new app's content types and permissions at its end,
    beside the old ones: the step that moves them then gives each grant on the new permission."""
    from django.contrib.auth.models import Group
    from django.contrib.contenttypes.models import ContentType

    staff = django_user_model.objects.create_user("early-revoker", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="revoke_sharelink"))
    auditors = Group.objects.create(name="auditors")
    auditors.permissions.add(Permission.objects.get(codename="view_recording"))
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()

    migrate(BEFORE)  # the grants are on the terminals app's permissions again
    ContentType.objects.clear_cache()
    for model, codenames in (("sharelink", ["revoke_sharelink", "view_sharelink"]), ("recording", ["view_recording"])):
        made = ContentType.objects.create(app_label="recordings", model=model)  # as post_migrate would make them
        for codename in codenames:
            Permission.objects.create(content_type=made, codename=codename, name=codename)
    assert Permission.objects.filter(codename="revoke_sharelink").count() == 2

    migrate(latest)
    ContentType.objects.clear_cache()
    staff = django_user_model.objects.get(pk=staff.pk)
    assert staff.has_perm("recordings.revoke_sharelink")
    assert Permission.objects.filter(codename="revoke_sharelink").count() == 1
    assert not ContentType.objects.filter(app_label="terminals", model__in=["sharelink", "recording"]).exists()
    assert set(auditors.permissions.values_list("content_type__app_label", "codename")) == {
        ("recordings", "view_recording")
    }
