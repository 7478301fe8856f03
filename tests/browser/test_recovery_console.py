"""The recovery procedure in the admin, in Chromium, against real daphne, workers, tmux and PTYs: drain a worker
and see its tmux shell adopted by another; the dry run of a recovery pass, which changes nothing, then Run
recovery; the unknown outcomes queue naming the check that fails until the operator has done what it says."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from playwright.async_api import Page, expect

from executions import actions as exec_actions
from executions.actions import add_machine
from executions.models import Evidence, Execution, State
from terminals import actions
from terminals.backends.procfs import MARKER_VARIABLE, ProcessIdentity, boot_id
from terminals.models import ProcessLease, WorkerEvent, WorkerState, lease_expired
from tests.bridge.harness import wait_for
from tests.browser.conftest import SCREENSHOTS, committed
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

# Shells the workers here hold die with them unless tmux keeps them: a dead worker leaves something unknown.
STACK_ENV = {"TETHER_HOLDER": "0"}
OPERATOR_PERMISSIONS = [
    "view_worker", "drain_worker", "run_recovery", "view_execution", "resolve_execution", "view_terminalsession",
]  # fmt: skip


@pytest.fixture(scope="module")
def console(stack, django_db_blocker):
    """This module's pages, without the module's own worker: every worker here is one a test starts, kills or
    drains, and none recovers behind the tests' backs."""
    for worker in stack.workers:
        worker.terminate()
        worker.wait()
    stack.workers.clear()

    def create() -> None:
        ops = get_user_model().objects.create_user(username="ops", password="ops-password", is_staff=True)
        ops.user_permissions.set(Permission.objects.filter(codename__in=OPERATOR_PERMISSIONS))

    with django_db_blocker.unblock():
        committed(create)
    return stack


async def admin_page(browser, base_url) -> tuple[object, Page]:
    context = await browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto("/admin/login/")
    await page.fill("#id_username", "ops")
    await page.fill("#id_password", "ops-password")
    await page.click("input[type=submit]")
    await expect(page.locator("#user-tools")).to_contain_text("ops")
    return context, page


def open_shell(machine_name: str):
    """A terminal session on the machine, as its user opens it (the user: the module's staff operator)."""
    machine = exec_actions.get_machine(machine_name)
    user = get_user_model().objects.get(username="operator")
    return actions.open_terminal(machine, user)[0]


def held_by(execution_pk: int):
    leases = ProcessLease.objects.select_related("worker").filter(execution_id=execution_pk, released_at__isnull=True)
    return leases.first()


async def test_drain_a_worker_from_the_admin_and_its_tmux_shell_is_adopted_by_another(
    console, browser, base_url, tmux_socket
):
    first = console.start_worker("tmux")
    committed(add_machine, name="drain-box", backend="tmux", ref=tmux_socket, scope="team-a", actor=TEST_ACTOR)
    session = committed(open_shell, "drain-box")
    lease = wait_for(lambda: committed(held_by, session.execution_id), what="the shell held")
    assert lease.worker.pid == first.pid
    second = console.start_worker("tmux")
    context, page = await admin_page(browser, base_url)
    try:
        await page.goto("/admin/terminals/worker/")
        row = page.locator("#result_list tr", has_text=lease.worker.worker_id)
        await expect(row).to_contain_text("running")
        await expect(row.locator(".field-sessions")).to_have_text("1")
        await row.locator('input[name="_selected_action"]').check()
        await page.select_option('select[name="action"]', "drain_workers")
        await page.click('button[name="index"]')
        await page.fill("#id_reason", "browser test: host maintenance")
        await page.click('input[type=submit][value="Yes, I\'m sure"]')
        # The progress page refreshes itself until the worker has stopped, then says what became of its shell.
        await expect(page.locator("#drain-state")).to_have_text("stopped", timeout=30_000)
        await expect(page.locator("#drain-left, #drain-adopted")).to_contain_text("terminal-", timeout=30_000)
        adopted = wait_for(
            lambda: (lease := committed(held_by, session.execution_id)) and lease.worker.pid == second.pid and lease,
            what="the shell adopted by the other worker",
        )
        assert adopted.token > lease.token
        # Stopped is not the end: the page goes on refreshing by itself until the shell it left is adopted.
        await expect(page.locator("#drain-adopted")).to_contain_text(adopted.worker.worker_id[:12], timeout=10_000)
        await expect(page.locator("#drain-progress")).to_contain_text("every shell it left has been adopted")
        await expect(page.locator("#drain-progress")).not_to_have_attribute("hx-trigger", "every 1s")
        if SCREENSHOTS:
            await page.screenshot(path=SCREENSHOTS / "admin-drain.png", full_page=True)
        assert first.wait(timeout=10) == 0  # it stopped by itself
    finally:
        await context.close()
        for worker in console.workers:
            worker.terminate()
            worker.wait(timeout=30)


async def test_the_dry_run_lists_a_dead_workers_shells_changes_nothing_then_run_recovery_records_them(
    console, browser, base_url, tmux_socket
):
    owner = console.start_worker("local,tmux")
    committed(add_machine, name="lost-box", backend="local", scope="team-a", actor=TEST_ACTOR)
    committed(add_machine, name="kept-box", backend="tmux", ref=tmux_socket, scope="team-a", actor=TEST_ACTOR)
    lost, kept = committed(open_shell, "lost-box"), committed(open_shell, "kept-box")
    for session in (lost, kept):  # started, not only claimed
        wait_for(lambda s=session: committed(lambda: Execution.objects.get(pk=s.execution_id).state) == State.RUNNING)
    leases = [committed(held_by, session.execution_id) for session in (lost, kept)]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    wait_for(lambda: committed(all_expired, [lost.execution_id, kept.execution_id]), what="its leases expired")
    context, page = await admin_page(browser, base_url)
    try:
        await page.goto("/admin/terminals/worker/")
        await expect(page.locator("#result_list")).to_contain_text("presumed dead")
        await page.click("#recovery-link")
        plan = page.locator("#recovery-plan")
        for session, action in ((lost, "unknown"), (kept, "adopt")):
            row = plan.locator(f'tr[data-label="team-a/{session.execution.execution_id}"]')
            await expect(row).to_have_attribute("data-action", action)
        await expect(plan).to_contain_text("a live worker serving tmux")
        # The dry run changed nothing: the same leases, tokens and states.
        assert [committed(held_by, s.execution_id).token for s in (lost, kept)] == [lease.token for lease in leases]
        states = {committed(lambda s=s: Execution.objects.get(pk=s.execution_id).state) for s in (lost, kept)}
        assert states == {State.RUNNING}
        if SCREENSHOTS:
            await page.screenshot(path=SCREENSHOTS / "admin-recovery.png", full_page=True)
        await page.click("#run-recovery")
        await page.click("#run-recovery-confirm")
        await expect(page.locator("#recovery-done")).to_contain_text("unknown (controller_lost)")
        ran = committed(
            lambda: WorkerEvent.objects.filter(reason__startswith="recovery pass").select_related("user").get()
        )
        assert ran.user.username == "ops" and any("unknown" in line for line in ran.detail["done"])
        lost_execution = committed(lambda: Execution.objects.get(pk=lost.execution_id))
        assert (lost_execution.state, lost_execution.evidence) == (State.UNKNOWN, Evidence.CONTROLLER_LOST)
        # The tmux shell is left for a live worker to adopt: still running, its lease untouched.
        assert committed(lambda: Execution.objects.get(pk=kept.execution_id).state) == State.RUNNING
        assert committed(held_by, kept.execution_id).token == leases[1].token
        await expect(page.locator("#recovery-plan")).to_contain_text("adopt")
    finally:
        await context.close()


def all_expired(execution_pks: list[int]) -> bool:
    """On the database's clock, as recovery judges it."""
    live = ProcessLease.objects.filter(execution_id__in=execution_pks, released_at__isnull=True).exclude(
        pk__in=ProcessLease.objects.filter(lease_expired()).values("pk")
    )
    return not live.exists()


def _unknown_with_a_child_left(dead_worker_pk: int, marker: str, leader: dict) -> Execution:
    """An execution its dead owner's recovery left unknown, one of whose children still runs (as a child that
    ignores SIGHUP outlives its program)."""
    from terminals.models import Worker

    worker = Worker.objects.get(pk=dead_worker_pk)
    machine = add_machine(name=f"leftover-{uuid.uuid4().hex[:6]}", backend="local", scope="team-a", actor=TEST_ACTOR)
    exec_actions.submit_execution(
        scope="team-a", execution_id=f"leftover-{machine.name}", machine_name=machine.name, spec=make_spec("true"),
        actor=TEST_ACTOR,
    )  # fmt: skip
    execution, lease = actions.claim_next_execution(worker, {"local"})
    actions.save_handle(execution.pk, worker, lease.token, {"backend": "local", "process": leader, "marker": marker})
    return actions.fenced_transition(
        execution, State.UNKNOWN, worker=worker, token=lease.token, evidence=Evidence.CONTROLLER_LOST
    )


async def test_the_unknowns_queue_names_the_failing_check_and_then_lets_it_be_resolved(console, browser, base_url):
    gone = subprocess.Popen(["true"])
    leader = ProcessIdentity.of(gone.pid)
    gone.wait()
    dead = committed(
        actions.register_worker, worker_id=uuid.uuid4().hex, host=settings.TETHER_HOST, pid=leader.pid,
        started_at=leader.start_time, boot_id=boot_id(), channel_name="",
    )  # fmt: skip
    committed(lambda: type(dead).objects.filter(pk=dead.pk).update(state=WorkerState.STOPPED))
    marker = f"leftover-{uuid.uuid4().hex}"
    child = subprocess.Popen(["sleep", "300"], env={**os.environ, MARKER_VARIABLE: marker}, start_new_session=True)
    try:
        execution = committed(_unknown_with_a_child_left, dead.pk, marker, leader.to_json())
        context, page = await admin_page(browser, base_url)
        try:
            await page.goto("/admin/terminals/worker/unknowns/")
            row = page.locator(f'tr[data-execution="{execution.execution_id}"]')
            await expect(row.locator(".check-process")).to_have_attribute("data-ok", "no")
            await expect(row.locator(".check-process")).to_contain_text("still run")
            await expect(row.locator(".next-process")).to_contain_text("end the processes named")
            if SCREENSHOTS:
                await page.screenshot(path=SCREENSHOTS / "admin-unknowns.png", full_page=True)
            await expect(row.locator(".check-owner")).to_have_attribute("data-ok", "yes")
            # The operator does what it says: ends the child. Checked again, nothing fails but the note.
            child.kill()
            child.wait()
            await page.reload()
            await expect(row.locator(".check-process")).to_have_attribute("data-ok", "yes")
            await expect(row.locator(".ready")).to_be_visible()
            await row.locator("a.resolve").click()
            await page.fill("#id_note", "the leftover sleep was killed; nothing of it runs")
            await page.click('input[type=submit][value="Check again and resolve"]')
            await expect(page.locator(".messagelist")).to_contain_text("resolved")
            resolved = committed(lambda: Execution.objects.select_related("resolved_by").get(pk=execution.pk))
            assert resolved.state == State.RESOLVED and resolved.resolved_by.username == "ops"
            await page.goto("/admin/terminals/worker/unknowns/")
            await expect(page.locator(f'tr[data-execution="{execution.execution_id}"]')).to_have_count(0)
        finally:
            await context.close()
    finally:
        if child.poll() is None:
            child.kill()
