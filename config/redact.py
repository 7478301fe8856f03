"""No secret in a log: share-link tokens (they are in the link's path), API tokens, and bearer or session values
are cut out of every log line, access-log line and traceback before it is written (docs/access.md)."""

from __future__ import annotations

import logging
import re
import traceback

HIDDEN = "[redacted]"
access = logging.getLogger("daphne.access")
_SECRETS = [
    # A share link's token is the path segment after /shares/ (pages, casts, sockets: /ws/shares/TOKEN/).
    (re.compile(r"(/shares/)(?!\d+/revoke)[A-Za-z0-9_-]{16,200}"), rf"\1{HIDDEN}"),
    # ... and URL-encoded, as in a login page's ?next=%2Fshares%2FTOKEN%2F
    (re.compile(r"(?i)(%2Fshares%2F)(?!\d+%2Frevoke)[A-Za-z0-9_-]{16,200}"), rf"\1{HIDDEN}"),
    (re.compile(r"tether_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}"), f"tether_{HIDDEN}"),  # an API token
    (re.compile(r"(?i)(bearer\s+)[^\s'\",]+"), rf"\1{HIDDEN}"),
    # OpenID Connect's callback carries a one-time code (and state) in its query: a code read from a log before
    # it is used signs its reader in. Tokens in any query, whatever their form.
    (re.compile(r"(/sso/callback/?\?)[^\s\"']+"), rf"\1{HIDDEN}"),
    (re.compile(r"(?i)([?&](?:id_token|access_token|refresh_token|token)=)[^\s&\"'#]+"), rf"\1{HIDDEN}"),
    (re.compile(r"(?i)((?:sessionid|csrftoken|password|secret)[\"']?\s*[=:]\s*[\"']?)[^\s'\",&;]+"), rf"\1{HIDDEN}"),
]


def redact(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """On a handler: every record it writes, message and traceback, with secrets cut out."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its message: kept as it is
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def redact_daphne_access_log() -> None:
    """daphne writes its access log itself (not through logging): its lines are redacted the same way, and with
    ``TETHER_LOG_FORMAT=json`` they go through logging (``daphne.access``), one JSON line each like the rest."""
    from daphne.access import AccessLogGenerator

    if getattr(AccessLogGenerator.write_entry, "redacted", False):
        return
    write_entry = AccessLogGenerator.write_entry

    def redacted(self, host, date, request, status=None, length=None, ident=None, user=None):
        from django.conf import settings

        request = redact(request)
        if settings.TETHER_LOG_FORMAT == "json":  # one stream of JSON lines, the access log's too
            access.info("%s %s %s %s", host, request, status or "-", length or "-")
            return None
        return write_entry(self, host, date, request, status, length, ident, user)

    redacted.redacted = True
    AccessLogGenerator.write_entry = redacted
