"""The API answers as its schema says, checked by schemathesis against daphne and a real worker (issue 42): for every
operation, generated calls (valid and not) get a documented status with a documented body and content type, never
a server error, and every refusal is `application/problem+json`. Bounded: a fixed number of examples per
operation, derandomized, so a run takes the same time and finds the same things."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.management import call_command
from hypothesis import HealthCheck, settings

from api.api import api
from tests.bridge.harness import Stack, start_container
from tests.browser.conftest import committed

# The database marker makes the test database (the servers use it); what they need is committed on a connection of
# its own (tests/browser/conftest.py's ``committed``) and flushed when the module ends.
pytestmark = [pytest.mark.bridge, pytest.mark.django_db]

SCHEMA = schemathesis.openapi.from_dict(api.get_openapi_schema())
EXAMPLES = 50


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """One daphne + worker, a docker workspace (the commands generated run in a container without a network,
    never on this host) that a user may use, and that user's token of every scope."""
    name, error = start_container()
    assert name is not None, f"dockerd or the test image is not available: {error}"
    stack = Stack(extra_env={"TETHER_API_STREAM_SECONDS": "2"})  # an output stream generated here ends soon
    try:
        stack.start(backends="docker")

        def make():
            from django.contrib.auth import get_user_model

            from api.tokens import create_token
            from executions.actions import Actor, add_machine
            from tests.factories import grant

            user = get_user_model().objects.create_user(username="fuzz", password="fuzz-password")
            machine = add_machine(name="fuzz-box", backend="docker", ref=name, actor=Actor.command("tests"))
            grant(user, machine, "operate")
            return create_token(user, name="schemathesis", scopes=["read", "run", "terminals"])[1]

        with django_db_blocker.unblock():
            raw = committed(make)
        yield f"http://127.0.0.1:{stack.ports[0]}", {"Authorization": f"Bearer {raw}"}, stack
    finally:
        stack.stop()
        import subprocess

        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_its_schema_says(case, world):
    base_url, headers, _ = world
    case.call_and_validate(base_url=base_url, headers=headers, timeout=90)


def test_no_traceback_in_the_servers_logs(world):
    """After the calls above (this runs after them in the module): nothing the servers logged is a traceback."""
    _, _, stack = world
    logs = {path.name: path.read_text(errors="replace") for path in stack.log_dir.glob(f"{stack.prefix}-*.log")}
    assert logs, "the servers wrote no log"
    found = [name for name, text in logs.items() if "Traceback (most recent call last)" in text]
    assert not found, {name: logs[name][logs[name].index("Traceback") :][:2000] for name in found}
