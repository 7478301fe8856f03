"""daphne's HTTP (Twisted's) refuses a request whose line or headers it cannot take with a bare
``400 Bad Request`` and no body, and a request line or header over 16 KiB (a 20 KB bearer token) the same way.
Here the limits are 64 KiB, and what is still refused is said as a problem (``application/problem+json``, as every
other refusal of Tether's is: docs/api.md)."""

from __future__ import annotations

import json

LIMIT_BYTES = 64 * 1024


def answer_bad_requests_as_problems() -> None:
    from twisted.web import http

    if getattr(http.HTTPChannel, "tether_problems", False):
        return
    http.HTTPChannel.totalHeadersSize = LIMIT_BYTES  # the request line and all headers
    http.HTTPChannel.MAX_LENGTH = LIMIT_BYTES  # one line of them

    def refuse(self) -> None:
        body = json.dumps(
            {
                "type": "https://tether.invalid/problems/invalid_request",
                "title": "The request is malformed",
                "status": 400,
                "code": "invalid_request",
                "detail": f"the request line or its headers are malformed, or more than {LIMIT_BYTES // 1024} KiB",
            }
        ).encode()
        head = (
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        self.transport.write(head + body)
        self.loseConnection()

    http.HTTPChannel._respondToBadRequestAndDisconnect = refuse
    http.HTTPChannel.tether_problems = True
