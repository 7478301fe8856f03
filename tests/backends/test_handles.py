"""A lease's handle across releases (a rolling upgrade runs workers of two releases on one database).

``handles_before_typed.json`` holds the handles the release before typed handles (48056b3) wrote: the started
ones captured by spawning with that release's code on each backend (the secrets zeroed; what it did before a
start is in its owner's launch, written as it wrote it). This release reads each of them typed and writes it
back unchanged; what it writes itself has every key, of the same JSON type, that the releases before it read
by name; and a key a later release adds survives this one writing the handle back (a re-tag, an adoption)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

from terminals import actions, recovery
from terminals.backends import handles
from terminals.backends.base import SpawnSpec, Status
from terminals.backends.handles import (
    CLAIMED,
    Claimed,
    DockerHandle,
    Launch,
    LocalHandle,
    TmuxHandle,
    Unreadable,
    load,
)
from terminals.models import ProcessLease
from tests.backends.conftest import make_tags

EARLIER = json.loads((Path(__file__).parent / "handles_before_typed.json").read_text())
TYPES = {"local": LocalHandle, "docker": DockerHandle, "tmux": TmuxHandle, None: Claimed}
# The fixture's name for what each backend of the contract tests writes.
WRITTEN_AS = {"local-plain": "local", "local": "local_held", "docker-plain": "docker", "docker": "docker_held"}


# Keys this release adds (an earlier release keeps them, as a later one's: test below); each is read as absent
# = what the earlier release did.
ADDED = {("holder", "screens")}


def without(shaped: dict, added: set[tuple[str, ...]]) -> dict:
    """``shaped`` less the ``added`` key paths."""
    out = dict(shaped)
    for path in added:
        if len(path) == 1:
            out.pop(path[0], None)
        elif isinstance(out.get(path[0]), dict):
            out[path[0]] = without(out[path[0]], {path[1:]})
    return out


def shape(value):
    """The keys, and the JSON type of each value: what a reader that reads by key relies on."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return type(value).__name__


@pytest.mark.parametrize("name", sorted(EARLIER))
def test_a_handle_an_earlier_release_wrote_is_read_typed_and_written_back_unchanged(name):
    written = EARLIER[name]
    handle = load(written)
    assert type(handle) is TYPES[written.get("backend")]
    assert handle.dump() == written and handle.extra == {}
    assert handle.started == ("launch" not in written)
    assert load(json.loads(json.dumps(handle.dump()))) == handle


def test_what_an_earlier_release_wrote_reads_as_what_it_meant():
    held = load(EARLIER["local_held"])
    assert held.holder.process.pid == EARLIER["local_held"]["holder"]["process"]["pid"] and held.holder.subreaper
    assert held.held and held.ends_with_worker() == ""
    plain = load(EARLIER["docker"])
    assert (plain.engine, plain.holder, plain.held) == ("", None, False)  # "": the default engine
    assert "no session holder" in plain.ends_with_worker()
    starting = load(EARLIER["docker_held_starting"])
    assert starting.launch == Launch.STARTING and starting.holder.pid is None and starting.ends_with_worker() == ""
    assert load(EARLIER["claimed"]) == CLAIMED and load(EARLIER["tmux"]).ends_with_worker() == ""
    assert load({}) is None and load(None) is None


async def test_what_this_release_writes_has_each_key_an_earlier_release_reads(backend_name, make_backend):
    backend = make_backend()
    kept = []

    async def before_start(handle):  # as the owner's launch keeps it (docker: between create and start)
        kept.append(handles.starting(handle).dump())

    instance = await backend.instance(ensure=True)
    process = await backend.spawn(SpawnSpec(argv=("sleep", "60")), make_tags(), before_start, instance)
    try:
        name = WRITTEN_AS.get(backend_name, backend_name)
        assert without(shape(process.handle.dump()), ADDED) == shape(EARLIER[name])
        if backend_name in ("local", "docker"):  # held: its holder keeps a screen for the next owner
            assert process.handle.dump()["holder"]["screens"] is True
        if backend_name.startswith("docker"):
            assert len(kept) == 1 and without(shape(kept[0]), ADDED) == shape(EARLIER[f"{name}_starting"])
        intent = handles.intent(backend.name, instance=instance, marker="m" * 24, session="s")
        assert shape(intent.dump()) == shape(EARLIER[f"{backend.name}_spawning"])
        # Through JSON, as another worker reads it from the lease: the same handle, and the same process.
        again = load(json.loads(json.dumps(process.handle.dump())))
        assert again == process.handle
        assert (await make_backend().inspect(again)).status == Status.ALIVE
    finally:
        await process.terminate(grace=0.2)
        await process.release()
    assert CLAIMED.dump() == EARLIER["claimed"]


def test_keys_a_later_release_adds_are_kept_when_this_one_writes_the_handle_back():
    later = EARLIER["docker_held"] | {"cgroup": "/system.slice/x"}
    later["holder"] = later["holder"] | {"protocol": 3}
    handle = load(later)
    assert handle.extra == {"cgroup": "/system.slice/x"} and handle.holder.extra == {"protocol": 3}
    retagged = replace(handle, owner_pid=1, owner_started_at=2)  # what an adopting worker writes back
    assert retagged.dump() == later | {"owner_pid": 1, "owner_started_at": 2}


def test_a_handle_this_release_cannot_read_is_kept_as_it_came_and_says_why():
    later = {"backend": "ssh", "host": "h", "marker": "m"}
    unreadable = load(later)
    assert isinstance(unreadable, Unreadable) and unreadable.dump() == later and "'ssh'" in unreadable.why
    assert not unreadable.held and unreadable.ends_with_worker() == ""
    backendless = {"process": {"pid": 1, "start_time": 1, "boot_id": "b"}, "marker": "m"}
    assert isinstance(load(backendless), Unreadable) and load(backendless).dump() == backendless
    # A launch step or a process of a later shape: every query that reads a lease reads its handle, so reading
    # never fails; the launch is not taken for a started process, the marker is still its.
    stepped = EARLIER["docker_starting"] | {"launch": "placed"}
    unreadable = load(stepped)
    assert isinstance(unreadable, Unreadable) and unreadable.dump() == stepped and not unreadable.started
    assert unreadable.marker == stepped["marker"] and "docker handle in a form" in unreadable.why
    reshaped = EARLIER["local"] | {"process": {"pid": 1, "started": "later"}}
    assert isinstance(load(reshaped), Unreadable) and load(reshaped).dump() == reshaped


@pytest.mark.django_db(transaction=True)
def test_a_lease_keeps_the_handle_as_the_same_json_and_reads_it_typed():
    from django.conf import settings

    from executions import actions as exec_actions
    from tests.factories import TEST_ACTOR, make_machine, make_spec

    owner = actions.register_worker(
        worker_id="w-handles", host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name="c-handles"
    )
    machine = make_machine("handle-box")
    exec_actions.submit_execution(
        scope="team-a", execution_id="handle-1", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
    )
    execution, lease = actions.claim_next_execution(owner, {"local"})
    assert lease.handle == CLAIMED
    stored = ProcessLease.objects.filter(pk=lease.pk).values_list("handle", flat=True)
    assert stored.get() == {"launch": "claimed"}
    # No handle is {} (the column is NOT NULL), however it is written.
    ProcessLease.objects.filter(pk=lease.pk).update(handle=None)
    assert stored.get() == {} and ProcessLease.objects.get(pk=lease.pk).handle is None
    lease.handle = CLAIMED
    lease.save()
    lease.handle = None
    lease.save()
    assert stored.get() == {} and lease.ends_with_worker == ""
    later = EARLIER["local_held"] | {"cgroup": "/x"}
    actions.save_handle(execution.pk, owner, lease.token, load(later))
    assert ProcessLease.objects.filter(pk=lease.pk).values_list("handle", flat=True).get() == later
    lease.refresh_from_db()
    assert lease.handle == load(later) and lease.handle.holder.dir == later["holder"]["dir"]
    assert lease.ends_with_worker == ""
    # A later release's handle: kept as it came, and recovery leaves it to a worker that can look at it.
    later = {"backend": "ssh", "host": "h", "marker": "m"}
    actions.save_handle(execution.pk, owner, lease.token, load(later))
    assert ProcessLease.objects.filter(pk=lease.pk).values_list("handle", flat=True).get() == later
    lease = ProcessLease.objects.select_related("execution__machine", "worker").get(pk=lease.pk)
    finding = async_to_sync(recovery.judge_lease)(lease, "its owner is gone", can_adopt=True, can_watch=True)
    assert finding.action == recovery.Action.WAIT and "'ssh'" in finding.detail
