from __future__ import annotations

import pytest

from executions.actions import Actor, add_machine
from terminals import actions
from tests.bridge.harness import Stack, session_cookie


@pytest.fixture
def stack():
    stack = Stack()
    try:
        stack.start_daphne()
        stack.start_worker()
        yield stack
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
        session, _ = actions.open_terminal(place(backend), user)
        return session, session_cookie(user)

    return make
