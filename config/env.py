"""Read settings from the environment, failing loudly on values that make no sense.

A typo such as ``DEBUG=ture`` must stop start-up with a clear message rather than
silently fall back to a default.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {maximum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ImproperlyConfigured(f"{name}={raw!r} has an empty entry; separate values with single commas")
    return items


def env_choice(name: str, default: str, choices: set[str]) -> str:
    value = os.environ.get(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of {', '.join(sorted(choices))}")
    return value


def storage_from_env(backend_name: str, options_name: str, default_location: Path) -> dict:
    """A STORAGES entry: the class named by ``backend_name`` (a dotted path) with the JSON object of options in
    ``options_name``; by default files under ``default_location``."""
    backend = os.environ.get(backend_name, "").strip()
    raw = os.environ.get(options_name, "").strip()
    try:
        options = json.loads(raw) if raw else {}
    except ValueError:
        raise ImproperlyConfigured(f"{options_name} is not JSON: {raw[:60]!r}") from None
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"{options_name} must be a JSON object of the storage's options")
    if not backend:
        files = "django.core.files.storage.FileSystemStorage"
        return {"BACKEND": files, "OPTIONS": {"location": str(default_location)}}
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", backend):
        raise ImproperlyConfigured(f"{backend_name}={backend!r} is not a dotted path to a storage class")
    return {"BACKEND": backend, "OPTIONS": options}


def database_from_url(url: str) -> dict:
    """Translate ``sqlite:///path`` or ``postgres://user:pass@host:port/name?opt=v`` to a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if path.startswith("/") and parts.netloc == "":
            path = path[1:] if path.startswith("//") else path
        if not path:
            raise ImproperlyConfigured(f"DATABASE_URL={url!r} names no SQLite file")
        # The embedded mode's web process, worker and management commands write it at once: each transaction
        # takes the write lock when it begins (a deferred one that read first failed at once with "database
        # is locked" when another writer was waiting to commit), and in WAL mode readers never wait.
        options = {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path, "OPTIONS": options}
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL={url!r} names no database")
        port = _port("DATABASE_URL", url, parts)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        host = query.pop("host", parts.hostname or "")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": host,
            "PORT": str(port or ""),
            "OPTIONS": query,
        }
    raise ImproperlyConfigured(f"DATABASE_URL={url!r}: scheme must be sqlite or postgres")


def _port(name: str, raw: str, parts) -> int | None:
    """The URL's port; urlsplit's own error for a bad one names neither the variable nor the value."""
    try:
        return parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} has a port that is not a number (0-65535)") from None


_REDIS_SCHEMES = ("redis", "rediss", "unix")


def redis_url(name: str = "REDIS_URL") -> str | None:
    """A Redis URL (``redis://``, ``rediss://`` or ``unix://``), or None when unset or empty (in-memory layer)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    parts = urlsplit(raw.strip())
    if parts.scheme not in _REDIS_SCHEMES:
        raise ImproperlyConfigured(
            f"{name}={raw!r}: scheme must be redis://, rediss:// or unix:// (unset it for the in-memory layer)"
        )
    _port(name, raw, parts)
    if parts.scheme == "unix" and not parts.path:
        raise ImproperlyConfigured(f"{name}={raw!r} names no socket path (unix:///run/redis/redis.sock)")
    if parts.scheme != "unix" and not parts.hostname:
        raise ImproperlyConfigured(f"{name}={raw!r} names no host (redis://HOST:6379/0)")
    return raw.strip()


def allowed_hosts(*, required: bool, default: list[str]) -> list[str]:
    """ALLOWED_HOSTS from the environment; production has no safe default, so it must be set."""
    if required and not os.environ.get("ALLOWED_HOSTS", "").strip():
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS must be set when TETHER_MODE=production (comma-separated host names, e.g. tether.example)"
        )
    return env_list("ALLOWED_HOSTS", default)


def secret_key(data_dir: Path, *, required: bool) -> str:
    """SECRET_KEY from the environment; in development, generate one and keep it in the data directory."""
    value = os.environ.get("SECRET_KEY")
    if value:
        # Django's own deployment check (security.W009) asks for 50 characters, 5 of them different.
        if len(value) < 50 or len(set(value)) < 5:
            raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters long, with at least 5 different")
        return value
    if required:
        raise ImproperlyConfigured("SECRET_KEY must be set when TETHER_MODE=production")
    path = data_dir / "secret_key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        # Write aside, then link into place: two processes starting at once
        # agree on whichever key was linked first and never read a half-written file.
        scratch = data_dir / f".secret_key.{os.getpid()}"
        scratch.write_text(secrets.token_urlsafe(50))
        scratch.chmod(0o600)
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass
        finally:
            scratch.unlink()
    return path.read_text().strip()


def proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """TETHER_PROXY_SCHEME_HEADER ("X-Forwarded-Proto: https") as Django's SECURE_PROXY_SSL_HEADER."""
    if not raw:
        return None
    name, sep, value = raw.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not value or not re.fullmatch(r"[A-Za-z0-9-]+", name):
        raise ImproperlyConfigured(
            f"TETHER_PROXY_SCHEME_HEADER={raw!r} must look like 'X-Forwarded-Proto: https' (a header name, a colon, "
            "the value the proxy sets for https)"
        )
    return "HTTP_" + name.upper().replace("-", "_"), value
