"""TLS for direct links between hosts (``tls:HOST:PORT``): what the link's own handshake does not give, secrecy on
the wire. Both ends are set up from the same three files: the worker presents ``cert`` and, when ``ca`` is given,
asks each dialling daphne for a certificate signed by it (mutual TLS); a daphne checks the worker's certificate
against ``ca`` (the system's authorities without one) and its name against the host it dials, and presents
``cert`` when it has one. The key proof of transport/link.py runs inside, as on any link."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class LinkTls:
    cert: str = ""  # PEM: this end's certificate (a worker's is required), its chain after it
    key: str = ""  # PEM: its private key
    ca: str = ""  # PEM: the authorities the other end's certificate is checked against

    @classmethod
    def of(cls, cert: str, key: str, ca: str) -> LinkTls | None:
        return cls(cert, key or cert, ca) if cert or ca else None

    @cached_property
    def server(self) -> ssl.SSLContext:
        if not self.cert:
            raise ssl.SSLError("a worker listening on tls: needs TETHER_LINK_TLS_CERT")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca or None)
        context.load_cert_chain(self.cert, self.key)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED if self.ca else ssl.CERT_NONE
        return context

    @cached_property
    def client(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context


DEFAULT = LinkTls()  # a daphne with no TLS settings dialling a tls: address: the system's authorities
