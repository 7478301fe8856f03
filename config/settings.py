"""Tether settings. Every knob comes from the environment; see README "Configuration"."""

import importlib.util
import re
import socket
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.env import (
    allowed_hosts,
    database_from_url,
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_str,
    proxy_ssl_header,
    redis_url,
    secret_key,
    storage_from_env,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# embedded: one process, SQLite, in-memory channel layer, generated secret.
# production: PostgreSQL/Redis from the environment, SECRET_KEY and ALLOWED_HOSTS required, secure cookies.
TETHER_MODE = env_choice("TETHER_MODE", "embedded", {"embedded", "production"})
PRODUCTION = TETHER_MODE == "production"
DATA_DIR = Path(env_str("TETHER_DATA_DIR", str(BASE_DIR / "var")))

SECRET_KEY = secret_key(DATA_DIR, required=PRODUCTION)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = allowed_hosts(required=PRODUCTION, default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Not "ninja" either: installing it imported django-ninja, pydantic and django.test into every process at
# set-up (0.25 s of each worker's, daphne's and management command's start). Only its templates and static
# files (the API docs page) are needed, found where it is installed without importing it.
NINJA_DIR = Path(importlib.util.find_spec("ninja").submodule_search_locations[0])
# Not "daphne": its app only swaps runserver for an ASGI one (tether_serve and `python -m daphne` serve), and
# installing it imported daphne's server and Twisted's reactor into every process (0.5 s a management command).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "executions",
    "access",
    "terminals",
    "recordings",
    "api",
    "sso",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    *(["sso.middleware.SessionRefresh"] if env_str("TETHER_OIDC_ISSUER", "") else []),
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "api.middleware.problems_only",
    "api.middleware.audit_api_calls",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "sso.context.sign_in",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

DATABASES = {
    "default": database_from_url(env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'tether.sqlite3'}")),
}
# A process frozen inside a transaction (SIGSTOP, a paused VM) must not hold lease rows forever: PostgreSQL
# ends such a session after this long, so another worker can take its leases over (0 turns it off).
TETHER_DB_IDLE_TRANSACTION_SECONDS = env_int("TETHER_DB_IDLE_TRANSACTION_SECONDS", 60, minimum=0)
if DATABASES["default"]["ENGINE"].endswith("postgresql") and TETHER_DB_IDLE_TRANSACTION_SECONDS:
    DATABASES["default"]["OPTIONS"].setdefault(
        "options", f"-c idle_in_transaction_session_timeout={TETHER_DB_IDLE_TRANSACTION_SECONDS * 1000}"
    )

# PostgreSQL connections come from a pool in each process (checked before reuse, so a restarted
# PostgreSQL costs a reconnect, not an error). Without it every database call made its own connection:
# the worker's claim poll and heartbeats, and in daphne each open terminal's owner check (two a viewer
# every TETHER_VIEWER_CHECK_SECONDS: 40 new PostgreSQL backends a second for 100 viewers); see
# docs/benchmarks.md. Django's ASGI mode rules out persistent connections, not a pool. 0 turns it off.
TETHER_DB_POOL_SIZE = env_int("TETHER_DB_POOL_SIZE", 8, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"].endswith("postgresql") and TETHER_DB_POOL_SIZE:
    DATABASES["default"]["OPTIONS"]["pool"] = {"min_size": 1, "max_size": TETHER_DB_POOL_SIZE, "timeout": 30}

# Unset or empty: the in-memory channel layer (one process only). Otherwise redis://, rediss:// or unix://.
REDIS_URL = redis_url("REDIS_URL")
# Every channel-layer message is refused over this size (transport/layers.py). Output travels in
# 64 KiB pieces; the largest message is a tmux screen redrawn on attach, kept well under this.
TETHER_LAYER_MESSAGE_BYTES = env_int("TETHER_LAYER_MESSAGE_BYTES", 1024 * 1024, minimum=128 * 1024)
# pubsub: Redis PUBLISH (at-most-once), spoken by Tether's own client (transport/redis_layer.py:
# pipelined publishes, one subscribing connection read with hiredis); channels-pubsub: the same through
# channels-redis's pub/sub layer (redis-py's command path, 1.7x the CPU a hop); core: channels-redis lists
# (at-least-once, per-channel capacity). The protocol survives both loss and repetition (offsets,
# numbered input, owner checks against PostgreSQL); see docs/benchmarks.md.
TETHER_CHANNEL_LAYER = env_choice("TETHER_CHANNEL_LAYER", "pubsub", {"core", "pubsub", "channels-pubsub"})
# Direct links (transport/links.py; the pubsub layer only): a session's stream between a daphne and the worker
# that owns it goes over a link of its own, not through Redis. A worker listens as TETHER_LINK_LISTEN says:
# `unix` (an abstract socket: daphnes on its host), or `tcp:HOST:PORT` (PORT 0: any free one) with
# TETHER_LINK_ADVERTISE the host others reach it at (default: HOST, or this host's name for 0.0.0.0).
TETHER_LINKS = env_bool("TETHER_LINKS", True)
TETHER_LINK_LISTEN = env_str("TETHER_LINK_LISTEN", "unix")
TETHER_LINK_ADVERTISE = env_str("TETHER_LINK_ADVERTISE", "")
LINK_ADDRESS = r"(tcp|tls):(\[[0-9a-fA-F:]+\]|[\w.-]+):\d{1,5}"
if TETHER_LINK_LISTEN != "unix" and not re.fullmatch(LINK_ADDRESS, TETHER_LINK_LISTEN):
    raise ImproperlyConfigured(f"TETHER_LINK_LISTEN is unix, tcp:HOST:PORT or tls:HOST:PORT: {TETHER_LINK_LISTEN!r}")
# TLS between hosts (`tls:HOST:PORT`, transport/link_tls.py): PEM files. A worker presents TETHER_LINK_TLS_CERT
# (and KEY) and, with TETHER_LINK_TLS_CA, asks daphnes for a certificate signed by it; a daphne checks the
# worker's against TETHER_LINK_TLS_CA (the system's authorities without it) and presents its own CERT if set.
TETHER_LINK_TLS_CERT = env_str("TETHER_LINK_TLS_CERT", "")
TETHER_LINK_TLS_KEY = env_str("TETHER_LINK_TLS_KEY", "")
TETHER_LINK_TLS_CA = env_str("TETHER_LINK_TLS_CA", "")
if TETHER_LINK_LISTEN.startswith("tls:") and not TETHER_LINK_TLS_CERT:
    raise ImproperlyConfigured("TETHER_LINK_LISTEN=tls:... needs TETHER_LINK_TLS_CERT (and TETHER_LINK_TLS_KEY)")
if REDIS_URL and TETHER_CHANNEL_LAYER == "pubsub":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "transport.layers.CappedRedisPubSubLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                "prefix": env_str("TETHER_CHANNEL_PREFIX", "tether"),
                "links": TETHER_LINKS,
            },
        }
    }
elif REDIS_URL and TETHER_CHANNEL_LAYER == "channels-pubsub":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "transport.layers.CappedPubSubLayer",
            # RESP2: redis-py's RESP3 parser formats every pub/sub message into a debug string, logged or
            # not (a third of daphne's time at full output, docs/benchmarks.md); RESP2 has no such step.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "protocol": 2}],
                "prefix": env_str("TETHER_CHANNEL_PREFIX", "tether"),
            },
        }
    }
elif REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "transport.layers.CappedRedisLayer",
            "CONFIG": {
                # redis-py 8 reads with a 5 s socket timeout, the same as channels-redis' 5 s blocking
                # pop: an idle receive then fails with TimeoutError. Give the socket more room.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                "prefix": env_str("TETHER_CHANNEL_PREFIX", "tether"),
                # Output is flow-controlled by acks, so a channel this deep means a lost viewer, not a burst.
                "capacity": 1000,
                "expiry": 60,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "transport.layers.CappedInMemoryLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

# Single sign-on with the company's identity provider (OpenID Connect; docs/access.md): on when an issuer is set.
# Its endpoints come from the issuer's discovery document; a person's groups from the groups claim at every
# sign-in (through the map "provider-group=tether-group,..." when one is given: then only mapped groups are the
# provider's to set); a sign-in session lasts TETHER_OIDC_SESSION_SECONDS before the provider is asked again.
TETHER_OIDC_ISSUER = env_str("TETHER_OIDC_ISSUER", "").rstrip("/")
TETHER_OIDC_NAME = env_str("TETHER_OIDC_NAME", "your company's sign-in")
TETHER_OIDC_CLIENT_ID = env_str("TETHER_OIDC_CLIENT_ID", "")
TETHER_OIDC_CLIENT_SECRET = env_str("TETHER_OIDC_CLIENT_SECRET", "")
TETHER_OIDC_SCOPES = env_str("TETHER_OIDC_SCOPES", "openid email profile groups")
TETHER_OIDC_USERNAME_CLAIM = env_str("TETHER_OIDC_USERNAME_CLAIM", "preferred_username")
TETHER_OIDC_GROUPS_CLAIM = env_str("TETHER_OIDC_GROUPS_CLAIM", "groups")
TETHER_OIDC_GROUP_MAP = env_str("TETHER_OIDC_GROUP_MAP", "")
TETHER_OIDC_PASSWORDS = env_bool("TETHER_OIDC_PASSWORDS", True)  # local passwords stay on beside it
TETHER_OIDC_SESSION_SECONDS = env_int("TETHER_OIDC_SESSION_SECONDS", 15 * 60, minimum=1)
# How far the provider's clock may be from Tether's when its tokens' times (iat, nbf, exp) are checked.
TETHER_OIDC_LEEWAY_SECONDS = env_int("TETHER_OIDC_LEEWAY_SECONDS", 60, minimum=0, maximum=600)
if TETHER_OIDC_ISSUER:
    if not (TETHER_OIDC_CLIENT_ID and TETHER_OIDC_CLIENT_SECRET):
        raise ImproperlyConfigured("TETHER_OIDC_ISSUER needs TETHER_OIDC_CLIENT_ID and TETHER_OIDC_CLIENT_SECRET")
    AUTHENTICATION_BACKENDS = ["sso.backend.SsoBackend"]
    if TETHER_OIDC_PASSWORDS:
        AUTHENTICATION_BACKENDS.append("django.contrib.auth.backends.ModelBackend")
    OIDC_RP_CLIENT_ID, OIDC_RP_CLIENT_SECRET = TETHER_OIDC_CLIENT_ID, TETHER_OIDC_CLIENT_SECRET
    OIDC_RP_SCOPES = TETHER_OIDC_SCOPES
    OIDC_RP_SIGN_ALGO = env_str("TETHER_OIDC_SIGN_ALGO", "RS256")
    OIDC_USE_PKCE = True
    OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = TETHER_OIDC_SESSION_SECONDS
    OIDC_AUTHENTICATION_CALLBACK_URL = "sso:callback"
    OIDC_TIMEOUT = 10
    LOGIN_REDIRECT_URL_FAILURE = "/sso/failed/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_DIR / "static"]
STATIC_ROOT = Path(env_str("TETHER_STATIC_ROOT", "") or DATA_DIR / "staticfiles")
# The embedded mode serves the source folders from daphne itself (nothing to collect). In production WhiteNoise
# serves what `manage.py collectstatic` gathered into STATIC_ROOT, compressed, under content-hashed names that
# browsers may cache for good.
SERVE_STATIC = not PRODUCTION
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # Finished session recordings (docs/recordings.md): files under the data directory, or any Django storage
    # (TETHER_RECORDINGS_STORAGE, a dotted class path, with TETHER_RECORDINGS_STORAGE_OPTIONS as JSON).
    "recordings": storage_from_env(
        "TETHER_RECORDINGS_STORAGE",
        "TETHER_RECORDINGS_STORAGE_OPTIONS",
        Path(env_str("TETHER_RECORDINGS_DIR", "") or DATA_DIR / "recordings"),
    ),
}
if PRODUCTION:
    MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")
    STORAGES["staticfiles"] = {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"}

# The API's per-token rate limits (api/limits.py) are counted in the cache: shared through Redis when there
# is one, so every daphne counts the same calls; in this process's memory otherwise (the embedded mode).
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("TETHER_CHANNEL_PREFIX", "tether"),
        }
    }

# Behind a proxy that terminates TLS: the header it sets on every request, as "Name: value" (for instance
# "X-Forwarded-Proto: https"; the proxy must replace any such header a client sent). Requests that carry it are
# taken as https: the login's CSRF check and the terminal socket's Origin check then expect https origins.
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(env_str("TETHER_PROXY_SCHEME_HEADER", ""))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
SESSION_COOKIE_HTTPONLY = True

# plain: a line of text an event; json: one JSON object an event, with the session, execution, worker and user
# ids it is about (config/logs.py), for a log store to query across daphne and the workers.
TETHER_LOG_FORMAT = env_choice("TETHER_LOG_FORMAT", "plain", {"plain", "json"})
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "config.logs.JsonFormatter", "host": env_str("TETHER_HOST", "") or socket.gethostname()},
    },
    # No secret in a log (config/redact.py): share-link tokens, API tokens, bearer and session values.
    "filters": {"redact": {"()": "config.redact.RedactingFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": TETHER_LOG_FORMAT, "filters": ["redact"]}},
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", "INFO", {"DEBUG", "INFO", "WARNING", "ERROR"})},
}

# Prometheus metrics (terminals/metrics.py) at /metrics of every web process and of a worker's --http server:
# loopback only, or a bearer token. A worker's own server (/healthz, /readyz, /metrics): HOST:PORT, off when "".
TETHER_METRICS_TOKEN = env_str("TETHER_METRICS_TOKEN", "")
if TETHER_METRICS_TOKEN and len(TETHER_METRICS_TOKEN) < 24:
    raise ImproperlyConfigured("TETHER_METRICS_TOKEN must be at least 24 characters (a guessable one opens /metrics)")
TETHER_WORKER_HTTP = env_str("TETHER_WORKER_HTTP", "")

# Execution limits: defaults applied to a spec that does not set its own.
TETHER_DEFAULT_COLS = env_int("TETHER_DEFAULT_COLS", 80, minimum=1, maximum=500)
TETHER_DEFAULT_ROWS = env_int("TETHER_DEFAULT_ROWS", 24, minimum=1, maximum=200)
TETHER_IDLE_SECONDS = env_int("TETHER_IDLE_SECONDS", 30 * 60, minimum=1)
TETHER_SESSION_SECONDS = env_int("TETHER_SESSION_SECONDS", 12 * 60 * 60, minimum=1)
TETHER_OUTPUT_LIMIT_BYTES = env_int("TETHER_OUTPUT_LIMIT_BYTES", 1024 * 1024 * 1024, minimum=1)

# Owner worker and sessions.
TETHER_LEASE_TTL_SECONDS = env_int("TETHER_LEASE_TTL_SECONDS", 15, minimum=2)
TETHER_HEARTBEAT_SECONDS = env_int("TETHER_HEARTBEAT_SECONDS", 3, minimum=1)
# 512 KiB: a 448 KiB flow window keeps a stream fast over the ack round trip and a stalled browser's
# in-flight bytes under 512 KiB (docs/benchmarks.md).
TETHER_BUFFER_BYTES = env_int("TETHER_BUFFER_BYTES", 512 * 1024, minimum=128 * 1024)
TETHER_COMMAND_OUTPUT_BYTES = env_int("TETHER_COMMAND_OUTPUT_BYTES", 256 * 1024, minimum=0)
# A page that comes back after what the buffer keeps is shown the screen as it is (terminals/screen): kept by the
# page's own emulator in a node process beside the worker, with this many lines of scrollback above it (the
# buffer's bytes come after it; docs/benchmarks.md: output at 0.92x of the same shell without it, median of five
# runs). 0 keeps no screens: such a page gets the buffer's tail. 0 by default until a docker test that failed once
# with screens on (the holder did not record a program's end: its ring is larger with screens) is understood.
TETHER_SCREEN_SCROLLBACK = env_int("TETHER_SCREEN_SCROLLBACK", 200, minimum=0, maximum=10_000)
TETHER_SHELL = env_list("TETHER_SHELL", ["/bin/bash", "-l"] if Path("/bin/bash").exists() else ["/bin/sh"])
# The tmux socket of tmux machines that name none (the embedded machine): `tmux -L tether attach`.
TETHER_TMUX_SOCKET = env_str("TETHER_TMUX_SOCKET", "tether")
TETHER_CONTAINER_SHELL = env_list("TETHER_CONTAINER_SHELL", ["/bin/sh"])
# The session holder (holder/tether-holder.c, built by `make holder`): it holds local and docker shells so
# that they outlive their worker. Off, or where it was not built, shells end with their worker.
TETHER_HOLDER = env_bool("TETHER_HOLDER", True)
# Shell integration (docs/commands.md): shells Tether starts mark each command, which is kept on the record.
# Off here for every machine; a machine can turn it off for itself (machine_add --no-track-commands).
TETHER_TRACK_COMMANDS = env_bool("TETHER_TRACK_COMMANDS", True)
TETHER_HOLDER_BINARY = env_str("TETHER_HOLDER_BINARY", "") or str(BASE_DIR / "build" / "tether-holder")
# Where local holders keep their socket and exit record (one directory per session, only ours to reach);
# short, since a unix socket's path must fit in 107 bytes.
TETHER_HOLDER_DIR = env_str("TETHER_HOLDER_DIR", "") or str(DATA_DIR / "held")
# Output a holder keeps for a later owner (the worker acknowledges what its own buffer keeps).
# How long after an outcome is recorded recovery looks for a session holder its owner did not let go.
TETHER_HOLDER_SWEEP_SECONDS = env_int("TETHER_HOLDER_SWEEP_SECONDS", 30, minimum=0)
TETHER_HOLDER_RING_BYTES = env_int("TETHER_HOLDER_RING_BYTES", 1024 * 1024, minimum=2 * 128 * 1024)
TETHER_AUTO_RESET = env_bool("TETHER_AUTO_RESET", True)
TETHER_SESSIONS_PER_USER = env_int("TETHER_SESSIONS_PER_USER", 5, minimum=1)
# Unacknowledged output a viewer may have in flight before the worker stops reading the process.
# Every unacknowledged byte must still be in the buffer (one 64 KiB read may overshoot), or a reconnect
# would find a gap it need not have had.
TETHER_FLOW_HIGH_BYTES = env_int(
    "TETHER_FLOW_HIGH_BYTES", TETHER_BUFFER_BYTES - 64 * 1024, minimum=4096, maximum=TETHER_BUFFER_BYTES - 64 * 1024
)
TETHER_FLOW_LOW_BYTES = env_int("TETHER_FLOW_LOW_BYTES", TETHER_FLOW_HIGH_BYTES // 3, minimum=0)
# Unacknowledged output across all of a worker's viewers, shared out among the sessions streaming at
# once (at least 4 KiB each): everything in flight queues in the pipes every session shares (Redis,
# daphne), so this bounds how long a keystroke's echo can wait behind other sessions' output
# (docs/benchmarks.md). One streaming session still gets its whole window.
TETHER_FLOW_WORKER_BYTES = env_int("TETHER_FLOW_WORKER_BYTES", 512 * 1024, minimum=4096)
# How long a departed viewer's flow window holds the output for it (a reconnect within it has no gap).
TETHER_RECONNECT_GRACE_SECONDS = env_int("TETHER_RECONNECT_GRACE_SECONDS", 60, minimum=0)
# A browser sending more bad frames than this within 10 s is closed with 4008.
TETHER_STRIKE_LIMIT = env_int("TETHER_STRIKE_LIMIT", 50, minimum=1)
# Host shells (local, tmux) are for staff unless this allows everyone.
TETHER_HOST_SHELLS_FOR_ALL = env_bool("TETHER_HOST_SHELLS_FOR_ALL", False)
# The host this process runs on, as workers report it and local/tmux machines name it: a worker runs, adopts and
# inspects only its own host's local and tmux processes (same name, same process table).
TETHER_HOST = env_str("TETHER_HOST", "") or socket.gethostname()
# Test-only: named points where a worker kills itself (SIGKILL), to put a crash exactly there (terminals.faults).
TETHER_FAULT_POINTS = env_list("TETHER_FAULT_POINTS", [])
# Every worker looks for processes whose owner died at start and then this often (adopt, read back, or unknown).
TETHER_RECOVERY_SECONDS = env_int("TETHER_RECOVERY_SECONDS", 30, minimum=1)
# A connected viewer checks this often that its session's owner is the one it attached to (or re-attaches).
TETHER_VIEWER_CHECK_SECONDS = env_int("TETHER_VIEWER_CHECK_SECONDS", 5, minimum=1)
# A closed session's final screen and output are kept this long; then cleanup_terminals removes them.
TETHER_RETENTION_HOURS = env_int("TETHER_RETENTION_HOURS", 24, minimum=1)
# Recordings (docs/recordings.md): every session's output as asciicast v3, on by default; keys typed only when
# TETHER_RECORD_INPUT is on (they can hold passwords). A recording past its size bound (bytes of events) is cut,
# saying where; a finished one is kept this many days.
TETHER_RECORDINGS = env_bool("TETHER_RECORDINGS", True)
TETHER_RECORD_INPUT = env_bool("TETHER_RECORD_INPUT", False)
TETHER_RECORDING_MAX_BYTES = env_int("TETHER_RECORDING_MAX_BYTES", 64 * 1024 * 1024, minimum=4096)
TETHER_RECORDING_RETENTION_DAYS = env_int("TETHER_RECORDING_RETENTION_DAYS", 30, minimum=1)
# How often a worker writes what its shells' recordings took (a worker killed loses at most this much).
TETHER_RECORDING_FLUSH_SECONDS = env_int("TETHER_RECORDING_FLUSH_SECONDS", 2, minimum=1)
# Share links (docs/recordings.md): how long a new one lasts by default, and at most.
TETHER_SHARE_LINK_SECONDS = env_int("TETHER_SHARE_LINK_SECONDS", 3600, minimum=60)
TETHER_SHARE_LINK_MAX_SECONDS = env_int("TETHER_SHARE_LINK_MAX_SECONDS", 7 * 24 * 3600, minimum=60)
# The HTTP API (docs/api.md): calls a token may make per minute, how long a new token lasts by default and
# at most (days), the largest request body, and the longest an await or a read may wait for news.
TETHER_API_CALLS_PER_MINUTE = env_int("TETHER_API_CALLS_PER_MINUTE", 600, minimum=1)
TETHER_API_TOKEN_DAYS = env_int("TETHER_API_TOKEN_DAYS", 30, minimum=1)
TETHER_API_TOKEN_MAX_DAYS = env_int("TETHER_API_TOKEN_MAX_DAYS", 365, minimum=1)
TETHER_API_MAX_WAIT_SECONDS = env_int("TETHER_API_MAX_WAIT_SECONDS", 60, minimum=1)
# The longest one output stream (Server-Sent Events) stays open; its client reconnects with Last-Event-ID.
TETHER_API_STREAM_SECONDS = env_int("TETHER_API_STREAM_SECONDS", 600, minimum=1)
# The largest file (or tar) one upload may send through the API (files/api.py).
TETHER_FILE_MAX_BYTES = env_int("TETHER_FILE_MAX_BYTES", 256 * 1024 * 1024, minimum=1)
# The largest request body anywhere (Django refuses a larger one): an API submit or input is well under it.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("TETHER_MAX_REQUEST_BYTES", 1024 * 1024, minimum=128 * 1024)
# The worker runs inside the web process in embedded mode (make run).
TETHER_EMBEDDED_WORKER = env_bool("TETHER_EMBEDDED_WORKER", not PRODUCTION)
