"""Simulated hosts on one machine: each a UTS + PID namespace of its own (``unshare``), with its own hostname
and process table, running a daphne and a worker; Debian's HAProxy in front of the daphnes; one PostgreSQL,
one Redis, one dockerd (reached over TCP, as a network engine, so a docker session is any host's to adopt).
All traffic is on loopback: the hosts share the network, not their processes.

Killing a host kills its namespace's first process: the kernel then kills every process in it (daphne,
worker, its shells, its tmux servers), as a host that loses power. SIGSTOP on a host's worker is a host
that is only slow.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.bridge.harness import ROOT, Stack, free_port

DOCKER_SOCKET = "/var/run/docker.sock"


def _pipe(source: socket.socket, sink: socket.socket, done: threading.Barrier) -> None:
    """One direction of a connection. An end of input is passed on as such (a half close: docker's client
    closes its side after stdin and still reads the answer); both sockets close once both directions end."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:  # reset: the whole connection is over
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    try:
        done.wait(timeout=3600)
    except threading.BrokenBarrierError:
        pass
    source.close()


class DockerOverTcp:
    """The one dockerd, reached at ``tcp://127.0.0.1:PORT`` (a network engine: machines on it live on no host)."""

    def __init__(self):
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX)
            try:
                engine.connect(DOCKER_SOCKET)
            except OSError:
                client.close()
                continue
            done = threading.Barrier(2)
            threading.Thread(target=_pipe, args=(client, engine, done), daemon=True).start()
            threading.Thread(target=_pipe, args=(engine, client, done), daemon=True).start()

    def close(self) -> None:
        self.closed = True
        self.listener.close()


class LinkRelay:
    """A worker's direct link reached through here: it listens at 127.0.0.1:PORT, daphnes dial 127.0.0.2:PORT
    (its advertised host), and ``cut`` drops every connection through it, as a network between two hosts
    that fails for a moment. ``hold`` stops passing anything on until the next cut, which loses what was held:
    a network that stalls, then fails."""

    def __init__(self):
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.2", self.port))
        self.connections: list[socket.socket] = []
        self.accepted = 0
        self.cuts = 0
        self.seen = bytearray()  # the first bytes it passed, both ways (what the network between hosts carries)
        self.passed = 0
        self.flowing = threading.Event()
        self.flowing.set()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def env(self) -> dict[str, str]:
        return {"TETHER_LINK_LISTEN": f"tcp:127.0.0.1:{self.port}", "TETHER_LINK_ADVERTISE": "127.0.0.2"}

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                worker = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                client.close()
                continue
            worker.settimeout(None)
            self.accepted += 1
            self.connections += [client, worker]
            threading.Thread(target=self._forward, args=(client, worker, self.cuts), daemon=True).start()
            threading.Thread(target=self._forward, args=(worker, client, self.cuts), daemon=True).start()

    def _forward(self, source: socket.socket, sink: socket.socket, cuts: int) -> None:
        """One direction of a link (a link has no half close: either end ending ends it)."""
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                if self.cuts != cuts:  # held across a cut: lost
                    break
                self.passed += len(data)
                if len(self.seen) < 1 << 20:
                    self.seen += data
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        source.close()

    def hold(self) -> None:
        self.flowing.clear()

    def cut(self) -> None:
        self.cuts += 1
        for end in self.connections:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        self.connections = []
        self.flowing.set()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def link_certificates(where: Path) -> dict[str, str]:
    """For links over TLS (transport/link_tls.py): a CA, a worker's certificate for 127.0.0.2 (a LinkRelay's
    address) and a daphne's, both signed by it, and another CA. {"ca.pem", "other-ca.pem", "worker", "daphne"}:
    the last two without their ".pem" / ".key"."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=tether {ca}",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem")  # fmt: skip
    for name, extension in (("worker", "subjectAltName=IP:127.0.0.2"), ("daphne", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=tether {name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr")  # fmt: skip
        (where / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")  # fmt: skip
    return {name: str(where / name) for name in ("ca.pem", "other-ca.pem", "worker", "daphne")}


# The namespace's first process: names the host, then reaps every process orphaned to it, as a host's init
# does. A `sleep` there reaped nothing: the 10,000-session churn left 7,500 zombies in two hosts, and every
# scan of the process table (ending a shell's tree, recovery) slowed with them, the churn from 2.3 to 1.4
# sessions a second.
INIT = """
import os, socket, sys, time
socket.sethostname(sys.argv[1])
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


@dataclass
class Host:
    """A namespace with its own hostname and process table; processes are started in it through nsenter."""

    name: str
    stack: Stack
    init: subprocess.Popen | None = None
    ns_pid: int = 0  # the namespace's first process, as this (outer) process table numbers it
    daphne: subprocess.Popen | None = None
    daphne_port: int = 0
    worker: subprocess.Popen | None = None
    worker_http: int = 0
    link: LinkRelay | None = None  # its worker's link reached through a relay the test may cut

    def boot(self) -> None:
        """A fresh namespace (after a kill: the host comes back with nothing running)."""
        assert shutil.which("unshare") and shutil.which("nsenter"), "util-linux's unshare and nsenter are needed"
        self.init = subprocess.Popen(
            ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child",
             sys.executable, "-I", "-c", INIT, self.name],
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text().split()
            if children and self._hostname_of(int(children[0])) == self.name:
                self.ns_pid = int(children[0])
                return
            time.sleep(0.02)
        raise AssertionError(f"host {self.name} did not come up")

    @staticmethod
    def _hostname_of(pid: int) -> str:
        done = subprocess.run(["nsenter", "-t", str(pid), "--uts", "hostname"], capture_output=True, text=True)
        return done.stdout.strip()

    def _in_namespace(self, command: list[str], log, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(
            ["nsenter", "-t", str(self.ns_pid), "--uts", "--pid", "--mount", f"--wd={ROOT}", "--", *command],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start_daphne(self) -> int:
        self.daphne_port = self.daphne_port or free_port()
        log = self.stack._log(f"{self.name}-daphne")
        command = [sys.executable, "-m", "config.web", "--proxy-headers", "--websocket_timeout", "-1",
                   "-b", "127.0.0.1", "-p", str(self.daphne_port), "config.asgi:application"]  # fmt: skip
        self.daphne = self._in_namespace(command, log, self.stack.env())
        self.stack.processes.append(self.daphne)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.daphne_port), timeout=0.2).close()
                return self.daphne_port
            except OSError:
                if self.daphne.poll() is not None or time.monotonic() > deadline:
                    said = Path(log.name).read_text()[-2000:]
                    raise AssertionError(f"daphne on {self.name} did not start: {said}") from None
                time.sleep(0.05)

    def start_worker(self, backends: str = "local,tmux,docker") -> subprocess.Popen:
        for _ in range(3):  # a free port can be taken by another test's process before the worker binds it
            self.worker_http = self.worker_http or free_port()
            log = self.stack._log(f"{self.name}-worker")
            env = {
                **self.stack.env(),
                "TETHER_WORKER_HTTP": f"127.0.0.1:{self.worker_http}",
                # Daphnes of both hosts reach it over TCP, as between real hosts (an abstract unix socket is
                # its own host's only, and the two share a network here).
                **(self.link.env if self.link else {"TETHER_LINK_LISTEN": "tcp:127.0.0.1:0"}),
            }
            command = [sys.executable, "manage.py", "terminal_worker", "--poll", str(self.stack.worker_poll),
                       "--backends", backends]  # fmt: skip
            self.worker = self._in_namespace(command, log, env)
            self.stack.processes.append(self.worker)
            deadline = time.monotonic() + 30
            while b" ready (" not in Path(log.name).read_bytes():
                if self.worker.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            settled = time.monotonic() + 1.0  # its HTTP server binds just after it says ready
            while self.worker.poll() is None and time.monotonic() < settled:
                time.sleep(0.05)
            if self.worker.poll() is None:
                return self.worker
            said = Path(log.name).read_text()
            if "address already in use" not in said:
                raise AssertionError(f"worker on {self.name} did not start: {said[-2000:]}")
            self.worker_http = 0
        raise AssertionError(f"worker on {self.name} found no free port for its HTTP server in 3 tries")

    def zombies(self) -> int:
        """Processes that ended in this host and were never reaped (the namespace's init reaps them)."""
        try:
            children = Path(f"/proc/{self.ns_pid}/task/{self.ns_pid}/children").read_text().split()
        except OSError:
            return 0
        states = []
        for pid in children:
            with contextlib.suppress(OSError):
                states.append(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
        return states.count("Z")

    def pids(self) -> list[int]:
        """Every process in this host's namespace, as the outer process table numbers them."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if Path(f"/proc/{entry.name}/ns/pid").readlink() == Path(f"/proc/{self.ns_pid}/ns/pid").readlink():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def kill(self) -> None:
        """Power off: SIGKILL to the namespace's first process takes every process in it down at once."""
        if self.init is None:
            return
        try:
            os.kill(self.ns_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.init.wait(timeout=10)
        except subprocess.TimeoutExpired:
            left = subprocess.run(
                ["ps", "-o", "pid,ppid,stat,wchan:30,cmd", "-p", ",".join(map(str, self.pids() or [0]))],
                capture_output=True,
                text=True,
            ).stdout
            parents = subprocess.run(
                ["ps", "-o", "pid,ppid,stat,wchan:30,cmd", "--ppid", str(os.getpid())], capture_output=True, text=True
            ).stdout
            raise AssertionError(f"host {self.name} did not go down; left: {left}; ours: {parents}") from None
        for process in (self.daphne, self.worker):
            if process is not None:
                process.wait(timeout=10)
        self.init = self.daphne = self.worker = None


@dataclass
class Balancer:
    """Debian's HAProxy in front of the daphnes, passing WebSockets, checking /readyz, round robin."""

    backends: dict[str, int]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tether-haproxy-")))

    def start(self) -> Balancer:
        binary = shutil.which("haproxy")
        assert binary, "haproxy is not installed: `make services` installs it (scripts/ensure-services.sh)"
        servers = "".join(
            f"    server {name} 127.0.0.1:{port} check inter 500ms fall 3 rise 1\n"
            for name, port in self.backends.items()
        )
        (self.dir / "haproxy.cfg").write_text(
            "global\n    maxconn 4096\n"
            "defaults\n    mode http\n    option forwardfor\n    retries 3\n    option redispatch 1\n"
            # A /readyz slow under a full run's load is not a daphne gone (one refused connection is): HAProxy
            # once said 503 "No server is available" to a live one.
            "    timeout connect 2s\n    timeout check 2s\n    timeout client 60s\n"
            "    timeout server 60s\n    timeout tunnel 1h\n"
            f"frontend tether\n    bind 127.0.0.1:{self.port}\n"
            "    http-request deny deny_status 403 if { path /metrics }\n"
            "    http-response set-header X-Served-By %s\n"  # which daphne answered (the tests ask)
            "    default_backend daphnes\n"
            "backend daphnes\n    balance roundrobin\n    option httpchk GET /readyz\n"
            "    http-check expect status 200\n" + servers
        )
        self.log = open(self.dir / "haproxy.log", "w+b")
        self.process = subprocess.Popen(
            [binary, "-db", "-f", str(self.dir / "haproxy.cfg")], stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    said = (self.dir / "haproxy.log").read_text()[-2000:]
                    raise AssertionError(f"haproxy did not start: {said}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
