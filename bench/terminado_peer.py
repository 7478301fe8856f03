"""The peer Tether is compared with: terminado (Jupyter's terminals), one tornado process reading its PTYs
in-process and writing JSON messages to each WebSocket, with no broker and no durability.

    python -m bench.terminado_peer PORT -- PROGRAM [ARGS...]

serves ``ws://127.0.0.1:PORT/websocket``: each connection gets a PTY of its own running PROGRAM (terminado's
UniqueTermManager, as in its own demos). The client side, used by the benchmarks, is below: it speaks
terminado's protocol (``["stdin", text]`` in, ``["stdout", text]`` out) with the same WebSocket library
and settings as the benchmarks' Tether client.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

from bench.common import ROOT


def serve(port: int, argv: list[str]) -> None:
    import tornado.ioloop
    import tornado.web
    from terminado import TermSocket, UniqueTermManager

    manager = UniqueTermManager(shell_command=argv)
    app = tornado.web.Application([(r"/websocket", TermSocket, {"term_manager": manager})])
    app.listen(port, address="127.0.0.1")
    print("ready", flush=True)
    tornado.ioloop.IOLoop.current().start()


class Terminado:
    """A terminado server process serving ``argv`` on a free port, for the length of a ``with``."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.port = 0
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Terminado:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.terminado_peer", str(self.port), "--", *self.argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("terminado did not start (is it installed? see requirements.txt)")
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(10)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def open(self) -> TerminadoClient:
        from websockets.asyncio.client import connect

        ws = await connect(
            f"ws://127.0.0.1:{self.port}/websocket",
            additional_headers={"Origin": f"http://127.0.0.1:{self.port}"},
            max_size=2**22,
            ping_interval=None,
        )
        client = TerminadoClient(ws)
        await client.send(["set_size", 24, 80])
        return client


class TerminadoClient:
    """A terminado page's side of the socket: what was printed, as bytes (terminado sends UTF-8 text)."""

    def __init__(self, ws):
        self.ws = ws
        self.output = bytearray()

    async def send(self, message: list) -> None:
        await self.ws.send(json.dumps(message))

    async def type(self, data: bytes | str) -> None:
        await self.send(["stdin", data.decode() if isinstance(data, bytes) else data])

    async def frame(self, timeout: float = 10.0) -> bytes:
        """The next output message's bytes (other messages, such as ``setup``, are skipped)."""
        while True:
            kind, *rest = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if kind == "stdout":
                data = rest[0].encode()
                self.output += data
                return data

    async def read_until(self, needle: bytes, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        seen = 0  # where the needle may start: only what is new is searched again
        while needle not in self.output[seen:]:
            seen = max(len(self.output) - len(needle) + 1, 0)
            await self.frame(max(deadline - time.monotonic(), 0.01))

    async def close(self) -> None:
        await self.ws.close()


async def terminado_echo(argv: list[str], samples: int, cpu: dict | None = None) -> list[float]:
    """Keystroke to echo through terminado, timed as the benchmarks time Tether's (one byte, until it is back).
    ``cpu``, when given, gets the server's CPU milliseconds per echo (``"terminado"``)."""
    from bench.common import cpu_seconds

    with Terminado(argv) as server:
        client = await server.open()
        try:
            await client.read_until(b"READY")
            times = []
            letters = b"abcdefghijklmnopqrstuvwxyz"
            for i in range(samples + 50):
                byte = letters[i % 26 : i % 26 + 1]
                if i == 50:
                    cpu_before = cpu_seconds(server.pid)
                began = time.perf_counter()
                await client.type(byte)
                while byte not in await client.frame():
                    pass
                if i >= 50:  # the first 50 warm up, as for Tether
                    times.append((time.perf_counter() - began) * 1000)
            if cpu is not None:
                cpu["terminado"] = (cpu_seconds(server.pid) - cpu_before) * 1000 / samples
            return times
        finally:
            await client.close()


async def terminado_output(argv: list[str], start: bytes = b"\r") -> tuple[bytes, float, float]:
    """What a program prints after ``start`` is typed, up to ``__END__``, the seconds it took to arrive, and
    the CPU seconds terminado's server spent meanwhile."""
    from bench.common import cpu_seconds

    with Terminado(argv) as server:
        client = await server.open()
        try:
            await asyncio.sleep(0.3)
            cpu_before = cpu_seconds(server.pid)
            began = time.perf_counter()
            await client.type(start)
            await client.read_until(b"__END__", timeout=600)
            elapsed = time.perf_counter() - began
            return bytes(client.output), elapsed, cpu_seconds(server.pid) - cpu_before
        finally:
            await client.close()


if __name__ == "__main__":
    port, separator, *program = sys.argv[1:]
    assert separator == "--" and program, __doc__
    os.environ.setdefault("TERM", "xterm-256color")
    serve(int(port), program)
