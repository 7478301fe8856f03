"""Which backend serves a machine."""

from __future__ import annotations

import shutil

from django.conf import settings

from executions.models import Backend as BackendKind
from executions.models import Machine
from terminals.backends.base import Backend


def tmux_backend(ref: str = ""):
    """The tmux backend on the socket a tmux machine's ``ref`` names; an empty ref is the default
    (TETHER_TMUX_SOCKET)."""
    from terminals.backends.tmux import TmuxBackend

    return TmuxBackend(socket=ref or settings.TETHER_TMUX_SOCKET)


def backend_for(machine: Machine) -> Backend:
    if machine.backend == BackendKind.LOCAL:
        from terminals.backends.local import LocalBackend

        return LocalBackend()
    if machine.backend == BackendKind.TMUX:
        return tmux_backend(machine.ref)
    from terminals.backends.docker import DockerBackend

    return DockerBackend(container=machine.ref, engine=machine.engine)


def available_backends() -> set[str]:
    """The kinds of machine this host can serve."""
    kinds = {BackendKind.LOCAL.value}
    if shutil.which("tmux"):
        kinds.add(BackendKind.TMUX.value)
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # no engine here: docker machines are left to other workers
        pass
    else:
        kinds.add(BackendKind.DOCKER.value)
    return kinds


def embedded_backend_kind() -> str:
    """The embedded default: tmux when it exists (sessions outlive the process), else a local PTY."""
    return BackendKind.TMUX.value if shutil.which("tmux") else BackendKind.LOCAL.value
