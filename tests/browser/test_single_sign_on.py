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
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.async_api import Page, expect

from executions.actions import Actor, add_machine, set_labels
from tests import run_secrets
from tests.bridge.harness import ROOT, free_port
from tests.browser.conftest import committed
from tests.factories import grant

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module"), pytest.mark.django_db]

PROVIDER_PORT = free_port()
ISSUER = f"http://127.0.0.1:{PROVIDER_PORT}"
CONFIG = Path(f"/tmp/tether-test-oidc-{PROVIDER_PORT}.json")
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


def write_config(base_url: str, accounts: dict) -> None:
    client = {
        "client_id": STACK_ENV["TETHER_OIDC_CLIENT_ID"],
        "client_secret": STACK_ENV["TETHER_OIDC_CLIENT_SECRET"],
        "redirect_uris": [f"{base_url}/sso/callback/"],
        "post_logout_redirect_uris": [f"{base_url}/"],
    }
    CONFIG.write_text(json.dumps({"clients": [client], "accounts": accounts}))


@pytest.fixture(scope="module")
def provider(stack):
    write_config(f"http://127.0.0.1:{stack.ports[0]}", ACCOUNTS)
    run_secrets.remember("OIDC client secret", STACK_ENV["TETHER_OIDC_CLIENT_SECRET"])
    process = subprocess.Popen(
        ["node", str(ROOT / "tests" / "sso" / "provider.mjs"), str(PROVIDER_PORT), str(CONFIG)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TETHER_TEST_SECRETS": str(run_secrets.SECRETS)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "ready" not in (line := process.stdout.readline()):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the OpenID provider did not start: {line}{process.stdout.read()}")
        yield ISSUER
    finally:
        process.kill()
        process.wait()
        CONFIG.unlink(missing_ok=True)


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


async def sign_in(page: Page, login: str) -> None:
    """Tether's log-in page → the provider's login and consent (when its session does not have them already) →
    back to Tether (the provider's own pages, as a person sees them)."""
    await page.goto("/")
    await page.click("#sso-start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        await page.wait_for_load_state()
        if not page.url.startswith(ISSUER):
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
