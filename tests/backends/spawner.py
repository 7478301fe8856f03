"""Spawn a process through a backend, print its handle as JSON, then wait to be killed.

Used to prove that a different OS process can inspect what a dead spawner left behind.
Usage: python -m tests.backends.spawner BACKEND 'JSON constructor kwargs' ARGV...
"""

import asyncio
import json
import sys

from tests.backends.conftest import make_tags


async def main() -> None:
    name, kwargs, *argv = sys.argv[1:]
    if name == "local":
        from terminals.backends.local import LocalBackend as backend_class
    elif name == "tmux":
        from terminals.backends.tmux import TmuxBackend as backend_class
    else:
        from terminals.backends.docker import DockerBackend as backend_class
    from terminals.backends import handles
    from terminals.backends.base import SpawnSpec

    backend = backend_class(**json.loads(kwargs))
    process = await backend.spawn(SpawnSpec(argv=tuple(argv)), make_tags())
    print(json.dumps(handles.dump(process.handle)), flush=True)  # as a lease keeps it
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
