"""Who is told they may have lost access (access.signals.access_changed, on which every socket and share link of
theirs is checked again at once): each change that takes access away, and no other."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from access.signals import access_changed

pytestmark = pytest.mark.django_db


@pytest.fixture
def told(django_capture_on_commit_callbacks):
    said: list[set[int] | None] = []

    def listener(sender, users, **kwargs):
        said.append(None if users is None else set(users))

    access_changed.connect(listener)

    def run(change) -> list[set[int] | None]:
        said.clear()
        with django_capture_on_commit_callbacks(execute=True):
            change()
        return list(said)

    yield run
    access_changed.disconnect(listener)


@pytest.fixture
def every():
    return Permission.objects.get(codename="use_every_workspace", content_type__app_label="access")


def test_a_permission_taken_from_a_person_or_a_group_tells_who_had_it(told, alice, bob, every):
    team = Group.objects.create(name="ops")
    team.user_set.add(alice, bob)
    alice.user_permissions.add(every)
    team.permissions.add(every)
    assert told(lambda: alice.user_permissions.remove(every)) == [{alice.pk}]
    bob.user_permissions.add(every)
    assert told(lambda: every.user_set.remove(bob)) == [{bob.pk}]  # the other way round
    assert told(lambda: team.permissions.remove(every)) == [{alice.pk, bob.pk}]
    team.permissions.add(every)
    assert told(lambda: every.group_set.clear()) == [{alice.pk, bob.pk}]
    alice.user_permissions.add(every)
    assert told(lambda: alice.user_permissions.clear()) == [{alice.pk}]
    assert told(lambda: alice.user_permissions.add(every)) == []  # more access takes nothing away


def test_no_longer_staff_or_superuser_tells_them_and_a_sign_in_tells_no_one(told, alice):
    alice.is_staff = alice.is_superuser = True
    alice.save()

    def save(**fields):
        def change():
            hers = type(alice).objects.get(pk=alice.pk)
            for name, value in fields.items():
                setattr(hers, name, value)
            hers.save(update_fields=list(fields) or None)

        return change

    assert told(save(is_superuser=False)) == [{alice.pk}]
    assert told(save(first_name="Alice")) == []
    assert told(save(last_login=None)) == []  # a sign-in saves last_login alone
    assert told(save(is_staff=False)) == [{alice.pk}]
    assert told(save(is_staff=True)) == []
