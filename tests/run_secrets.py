"""Every secret a test run makes, remembered as a hash, and every log the run wrote searched for each of them
(tests/after_run/test_no_secret_in_the_runs_logs.py, which `make test` runs after everything else).

What is remembered, after each test that used the database and before its rows are gone: the API tokens and
share links it made (the database keeps only their SHA-256, which is all the search needs), the holders'
secrets, the login sessions' keys, and the passwords the tests give their people (``NAME-password``); and
what a test names itself with :func:`remember` (an OIDC client secret, a metrics token). Only hashes are
written, so the record is no secret either.

The logs: every server the tests start writes into ``TETHER_TEST_LOGS`` (daphne with its access log, workers,
the hosts harness), and every test process copies its own log records there through the same handler
settings (and redaction) as its console.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = Path(os.environ.get("TETHER_TEST_LOGS", ROOT / "build" / "test-logs"))
SECRETS = Path(os.environ.get("TETHER_TEST_SECRETS", ROOT / "build" / "test-secrets"))
_seen: set[tuple[str, int, str]] = set()
ALPHABET = rb"[A-Za-z0-9_-]"  # of every secret Tether makes (base64url, hex, names)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _write(kind: str, length: int, digest: str) -> None:
    if (kind, length, digest) in _seen:
        return
    _seen.add((kind, length, digest))
    SECRETS.mkdir(parents=True, exist_ok=True)
    name = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.txt"
    with open(SECRETS / name, "a") as out:
        out.write(f"{kind.replace(' ', '_')} {length} {digest}\n")


def remember(kind: str, secret: str) -> None:
    """A secret this test process knows in plain (it is never written, only its hash)."""
    if secret:
        _write(kind, len(secret), _digest(secret))


def remember_from_the_database() -> None:
    """What the database holds now: called before a test's rows are rolled back or flushed."""
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.models import Session

    from api.models import ApiToken
    from recordings.models import ShareLink
    from terminals.models import ProcessLease

    for digest in ApiToken.objects.values_list("digest", flat=True):
        _write("API token", 63, digest)  # tether_ + 12 hex + _ + 43 base64url: api/tokens.py
    for digest in ShareLink.objects.values_list("token_hash", flat=True):
        _write("share link", 43, digest)  # secrets.token_urlsafe(32): recordings/actions/shares.py
    for handle in ProcessLease.objects.exclude(handle={}).values_list("handle", flat=True):
        holder = (handle or {}).get("holder") or {}
        if isinstance(holder, dict) and isinstance(holder.get("secret"), str):
            remember("holder secret", holder["secret"])
    for key in Session.objects.values_list("session_key", flat=True):
        remember("login session", key)
    for username in get_user_model().objects.values_list("username", flat=True):
        remember("password", f"{username}-password")


def remembered() -> dict[int, dict[str, str]]:
    """{length: {digest: kind}} of every secret the run remembered, in every test process."""
    found: dict[int, dict[str, str]] = {}
    for path in sorted(SECRETS.glob("*.txt")):
        for line in path.read_text().splitlines():
            kind, length, digest = line.split()
            found.setdefault(int(length), {})[digest] = kind.replace("_", " ")
    return found


def search(text: bytes, secrets: dict[int, dict[str, str]]) -> list[tuple[str, int]]:
    """(kind, line number) of every remembered secret in ``text``: each run of the secrets' alphabet is
    hashed whole and in every window of a remembered length, so a secret is found in any setting (a path,
    a query, a header, a traceback, URL-encoded after %2F), not only where the redaction looks."""
    hits = []
    runs = re.compile(ALPHABET + b"{%d,}" % min(secrets, default=1))
    for number, line in enumerate(text.split(b"\n"), 1):
        for run in runs.findall(line):
            for length, digests in secrets.items():
                for start in range(len(run) - length + 1):
                    kind = digests.get(hashlib.sha256(run[start : start + length]).hexdigest())
                    if kind:
                        hits.append((kind, number))
    return hits
