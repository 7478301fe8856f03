"""Other users' browsers: attach to sessions and read (and acknowledge) everything they print, in a
process of their own, so the client being timed does not share its event loop with them.

    python -m bench.drain PORT COOKIE SESSION_ID...

Prints "ready" once every viewer is attached, then reads until SIGTERM. On SIGUSR1 and on SIGTERM it
prints how many bytes its viewers have been sent in all (their offsets), so the caller can take a rate.
"""

from __future__ import annotations

import asyncio
import signal
import sys


async def main(port: int, cookie: str, session_ids: list[str]) -> None:
    from tests.bridge.harness import Viewer

    viewers = []
    for session_id in session_ids:
        viewer = await Viewer.open(port, session_id, cookie)
        await viewer.attach()
        viewers.append(viewer)
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(sum(viewer.offset for viewer in viewers), flush=True))

    async def drain(viewer) -> None:
        while True:
            await viewer.read_for(1)
            viewer.output.clear()  # counted by offset; kept, it would grow by a megabyte a second

    draining = [asyncio.create_task(drain(viewer)) for viewer in viewers]
    await stop.wait()
    for task in draining:
        task.cancel()
    print(sum(viewer.offset for viewer in viewers), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
