"""Tether's own processes for the tests, forked from one that has already imported what they import.

A test stack's daphne or worker spends about 1 s of CPU importing Django, Twisted, psycopg, the docker SDK
and the rest before it runs a line of Tether, and a run starts almost 400 of them on two cores. This module
starts, once per test process, a *launcher*: a Python that imports those libraries (never Tether's own
modules, never Django's settings, never a reactor or an event loop, never a thread) and then forks, for each
process a test asks for, a child that takes the test's arguments, environment, working directory and
standard streams and runs ``python -m module`` or ``python script`` as a new interpreter would: the same code,
in a process of its own, started in a fraction of the time.

``launch(argv, ...)`` returns a ``Launched`` with the part of ``subprocess.Popen`` the tests use (``pid``,
``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``, ``returncode``). Its signals go through a
pidfd, so a process that has ended is never confused with a later one of the same number. The launcher
reaps its children and says how each ended. ``TETHER_TEST_FORK=0`` starts every process with ``Popen``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Imported once by the launcher: each imports without Django's settings and without making a loop, a
# reactor or a thread (checked as the launcher starts).
PRELOAD = (
    "django.db.models",
    "django.http",
    "django.core.management",
    "django.core.handlers.asgi",
    "django.template",
    "django.forms",
    "django.views",
    "psycopg",
    "docker",
    "pydantic",
    "autobahn.twisted.websocket",
    "twisted.internet.protocol",
    "twisted.web.http",
    "channels",
    "channels_redis.core",
    "redis",
    "asgiref.sync",
    "prometheus_client",
    "django_htmx",
    "whitenoise",
    "mozilla_django_oidc",
    "starlette",
    "httpx",
    "mcp",
)

MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    return os.environ.get("TETHER_TEST_FORK", "1") != "0"


# --- the launcher's side ---------------------------------------------------------------------------------


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # not installed or wants settings: the child imports it itself
            continue
    from django.conf import settings

    assert not settings.configured, "a preloaded module configured Django's settings"
    assert "twisted.internet.reactor" not in sys.modules, "a preloaded module installed a reactor"
    assert threading.active_count() == 1, "a preloaded module started a thread"


def _child(fds: list[int], request: dict, interrupt) -> None:
    """In the forked child: become the process asked for, then run it as ``python`` would."""
    import runpy

    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, interrupt)  # as a new Python: its own handler, or ignored where it was
    for target, fd in enumerate(fds):
        os.dup2(fd, target, inheritable=True)
    os.closerange(3, 65536)  # as Popen's close_fds: nothing of the launcher's stays open
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [str(ROOT / (argv[1].replace(".", "/") + ".py")), *argv[2:]]
            sys.path[0] = request["cwd"]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(request["cwd"], argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        code = exit.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    raise SystemExit(code)  # out of the launcher's frames: Python ends this process as it ends any


def serve(fd: int) -> None:
    """The launcher: preload, then a child per request until the test process goes."""
    # Python's own SIGINT handler, or ignored when this was started ignoring it (a background job): the children
    # get it. The launcher itself ignores it: a Ctrl-C of the run must not end it before the tests stop theirs.
    interrupt = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _preload()
    channel = socket.socket(fileno=fd)
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        readable, _, _ = select.select([channel, wake_read], [], [])
        if wake_read in readable:
            while True:
                try:
                    os.read(wake_read, 512)
                except BlockingIOError:
                    break
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                channel.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if channel in readable:
            message, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 3)
            if not message:
                return  # the test process is gone
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                channel.close()
                os.close(wake_read)
                os.close(wake_write)
                _child(fds, request, interrupt)
            for passed in fds:
                os.close(passed)
            pidfd = os.pidfd_open(pid)
            socket.send_fds(channel, [json.dumps({"pid": pid, "id": request["id"]}).encode()], [pidfd])
            os.close(pidfd)


# --- the test process's side -----------------------------------------------------------------------------


class Launched:
    """A process the launcher forked: what the tests use of ``subprocess.Popen``."""

    def __init__(self, args: list[str], pid: int, pidfd: int):
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def _orphaned(self) -> None:
        """The launcher is gone (it reaped this process, and now nobody will): ended once its pidfd says so, with
        -1 for a status nobody can tell any more."""

        def watch() -> None:
            select.select([self._pidfd], [], [])
            if not self._ended.is_set():
                self._end(-1)

        threading.Thread(target=watch, name=f"orphan-{self.pid}", daemon=True).start()

    def __del__(self):
        os.close(self._pidfd)  # only now: a number closed earlier could name another process's pidfd

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self._ended.is_set():
            return
        try:
            signal.pidfd_send_signal(self._pidfd, number)
        except (ProcessLookupError, OSError):  # ended (a zombie or reaped): as Popen, nothing to signal
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"from tests.launcher import serve; serve({theirs.fileno()})"],
            cwd=ROOT,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.channel = ours
        self.lock = threading.Lock()  # one request at a time
        self.started: dict[int, Launched] = {}
        self.early: dict[int, int] = {}  # ends reported before their launch's answer was read
        self.answers: dict[int, tuple[dict, list[int]]] = {}  # by request
        self.asked = 0
        self.gone = False
        self.answered = threading.Condition()
        threading.Thread(target=self._read, name="launcher", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.channel, MAX_MESSAGE, 1)
            except OSError:
                message = b""
            if not message:
                with self.answered:
                    self.gone = True
                    for orphan in self.started.values():
                        orphan._orphaned()
                    self.started.clear()
                    self.answered.notify_all()
                return
            for fd in fds:
                os.set_inheritable(fd, False)  # (received descriptors are) not for this process's children
            answer = json.loads(message)
            with self.answered:
                if "exit" in answer:
                    if (launched := self.started.pop(answer["exit"], None)) is not None:
                        launched._end(answer["code"])
                    else:
                        self.early[answer["exit"]] = answer["code"]
                else:
                    self.answers[answer["id"]] = (answer, fds)
                    self.answered.notify_all()

    def launch(self, argv: list[str], cwd: Path, env: dict[str, str], stdout, stderr) -> Launched:
        out = _fd(stdout, 1)
        streams = [(0, False), out, (out[0], False) if stderr == subprocess.STDOUT else _fd(stderr, 2)]
        if argv[0] == sys.executable:
            argv = argv[1:]
        with self.lock:
            self.asked += 1
            request = {"id": self.asked, "argv": [str(part) for part in argv], "cwd": str(cwd), "env": dict(env)}
            try:
                socket.send_fds(self.channel, [json.dumps(request).encode()], [fd for fd, _ in streams])
            finally:
                for fd, opened in streams:
                    if opened:
                        os.close(fd)
            with self.answered:
                # Matched by number: an answer an interrupted launch left is never taken for this one's.
                self.answered.wait_for(lambda: self.asked in self.answers or self.gone)
                if self.asked not in self.answers:
                    raise RuntimeError("the test launcher ended")
                answer, fds = self.answers.pop(self.asked)
                launched = Launched([sys.executable, *argv], answer["pid"], fds[0])
                if (code := self.early.pop(launched.pid, None)) is not None:
                    launched._end(code)
                else:
                    self.started[launched.pid] = launched
        return launched


def _fd(stream, default: int) -> tuple[int, bool]:
    """A descriptor for one of the child's standard streams (and whether it was opened here to pass)."""
    if stream is None:
        return default, False
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), True
    return stream.fileno(), False


_launcher: Launcher | None = None
_launcher_lock = threading.Lock()


def launch(argv: list[str], *, cwd: Path, env: dict[str, str], stdout=None, stderr=None):
    """Start ``argv`` (``sys.executable`` then ``-m module`` or a script) forked from the launcher; with
    ``TETHER_TEST_FORK=0``, with ``subprocess.Popen``."""
    global _launcher
    if not enabled():
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    with _launcher_lock:
        if _launcher is None or _launcher.process.poll() is not None:
            _launcher = Launcher()
    return _launcher.launch(argv, cwd, env, stdout, stderr)
