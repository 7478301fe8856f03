"""A recording being made: its chunks are files in the recordings storage, each named by a row its owner writes
fenced by the lease. A chunk is named once, a file nothing names is removed, a chunk the storage lost is a marker
in the finished file (the rest is kept), and chunks written into the database by an earlier version still make
their file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from executions import actions as exec_actions
from executions.models import Backend, Evidence, State
from recordings import actions as recording_actions
from recordings import store
from recordings.actions.recordings import ChunksNotHere
from recordings.asciicast import EventLog, output_of
from recordings.models import Recording, RecordingChunk
from terminals import actions
from tests.factories import TEST_ACTOR, grant, make_machine

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_recordings_storage(settings, tmp_path):
    """A storage of this test's own: an earlier test in the same process may have left chunk files under a
    recording number this test's recording has too (they counted here once: 5 files where 4 were made)."""
    recordings = {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}}
    settings.STORAGES = {**settings.STORAGES, "recordings": recordings}


def stored() -> Path:
    """Where this test's recordings storage keeps its files."""
    return Path(settings.STORAGES["recordings"]["OPTIONS"]["location"])


def chunk_files(recording: Recording) -> list[str]:
    directory = stored() / store.CHUNKS / str(recording.pk)
    return sorted(path.name for path in directory.iterdir()) if directory.exists() else []


def ended(recording: Recording) -> None:
    """The shell exited (code 0), as its owner settles it."""
    execution = exec_actions.transition(
        recording.execution, State.RUNNING, evidence=Evidence.OBSERVED, actor=TEST_ACTOR
    )
    exec_actions.transition(execution, State.COMPLETED, evidence=Evidence.EXITED, exit_code=0, actor=TEST_ACTOR)


def taken(text: bytes, at: float, started: float = 1_000.0):
    log = EventLog(started=started, limit=1 << 20)
    log.output(0, 0, text, at)
    return log.take()


@pytest.fixture
def owned(alice):
    return begun(alice)


def begun(alice):
    """Alice's shell on a docker workspace, claimed by a worker, with its recording begun: (recording, worker,
    lease token)."""
    machine = make_machine("chunk-box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    owner = actions.register_worker(
        worker_id="w-chunks", host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name="c-chunks"
    )
    execution, lease = actions.claim_next_execution(owner, {"docker"})
    assert execution.pk == session.execution_id
    recording = recording_actions.begin_recording(
        execution_pk=execution.pk, worker=owner, token=lease.token, cols=80, rows=24, started=1_000.0, stream=0
    )
    return recording, owner, lease.token


def write(owned, number: int, events, file: str, data: bytes | None = None) -> bool:
    recording, owner, token = owned
    return recording_actions.write_chunk(
        recording.pk, worker=owner, token=token, execution_pk=recording.execution_id, number=number, taken=events,
        file=file, data=data,
    )  # fmt: skip


def test_a_chunk_is_a_file_named_once_and_the_finished_recording_leaves_no_chunk_behind(owned):
    recording = owned[0]
    first = taken(b"first\r\n", 1_001.0)
    name = store.save_chunk(recording.pk, 0, first.lines)
    assert write(owned, 0, first, name)
    again = store.save_chunk(recording.pk, 0, first.lines)  # a repeated write of the same number
    assert not write(owned, 0, first, again)
    assert list(RecordingChunk.objects.filter(recording=recording).values_list("number", "file", "data")) == [
        (0, name, None)
    ]  # the events are not in the database (NULL: an older release fails on it, never drops it)
    assert write(owned, 0, first, name)  # the same write again (its answer was lost): named, once
    assert RecordingChunk.objects.filter(recording=recording).count() == 1
    second = taken(b"second\r\n", 1_002.0)
    assert write(owned, 1, second, store.save_chunk(recording.pk, 1, second.lines))
    store.save_chunk(recording.pk, 2, b"never named")  # its writer died before naming it
    assert len(chunk_files(recording)) == 4

    ended(recording)
    assert recording_actions.finish_recording(recording.pk) is not None
    recording.refresh_from_db()
    lines = list(store.read(recording.file))
    assert output_of(lines) == b"first\r\nsecond\r\n"  # once each, in order
    assert not RecordingChunk.objects.filter(recording=recording).exists()
    # The files stay for a page still playing it live, until the cleanup: named or not, they all go then.
    assert len(chunk_files(recording)) == 4
    assert recording_actions.remove_leftover_chunks() == 4
    assert chunk_files(recording) == []


def test_a_chunk_is_not_named_by_a_worker_that_lost_its_lease(owned):
    recording, owner, token = owned
    events = taken(b"late\r\n", 1_001.0)
    with pytest.raises(actions.LeaseLost):
        recording_actions.write_chunk(
            recording.pk, worker=owner, token=token + 1, execution_pk=recording.execution_id, number=0, taken=events,
            file=store.save_chunk(recording.pk, 0, events.lines),
        )  # fmt: skip
    assert not RecordingChunk.objects.filter(recording=recording).exists()
    assert Recording.objects.get(pk=recording.pk).chunks == 0


def test_a_chunk_the_storage_lost_is_a_marker_where_it_was_and_the_rest_is_kept(owned):
    recording = owned[0]
    for number, text in enumerate([b"one\r\n", b"two\r\n", b"three\r\n"]):
        events = taken(text, 1_001.0 + number)
        assert write(owned, number, events, store.save_chunk(recording.pk, number, events.lines))
    lost = RecordingChunk.objects.get(recording=recording, number=1).file
    (stored() / lost).unlink()

    ended(recording)
    assert recording_actions.finish_recording(recording.pk) is not None
    recording.refresh_from_db()
    lines = list(store.read(recording.file))
    assert output_of(lines) == b"one\r\nthree\r\n"
    events = [json.loads(line) for line in lines[1:]]
    markers = [text for _, code, text in events if code == "m"]
    assert markers[0] == "part of this recording is missing here (chunk 1 was not found)"
    assert [code for _, code, _ in events][:3] == ["o", "m", "o"]  # where the lost chunk was


def test_chunks_an_earlier_version_wrote_into_the_database_still_make_the_file(owned):
    recording = owned[0]
    old = taken(b"kept in the row\r\n", 1_001.0)
    RecordingChunk.objects.create(recording=recording, number=0, data=old.lines)
    Recording.objects.filter(pk=recording.pk).update(chunks=1, output_end=old.end)
    new_events = EventLog(started=1_000.0, limit=1 << 20, end=old.end)
    new_events.output(0, old.end, b"and in a file\r\n", 1_002.0)
    new = new_events.take()
    assert write(owned, 1, new, store.save_chunk(recording.pk, 1, new.lines))

    ended(recording)
    assert recording_actions.finish_recording(recording.pk) is not None
    recording.refresh_from_db()
    assert output_of(store.read(recording.file)) == b"kept in the row\r\nand in a file\r\n"


def test_chunk_files_of_recordings_no_longer_being_made_are_removed_by_the_cleanup(owned, alice):
    recording = owned[0]
    events = taken(b"live\r\n", 1_001.0)
    assert write(owned, 0, events, store.save_chunk(recording.pk, 0, events.lines))
    # A recording saved by a finisher that died after its commit, before it removed the chunks.
    other = make_machine("chunk-box-2", backend=Backend.DOCKER)
    grant(alice, other)
    other_session, _ = actions.open_terminal(other, alice)
    saved = Recording.objects.create(
        session=other_session, execution=other_session.execution, generation=1, started_at=timezone.now(),
        started_epoch=0.0, cols=80, rows=24, state="saved", file="x.cast.gz", finished_at=timezone.now(),
    )  # fmt: skip
    store.save_chunk(saved.pk, 0, b"left behind")
    store.save_chunk(saved.pk, 1, b"left behind too")

    assert recording_actions.remove_leftover_chunks() == 2
    assert chunk_files(saved) == []
    assert len(chunk_files(recording)) == 1  # still being made: kept
    assert recording_actions.remove_leftover_chunks() == 0


def test_a_chunk_the_storage_could_not_take_is_kept_in_its_row_and_still_makes_the_file(owned):
    recording = owned[0]
    first = taken(b"to the storage\r\n", 1_001.0)
    assert write(owned, 0, first, store.save_chunk(recording.pk, 0, first.lines))
    log = EventLog(started=1_000.0, limit=1 << 20, end=first.end)
    log.output(0, first.end, b"to the database\r\n", 1_002.0)
    second = log.take()
    assert write(owned, 1, second, "", data=second.lines)  # what the Recorder does when the storage fails

    ended(recording)
    assert recording_actions.finish_recording(recording.pk) is not None
    recording.refresh_from_db()
    assert output_of(store.read(recording.file)) == b"to the storage\r\nto the database\r\n"


def test_a_recording_whose_chunks_are_on_another_hosts_disk_is_not_finished_here(owned):
    """Recordings storage that is not shared: this host's finisher finds none of the chunk files. Made into a file
    here it would be markers and nothing else, for good; it is left for a finisher that has them."""
    recording = owned[0]
    events = taken(b"on host A\r\n", 1_001.0)
    assert write(owned, 0, events, store.save_chunk(recording.pk, 0, events.lines))
    moved = stored() / store.CHUNKS / f"{recording.pk}"
    elsewhere = moved.with_name(f"{recording.pk}-on-host-a")
    moved.rename(elsewhere)  # as this host sees the storage: no chunk of it

    ended(recording)
    with pytest.raises(ChunksNotHere, match="every host must share it"):
        recording_actions.finish_recording(recording.pk)
    assert Recording.objects.get(pk=recording.pk).state == "recording"
    assert RecordingChunk.objects.filter(recording=recording).count() == 1

    elsewhere.rename(moved)  # the host that has them
    assert recording_actions.finish_recording(recording.pk) is not None
    recording.refresh_from_db()
    assert output_of(store.read(recording.file)) == b"on host A\r\n"


@pytest.mark.django_db(transaction=True)
async def test_the_owner_keeps_a_chunk_in_the_database_while_the_storage_refuses_it(alice):
    """The recordings storage fails for real (its chunk directory's place is taken by a file): the owner's
    write still names the chunk, with its events in the row, and the recording loses nothing."""
    from types import SimpleNamespace

    from asgiref.sync import sync_to_async

    from recordings.recorder import Recorder, Take

    recording, owner, token = await sync_to_async(begun)(alice)
    Path(stored(), store.CHUNKS).mkdir(parents=True, exist_ok=True)
    blocker = Path(stored(), store.CHUNKS, str(recording.pk))
    blocker.write_text("not a directory")
    log = EventLog(started=1_000.0, limit=1 << 20)
    log.output(0, 0, b"printed while the storage was away\r\n", 1_001.0)
    take = Take(recording.pk, log, 0, False)
    live = SimpleNamespace(recording=take, token=token, execution_pk=recording.execution_id)
    await Recorder(SimpleNamespace(worker=owner)).flush(live)

    assert live.recording.chunks == 1 and live.recording.unconfirmed is None
    row = await RecordingChunk.objects.aget(recording=recording, number=0)
    assert row.file == "" and b"printed while the storage was away\r\n" in bytes(row.data)
    blocker.unlink()
    await sync_to_async(ended)(recording)
    assert await sync_to_async(recording_actions.finish_recording)(recording.pk) is not None
    await recording.arefresh_from_db()
    assert output_of(store.read(recording.file)) == b"printed while the storage was away\r\n"


def test_a_chunk_an_older_release_writes_during_an_upgrade_is_stored_and_kept(owned):
    """A rolling upgrade migrates first while older workers still run (docs/operations.md): their INSERT names
    no ``file`` column, and must neither fail (their chunks would be dropped) nor lose its events."""
    from django.db import connection

    recording = owned[0]
    old = taken(b"from the older worker\r\n", 1_001.0)
    with connection.cursor() as cursor:  # the older release's own statement (5a88427, _store_chunk)
        cursor.execute(
            "INSERT INTO terminals_recordingchunk (recording_id, number, data, written_at) VALUES (%s, 0, %s, now())",
            [recording.pk, old.lines],
        )
    Recording.objects.filter(pk=recording.pk).update(chunks=1, output_end=old.end)
    ended(recording)
    assert recording_actions.finish_recording(recording.pk) is not None
    recording.refresh_from_db()
    assert output_of(store.read(recording.file)) == b"from the older worker\r\n"


@pytest.mark.django_db(transaction=True)
async def test_a_write_cut_short_by_the_worker_stopping_is_written_by_its_last_flush(alice):
    """A worker stopping cancels its periodic writer, which may be inside a write: the events it had taken were
    lost with it, and the stopping worker's own last write found nothing left (a whole first part of a shell's
    recording went missing, with no marker, when a worker was stopped mid-stream). They are written by that last
    write now, once, in order."""
    import asyncio
    import contextlib
    from types import SimpleNamespace

    from asgiref.sync import sync_to_async

    from recordings.recorder import Recorder, Take

    recording, owner, token = await sync_to_async(begun)(alice)
    log = EventLog(started=1_000.0, limit=1 << 20)
    log.output(0, 0, b"printed before the worker was stopped\r\n", 1_001.0)
    take = Take(recording.pk, log, 0, False)
    live = SimpleNamespace(recording=take, token=token, execution_pk=recording.execution_id)
    recorder = Recorder(SimpleNamespace(worker=owner))
    for cut_after in (1, 3):  # cut at two points of its write
        periodic = asyncio.ensure_future(recorder.flush(live))
        for _ in range(cut_after):
            await asyncio.sleep(0)
        periodic.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await periodic
        log.output(0, log.end, f"and after cut {cut_after}\r\n".encode(), 1_002.0)
    await asyncio.sleep(0.5)  # the cut writes' threads have finished
    await recorder.flush(live)  # the stopping worker's own

    await sync_to_async(ended)(recording)
    assert await sync_to_async(recording_actions.finish_recording)(recording.pk) is not None
    await recording.arefresh_from_db()
    output = output_of(store.read(recording.file))
    assert output == b"printed before the worker was stopped\r\nand after cut 1\r\nand after cut 3\r\n", output
