"""A production install as an operator brings it up: static files served by WhiteNoise from collectstatic, and
login behind a TLS-terminating proxy that says so in a header."""

from __future__ import annotations

import re

import pytest
import requests

from tests.bridge.harness import Stack

pytestmark = pytest.mark.django_db(transaction=True)


def login_page(base: str, headers: dict[str, str]) -> tuple[str, str]:
    """The login form's CSRF token and cookie (a Secure cookie, which requests would not send over http)."""
    page = requests.get(f"{base}/accounts/login/", headers=headers, timeout=10)
    assert page.status_code == 200, page.text[:500]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return token, page.cookies["csrftoken"]


def post_login(base: str, headers: dict[str, str], operator_password: str = "operator-password") -> requests.Response:
    token, cookie = login_page(base, headers)
    return requests.post(
        f"{base}/accounts/login/",
        data={"username": "operator", "password": operator_password, "csrfmiddlewaretoken": token},
        headers={**headers, "Cookie": f"csrftoken={cookie}"},
        allow_redirects=False,
        timeout=10,
    )


def test_static_files_are_served_hashed_compressed_and_cacheable_in_production(operator):
    stack = Stack()
    try:
        port = stack.start_daphne()
        base = f"http://127.0.0.1:{port}"
        page = requests.get(f"{base}/accounts/login/", timeout=10)
        css = re.search(r'href="(/static/dist/tether\.[0-9a-f]{12}\.css)"', page.text)
        assert css, page.text[:1500]  # a content-hashed name from the manifest
        served = requests.get(f"{base}{css.group(1)}", headers={"Accept-Encoding": "gzip"}, timeout=10)
        assert served.status_code == 200 and served.headers["Content-Encoding"] == "gzip"
        assert "immutable" in served.headers["Cache-Control"] and "max-age=315360000" in served.headers["Cache-Control"]
        script = requests.get(f"{base}/static/dist/terminal.js", timeout=10)  # the unhashed name works too
        assert script.status_code == 200 and b"tetherTerminal" in script.content
    finally:
        stack.stop()


def test_login_behind_a_tls_proxy_passes_csrf_once_the_proxy_header_is_configured(operator):
    forwarded = {"X-Forwarded-Proto": "https"}
    stack = Stack()
    try:
        plain = stack.start_daphne()
        stack.extra_env["TETHER_PROXY_SCHEME_HEADER"] = "X-Forwarded-Proto: https"
        behind_proxy = stack.start_daphne()
        # As the browser sees it: https://127.0.0.1:PORT, reached through a proxy that speaks http to daphne.
        for port, expected in ((plain, 403), (behind_proxy, 302)):
            base = f"http://127.0.0.1:{port}"
            answer = post_login(base, {**forwarded, "Origin": f"https://127.0.0.1:{port}"})
            assert answer.status_code == expected, (port, answer.status_code, answer.text[:300])
        assert answer.headers["Location"] == "/"
        assert "secure" in answer.headers["Set-Cookie"].lower()  # the session cookie is https-only
    finally:
        stack.stop()
