"""Docker engine URLs a machine may name: checked when the machine is added, so a typo is refused at once
instead of at its first spawn."""

from __future__ import annotations

from urllib.parse import urlsplit

# The docker SDK's engine URL schemes (DOCKER_HOST style); http(s) are tcp without and with TLS.
ENGINE_SCHEMES = ("unix", "tcp", "ssh", "http", "https")


def engine_problem(engine: str) -> str | None:
    """Why ``engine`` cannot be a docker machine's engine URL, or None when it can (empty: the local socket)."""
    if not engine:
        return None
    shape = "unix:///PATH, tcp://HOST:PORT, ssh://[USER@]HOST, http://HOST:PORT or https://HOST:PORT"
    parts = urlsplit(engine)
    try:
        port = parts.port
    except ValueError:
        return f"engine {engine!r} has a port that is not a number; use {shape}"
    if parts.scheme not in ENGINE_SCHEMES:
        return f"engine {engine!r} is not a docker engine URL; use {shape}"
    if parts.scheme == "unix":
        wrong = not (parts.path or parts.netloc)
    else:
        # the SDK refuses a tcp(-like) URL without a port, and an ssh URL with a path
        wrong = (
            not parts.hostname
            or (parts.scheme != "ssh" and port is None)
            or (parts.scheme == "ssh" and bool(parts.path))
        )
    return f"engine {engine!r} is not a docker engine URL; use {shape}" if wrong else None
