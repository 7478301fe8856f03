"""Single sign-on end to end, in Chromium, against a real OpenID Connect provider started here (node's
oidc-provider: its own login and consent pages, the real redirect, code, token and userinfo exchange; nothing of
the client is mocked). Groups come from the provider's claim at every sign-in; a person taken out of the team
there loses the team's workspaces at their next sign-in; when the provider's session ends, Tether's does too; a
claim of the wrong type, a missing one, or a code used twice refuses the sign-in with a clear page and creates
no one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import jwt
import pytest
from asgiref.sync import sync_to_async
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from jwt.algorithms import RSAAlgorithm
from playwright.async_api import Page, expect

from executions.actions import Actor, add_machine, set_labels
from tests import run_secrets
from tests.bridge.harness import ROOT, free_port
from tests.browser.conftest import committed
from tests.factories import grant

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module"), pytest.mark.django_db]

PROVIDER_PORT, OTHER_PORT = free_port(), free_port()
ISSUER, OTHER = f"http://127.0.0.1:{PROVIDER_PORT}", f"http://127.0.0.1:{OTHER_PORT}"
CONFIG = Path(f"/tmp/tether-test-oidc-{PROVIDER_PORT}.json")
OTHER_CONFIG = Path(f"/tmp/tether-test-oidc-{OTHER_PORT}.json")
# The provider signs with a key made here, so that a test can sign what a provider would send in cases a real one
# will not produce on request: a token for another application, an expired one (its clock behind Tether's).
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
JWK = {**json.loads(RSAAlgorithm.to_jwk(KEY)), "kid": "tests", "alg": "RS256", "use": "sig"}
STACK_ENV = {
    "TETHER_OIDC_ISSUER": ISSUER,
    "TETHER_OIDC_NAME": "Example SSO",
    "TETHER_OIDC_CLIENT_ID": "tether",
    "TETHER_OIDC_CLIENT_SECRET": "tether-test-client-secret-0123456789",
    "TETHER_OIDC_GROUP_MAP": "eng-payments=payments",
    "TETHER_OIDC_SESSION_SECONDS": "3",
}
ACCOUNTS = {
    "carol": {"preferred_username": "carol", "email": "carol@example.test", "groups": ["eng-payments", "all-staff"]},
    "dave": {"preferred_username": "dave", "email": "dave@example.test", "groups": "eng-payments"},  # not a list
    "erin": {"preferred_username": "erin", "email": "erin@example.test"},  # no groups claim at all
}


def write_config(base_url: str, accounts: dict, path: Path = CONFIG, jwks: bool = True) -> None:
    client = {
        "client_id": STACK_ENV["TETHER_OIDC_CLIENT_ID"],
        "client_secret": STACK_ENV["TETHER_OIDC_CLIENT_SECRET"],
        "redirect_uris": [f"{base_url}/sso/callback/"],
        "post_logout_redirect_uris": [f"{base_url}/"],
    }
    config = {"clients": [client], "accounts": accounts, **({"jwks": {"keys": [JWK]}} if jwks else {})}
    path.write_text(json.dumps(config))


@contextmanager
def running_provider(port: int, config: Path):
    process = subprocess.Popen(
        ["node", str(ROOT / "tests" / "sso" / "provider.mjs"), str(port), str(config)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TETHER_TEST_SECRETS": str(run_secrets.SECRETS)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "ready" not in (line := process.stdout.readline()):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the OpenID provider did not start: {line}{process.stdout.read()}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()
        config.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def provider(stack):
    write_config(f"http://127.0.0.1:{stack.ports[0]}", ACCOUNTS)
    run_secrets.remember("OIDC client secret", STACK_ENV["TETHER_OIDC_CLIENT_SECRET"])
    with running_provider(PROVIDER_PORT, CONFIG) as issuer:
        yield issuer


@pytest.fixture(scope="module")
def other_provider(stack):
    """Another provider (its own keys) where Tether's client is registered too, with a person only it knows."""
    frank = {"preferred_username": "frank", "email": "frank@example.test", "groups": ["eng-payments"]}
    write_config(f"http://127.0.0.1:{stack.ports[0]}", {"frank": frank}, OTHER_CONFIG, jwks=False)
    with running_provider(OTHER_PORT, OTHER_CONFIG) as issuer:
        yield issuer


@pytest.fixture(scope="module")
def team_box(stack, django_db_blocker):
    """The payments team's workspace (label team=payments), used by the group the provider's claim maps to."""

    def make():
        machine = add_machine(name="pay-box", backend="docker", ref="tether-test-pay-box", actor=Actor.command("tests"))
        set_labels(machine, {"team": "payments"}, actor=Actor.command("tests"))
        grant(Group.objects.get_or_create(name="payments")[0], "team=payments", "use")

    with django_db_blocker.unblock():
        committed(make)
    return "pay-box"


async def sign_in(page: Page, login: str, *, started: bool = False, at: str = ISSUER) -> None:
    """Tether's log-in page → the provider's login and consent (when its session does not have them already) →
    back to Tether (the provider's own pages, as a person sees them)."""
    if not started:
        await page.goto("/")
        await page.click("#sso-start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        await page.wait_for_load_state()
        if not page.url.startswith(at):
            return  # back at Tether (signed in, or refused)
        if await page.locator("input[name=login]").count():
            await page.fill("input[name=login]", login)
            await page.fill("input[name=password]", "any password: the provider's development login")
            await page.click("button[type=submit]")
        elif await page.locator("button[type=submit]:has-text('Continue')").count():
            await page.click("button[type=submit]:has-text('Continue')")
        else:
            await page.wait_for_timeout(100)
    raise AssertionError(f"the sign-in did not come back from the provider: {page.url}")


def user_named(name: str):
    return committed(lambda: get_user_model().objects.filter(username=name).first())


def groups_of(name: str) -> list[str]:
    return committed(lambda: sorted(get_user_model().objects.get(username=name).groups.values_list("name", flat=True)))


async def test_a_team_signs_in_with_the_provider_and_loses_the_workspaces_it_leaves(
    context, provider, team_box, base_url
):
    page = await context.new_page()
    await sign_in(page, "carol")
    await expect(page.locator("h1")).to_have_text("My workspaces")
    row = page.locator(f'tr[data-machine="{team_box}"]')
    await expect(row).to_contain_text("use")  # through the payments group, synced from the claim
    assert groups_of("carol") == ["payments"]  # mapped; all-staff is not in the map
    from sso.models import Identity

    assert committed(lambda: Identity.objects.get(user__username="carol").subject) == "carol"

    # At the provider, carol leaves the team; her next sign-in takes the group (and the workspace) away.
    write_config(base_url, {**ACCOUNTS, "carol": {**ACCOUNTS["carol"], "groups": ["all-staff"]}})
    await page.click("form[action='/accounts/logout/'] button")
    await sign_in(page, "carol")
    await expect(page.locator("h1")).to_have_text("My workspaces")
    await expect(page.locator(f'tr[data-machine="{team_box}"]')).to_have_count(0)
    assert groups_of("carol") == []

    # Back in the team; then her provider session ends: Tether's ends at the next look once its time is up.
    write_config(base_url, ACCOUNTS)
    await page.click("form[action='/accounts/logout/'] button")
    await sign_in(page, "carol")
    await expect(page.locator(f'tr[data-machine="{team_box}"]')).to_have_count(1)
    await page.goto(f"{ISSUER}/session/end")
    await page.click("button[type=submit], input[type=submit]")  # "Yes, sign me out"
    await page.wait_for_timeout(3500)  # TETHER_OIDC_SESSION_SECONDS
    await page.goto(f"{base_url}/")
    await page.goto(f"{base_url}/")
    await expect(page).to_have_url(re.compile(r"/accounts/login/"))


@pytest.mark.parametrize(
    ("login", "said"),
    [("dave", "'groups' claim is not a list of names"), ("erin", "sent no 'groups' claim")],
)
async def test_a_claim_of_the_wrong_type_or_a_missing_one_refuses_the_sign_in_and_creates_no_one(
    context, provider, login, said
):
    page = await context.new_page()
    await sign_in(page, login)
    await expect(page.locator("h1")).to_have_text("Sign-in refused")
    await expect(page.locator("#sso-failure")).to_contain_text(said)
    assert user_named(login) is None


async def test_a_code_used_twice_is_refused_with_a_clear_page(context, provider, base_url):
    page = await context.new_page()
    callbacks: list[str] = []
    page.on("request", lambda request: callbacks.append(request.url) if "/sso/callback/" in request.url else None)
    await sign_in(page, "carol")
    await expect(page.locator("h1")).to_have_text("My workspaces")
    await page.goto(callbacks[0])  # the provider's answer again: its code and state are spent
    await expect(page.locator("h1")).to_have_text("Sign-in refused")
    await expect(page.locator("#sso-failure")).to_contain_text("used already or has expired")


async def test_a_refused_re_check_signs_the_person_out(context, provider, team_box, base_url):
    """Taken out of every group at the provider, which then sends no groups claim: the silent re-check is
    refused, and the Tether session ends with it (it kept the team's grants before)."""
    page = await context.new_page()
    await sign_in(page, "carol")
    await expect(page.locator(f'tr[data-machine="{team_box}"]')).to_have_count(1)
    try:
        write_config(base_url, {**ACCOUNTS, "carol": {"preferred_username": "carol", "email": "carol@example.test"}})
        await page.wait_for_timeout(3500)  # TETHER_OIDC_SESSION_SECONDS: the next page re-checks
        await page.goto(f"{base_url}/")
        await expect(page.locator("h1")).to_have_text("Sign-in refused")
        await expect(page.locator("#sso-failure")).to_contain_text("sent no 'groups' claim")
        await page.goto(f"{base_url}/")
        await expect(page).to_have_url(re.compile(r"/accounts/login/"))  # signed out
    finally:
        write_config(base_url, ACCOUNTS)


async def test_an_error_answer_this_browser_did_not_ask_for_signs_nobody_out(context, provider, base_url):
    """`/sso/callback/?error=…` from a link anywhere (no sign-in of this browser's): refused, and whoever is
    signed in stays so; the text is not the link's."""
    page = await context.new_page()
    await sign_in(page, "carol")
    await expect(page.locator("h1")).to_have_text("My workspaces")
    await page.goto(f"{base_url}/sso/callback/?error=login_required&error_description=Call+0800&state=forged")
    await expect(page.locator("h1")).to_have_text("Sign-in refused")
    assert "0800" not in await page.locator("#sso-failure").text_content()
    await page.goto(f"{base_url}/")
    await expect(page.locator("h1")).to_have_text("My workspaces")


async def test_a_deactivated_person_is_signed_out_at_once(context, provider, base_url):
    page = await context.new_page()
    await sign_in(page, "carol")
    await expect(page.locator("h1")).to_have_text("My workspaces")
    users = get_user_model().objects
    committed(lambda: users.filter(username="carol").update(is_active=False))
    try:
        await page.goto(f"{base_url}/")
        await expect(page).to_have_url(re.compile(r"/accounts/login/"))  # the session was still a person's
    finally:
        committed(lambda: users.filter(username="carol").update(is_active=True))


async def test_an_answer_from_another_provider_is_refused_and_creates_no_one(context, provider, other_provider):
    """A mix-up: the browser sent on from Tether's provider to another one with the same request (an attacker's
    provider, or another the client is registered at), which signs in someone only it knows and answers Tether's
    callback with its own code and Tether's state. Tether takes the code to its own provider, which refuses it."""
    page = await context.new_page()
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url) if request.url.startswith(f"{ISSUER}/auth?") else None)
    await page.goto("/")
    await page.click("#sso-start")
    await page.wait_for_url(re.compile(rf"^{re.escape(ISSUER)}/"))
    await page.goto(asked[0].replace(ISSUER, other_provider))
    await sign_in(page, "frank", started=True, at=other_provider)
    await expect(page.locator("h1")).to_have_text("Sign-in refused")
    await expect(page.locator("#sso-failure")).to_contain_text("did not accept this sign-in")
    assert user_named("frank") is None


def signed(**claims) -> str:
    now = int(time.time())
    token = {"iss": ISSUER, "sub": "zed", "aud": "tether", "iat": now, "exp": now + 300, "nonce": "n-1", **claims}
    return jwt.encode(token, KEY, algorithm="RS256", headers={"kid": "tests"})


@pytest.mark.parametrize(
    ("claims", "said"),
    [
        ({"aud": "another-app"}, "its audience is another application"),
        ({"aud": ["another-app", "a-third"]}, "its audience is another application"),
        ({"iss": OTHER}, "came from another issuer"),
        ({"exp": int(time.time()) - 120}, "the sign-in has expired"),
        ({"nbf": int(time.time()) + 3600}, "could not be accepted"),
        ({"exp": "tomorrow"}, "verification failed"),
        ({"nonce": "another-sign-ins"}, "nonce verification failed"),
    ],
    ids=["audience", "audiences", "issuer", "expired", "not-yet", "exp-not-a-number", "nonce"],
)
async def test_an_id_token_signed_by_the_provider_but_not_for_this_sign_in_is_refused(provider, settings, claims, said):
    """What a real provider will not produce on request, signed with its key and checked through its real keys
    endpoint: a token for another application, from another issuer, expired (its clock behind Tether's), not yet
    valid, or for another sign-in. Each is refused with its reason and no one is created."""
    from sso.backend import Refused, SsoBackend

    settings.TETHER_OIDC_ISSUER, settings.TETHER_OIDC_CLIENT_ID = ISSUER, "tether"
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = "tether", STACK_ENV["TETHER_OIDC_CLIENT_SECRET"]
    settings.OIDC_RP_SIGN_ALGO = "RS256"
    backend = await sync_to_async(SsoBackend)()
    assert await sync_to_async(backend.verify_token)(signed(), nonce="n-1")  # the same, right: accepted
    ahead = int(time.time()) + 5  # a provider whose clock is 5 s ahead of Tether's: within the leeway
    assert await sync_to_async(backend.verify_token)(signed(iat=ahead, nbf=ahead), nonce="n-1")
    with pytest.raises(SuspiciousOperation) as refused:
        await sync_to_async(backend.verify_token)(signed(**claims), nonce="n-1")
    assert said in str(refused.value).lower()
    assert isinstance(refused.value, Refused) or "verification failed" in said
    assert user_named("zed") is None
