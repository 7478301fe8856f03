"""An upload's size is checked before Django reads its body: Django reads a request's whole body (to a
temporary file past a few MB) before any view or middleware runs. Daphne has received the body by then (it
takes a request whole before the application sees it, in memory): TETHER_FILE_MAX_BYTES bounds what that can
be for an upload, and the proxy in front bounds every request (deploy/nginx.conf, deploy/haproxy.cfg)."""

from __future__ import annotations

import re

from django.conf import settings

from api.problems import ApiProblem, send_problem
from transport.origins import header_of

UPLOAD = re.compile(r"^/api/v1/machines/[^/]+/files/content/?$")
RAW_TYPES = frozenset({"application/octet-stream", "application/x-tar"})  # the bodies an upload takes


def is_upload(method: str, path: str) -> bool:
    return method == "PUT" and UPLOAD.match(path) is not None


def _length(scope) -> int | None:
    said = header_of(scope, b"content-length")
    return (int(said) if said.isascii() and said.isdigit() else -1) if said else None


def limit_uploads(http_app):
    async def app(scope, receive, send):
        if scope["type"] == "http" and is_upload(scope.get("method", ""), scope.get("path", "")):
            length, limit = _length(scope), settings.TETHER_FILE_MAX_BYTES
            if length is None or length < 0:
                problem = ApiProblem("invalid_request", "send the upload with its Content-Length")
            elif length > limit:
                problem = ApiProblem("too_large", f"at most {limit} bytes a file", limit=limit)
            else:
                return await http_app(scope, receive, send)
            return await send_problem(send, problem, (b"connection", b"close"))
        return await http_app(scope, receive, send)

    return app
