"""Shared personas and fixtures. Services are real: a missing one fails the run loudly."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from asgiref.sync import SyncToAsync
from django.db import connection, connections

from access.policy import Do, may
from executions.actions import Actor, add_machine
from terminals import actions as terminal_actions
from terminals.backends.tmux_server import TmuxServer
from tests import run_secrets
from tests.bridge.harness import RECORDINGS_DIR, TEST_IMAGE, Stack, own_directory, session_cookie, start_container
from tests.factories import grant

# Session holders of test shells keep their sockets here, apart from a real install's (workers started by the
# tests inherit it).
HELD_DIR = own_directory("TETHER_HOLDER_DIR", f"/tmp/tether-test-held-{os.getuid()}")


RUN_LOCK = f"/tmp/tether-test-run-{os.getuid()}.lock"


@pytest.fixture(autouse=True, scope="session")
def _a_run_is_going_on():
    """A shared lock for as long as this test process runs: scripts/clean-test-leftovers.sh (which `make bench`
    and `make test` run) cleans nothing while any test process holds it."""
    with open(RUN_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


@pytest.fixture(autouse=True, scope="session")
def _no_holder_outlives_the_run(_a_run_is_going_on):
    """A held test shell whose exit was read but never released (a test is not a worker) lingers with its
    holder: at the end of the run, every holder under the tests' directory goes, and the directory too."""
    yield
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"serve\0{HELD_DIR}/".encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue
    shutil.rmtree(HELD_DIR, ignore_errors=True)
    shutil.rmtree(RECORDINGS_DIR, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _this_process_logs_with_the_servers():
    """This test process's log records go where the servers' logs go (tests/run_secrets.py searches them all),
    through the same filters (the redaction) and format as its console handler."""
    import logging

    console = next((h for h in logging.getLogger().handlers if h.get_name() == "console"), None)
    assert console is not None, "Django's LOGGING names a 'console' handler on the root logger"
    run_secrets.LOGS.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    copy = logging.FileHandler(run_secrets.LOGS / f"pytest-{worker}-{os.getpid()}.log")
    copy.setFormatter(console.formatter)
    for kept in console.filters:
        copy.addFilter(kept)
    logging.getLogger().addHandler(copy)
    yield
    logging.getLogger().removeHandler(copy)
    copy.close()


def pytest_collection_modifyitems(config, items):
    """Tests marked after_run search what a whole run left: they run only when asked for (`-m after_run`, as
    `make test` does after everything else), never in the middle of a run."""
    if "after_run" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if not item.get_closest_marker("after_run")]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("after_run")])
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a test's rows go (rolled back or flushed by its database fixture's teardown), the secrets they
    hold are remembered for the search of the run's logs (tests/run_secrets.py)."""
    if item.get_closest_marker("django_db") or "_django_db_helper" in getattr(item, "fixturenames", ()):
        from django.db import DatabaseError

        try:
            run_secrets.remember_from_the_database()
        except DatabaseError:  # a test that left its transaction broken: nothing more it could have logged
            pass
    return (yield)


@pytest.fixture(autouse=True)
def _held_test_shells(settings):
    settings.TETHER_HOLDER_DIR = HELD_DIR


@pytest.fixture(autouse=True)
def _test_recordings(settings):
    """Recordings go where the test servers put theirs (tests/bridge/harness.py), apart from a real install's."""
    recordings = {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": RECORDINGS_DIR}}
    settings.STORAGES = {**settings.STORAGES, "recordings": recordings}


@pytest.fixture(autouse=True, scope="session")
def _require_postgres(django_db_setup, django_db_blocker):
    """The suite's guarantees (row locks, triggers, races) are PostgreSQL's; never pass quietly on SQLite."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.exit("tests must run against PostgreSQL: set DATABASE_URL (make test does)", returncode=1)
    yield
    # The test database is dropped next: this process's pooled connections go (the pool keeps them open
    # after use), and the last servers' are given a moment to end (PostgreSQL ends a backend a little after
    # its process exits); a connection left makes the drop fail with a warning and leaves the database.
    with django_db_blocker.unblock():
        # Async tests reach the database from asgiref's one shared thread, whose connection stays checked out.
        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)
        connection.close_pool()
        # Asked on a connection of its own: one from the pool would open the pool again, whose other
        # connection would be counted (ten seconds lost at the end of every test process).
        params = {k: v for k, v in connection.get_connection_params().items() if k not in ("cursor_factory", "context")}
        with psycopg.connect(**params, autocommit=True) as own:
            for _ in range(100):
                others = own.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()[0]
                if not others:
                    break
                time.sleep(0.1)


@pytest.fixture(autouse=True)
def _plain_test_shell(settings):
    """Shells in tests skip the machine's rc files: a login shell here runs `pyenv rehash`, whose lock a
    killed shell can leave behind, stalling every later shell for a minute."""
    settings.TETHER_SHELL = ["/bin/bash", "--noprofile", "--norc"]


def _make_user(django_user_model, username: str, **extra):
    return django_user_model.objects.create_user(username=username, password=f"{username}-password", **extra)


@pytest.fixture
def alice(django_user_model):
    return _make_user(django_user_model, "alice")


@pytest.fixture
def bob(django_user_model):
    return _make_user(django_user_model, "bob")


@pytest.fixture
def operator(django_user_model):
    """Staff with every executions permission, but not a superuser."""
    from django.contrib.auth.models import Permission

    user = _make_user(django_user_model, "operator", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label__in=["executions", "terminals", "recordings", "access"])
    )
    return user


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser(username="admin", password="admin-password", email="")


@pytest.fixture
def dead_worker():
    """A registered worker whose process has exited: its pid and start time name nothing any more."""
    from django.conf import settings

    from terminals.backends.procfs import ProcessIdentity, boot_id

    child = subprocess.Popen(["true"])
    identity = ProcessIdentity.of(child.pid)
    child.wait()
    return terminal_actions.register_worker(
        worker_id=uuid.uuid4().hex,
        host=settings.TETHER_HOST,
        pid=identity.pid,
        started_at=identity.start_time,
        boot_id=boot_id(),
        channel_name="",
    )


@pytest.fixture
def tmux_socket():
    name = f"tether-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)
    TmuxServer(name).turn_path().unlink(missing_ok=True)


@pytest.fixture
def container():
    """A throwaway container from the locally built image, without a network."""
    name, error = start_container()
    if name is None:
        pytest.fail(f"dockerd or {TEST_IMAGE} is not available (make services builds it): {error}")
    yield name
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)


@pytest.fixture
def stack():
    stack = Stack()
    try:
        yield stack.start()
    finally:
        stack.stop()


@pytest.fixture
def place(request, tmux_socket):
    """Machine factory: a local, tmux (own socket) or docker (own container) machine."""

    def make(backend: str, name: str | None = None):
        ref = ""
        if backend == "tmux":
            ref = tmux_socket
        elif backend == "docker":
            ref = request.getfixturevalue("container")
        return add_machine(
            name=name or f"{backend}-box", backend=backend, ref=ref, scope="team-a", actor=Actor.command("tests")
        )

    return make


@pytest.fixture
def terminal(place):
    """Open a terminal session on a new machine for ``user``; returns (session, cookie)."""

    def make(user, backend: str = "local"):
        machine = place(backend)
        if not may(user, Do.USE, machine):  # its user's team uses it (staff with the permission need no grant)
            grant(user, machine, "use")
        session, _ = terminal_actions.open_terminal(machine, user)
        return session, session_cookie(user)

    return make
