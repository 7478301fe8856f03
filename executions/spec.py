"""The immutable execution spec: what to run and within which limits.

A spec is validated once, then frozen into canonical JSON; its digest is how an
idempotent re-submission is told apart from a conflicting one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from django.conf import settings

MAX_COLS = 500
MAX_ROWS = 200
MAX_ARGV_BYTES = 64 * 1024


class SpecError(ValueError):
    """The spec is malformed; the message says which field and why."""


@dataclass(frozen=True)
class ExecutionSpec:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    cols: int = 80
    rows: int = 24
    session_seconds: int = 0
    idle_seconds: int = 0
    output_limit_bytes: int = 0
    # False: on pipes (stdout and stderr apart, stdin that can be closed: executions.pipes), not a terminal.
    pty: bool = True

    @classmethod
    def build(cls, argv, **options) -> ExecutionSpec:
        """Validate and fill defaults from settings."""
        defaults = {
            "cols": settings.TETHER_DEFAULT_COLS,
            "rows": settings.TETHER_DEFAULT_ROWS,
            "session_seconds": settings.TETHER_SESSION_SECONDS,
            "idle_seconds": settings.TETHER_IDLE_SECONDS,
            "output_limit_bytes": settings.TETHER_OUTPUT_LIMIT_BYTES,
        }
        values = {**defaults, **{k: v for k, v in options.items() if v is not None}}
        spec = cls(argv=tuple(argv), **values)
        spec.validate()
        if spec.cwd and not spec.cwd.startswith("/"):
            # Relative to nothing on the machine (a docker engine refuses it only once the worker starts it).
            raise SpecError(f"cwd: must be an absolute path, got {spec.cwd!r}")
        return spec

    @classmethod
    def from_json(cls, data: dict) -> ExecutionSpec:
        try:
            spec = cls(**{**data, "argv": tuple(data["argv"])})
        except (KeyError, TypeError) as error:
            raise SpecError(f"spec is not well formed: {error}") from None
        spec.validate()
        return spec

    def validate(self) -> None:
        if not self.argv:
            raise SpecError("argv: a program to run is required")
        if not all(isinstance(arg, str) for arg in self.argv):
            raise SpecError("argv: every argument must be a string")
        if any("\x00" in arg for arg in self.argv):
            raise SpecError("argv: arguments cannot contain NUL bytes")
        if sum(len(arg.encode()) for arg in self.argv) > MAX_ARGV_BYTES:
            raise SpecError(f"argv: longer than {MAX_ARGV_BYTES} bytes")
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
            for k, v in self.env.items()
        ):
            raise SpecError("env: must map non-empty names without '=' to strings")
        for name, low, high in (("cols", 1, MAX_COLS), ("rows", 1, MAX_ROWS)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise SpecError(f"{name}: must be an integer from {low} to {high}, got {value!r}")
        for name in ("session_seconds", "idle_seconds", "output_limit_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SpecError(f"{name}: must be a non-negative integer (0 means no limit), got {value!r}")
        if not isinstance(self.cwd, str) or "\x00" in self.cwd:
            raise SpecError("cwd: must be a path string")
        if not isinstance(self.pty, bool):
            raise SpecError(f"pty: must be true or false, got {self.pty!r}")

    def to_json(self) -> dict:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["env"] = dict(sorted(self.env.items()))
        if self.pty:  # the default is left out: a spec from before pipes keeps its digest
            del data["pty"]
        return data

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()
