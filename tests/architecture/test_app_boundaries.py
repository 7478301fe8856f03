"""The apps are layered: executions (records) knows nothing of terminals (processes), which reacts to its
signals; within terminals, recovery decides and actions write. A submission wakes the owner workers only
once it has committed."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from channels.layers import get_channel_layer

from executions.models import Execution
from executions.signals import execution_submitted
from terminals.wake import WAKE_CHANNEL
from tests.factories import make_execution, make_machine, make_spec

ROOT = Path(__file__).resolve().parents[2]
EXECUTIONS = ROOT / "executions"


def _imported_modules(source: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_no_executions_module_imports_terminals():
    sources = sorted(EXECUTIONS.rglob("*.py"))
    assert len(sources) > 10  # the walk found the app (migrations, commands and all)
    upward = {
        f"{source.relative_to(EXECUTIONS.parent)}: {module}"
        for source in sources
        for module in _imported_modules(source)
        if module == "terminals" or module.startswith("terminals.")
    }
    assert not upward


def test_access_knows_nothing_of_terminals_or_the_api():
    """The decision of who may do what sits between the records and the apps that run and serve them."""
    sources = sorted((ROOT / "access").rglob("*.py"))
    assert len(sources) > 5
    upward = {
        f"{source.relative_to(ROOT)}: {module}"
        for source in sources
        for module in _imported_modules(source)
        if module.split(".")[0] in {"terminals", "api"}
    }
    assert not upward


APPS = {"access", "agents", "api", "config", "demo", "executions", "files", "sso", "terminals"}


def test_the_transport_imports_none_of_the_apps():
    """The channel layer and the server patches sit beneath every app: any of them may use it, it uses none."""
    sources = sorted((ROOT / "transport").rglob("*.py"))
    assert len(sources) >= 6
    upward = {
        f"{source.relative_to(ROOT)}: {module}"
        for source in sources
        for module in _imported_modules(source)
        if module.split(".")[0] in APPS
    }
    assert not upward


def test_nothing_but_its_command_uses_the_demo():
    users = {
        f"{source.relative_to(ROOT)}: {module}"
        for app in APPS - {"config", "demo"}
        for source in sorted((ROOT / app).rglob("*.py"))
        for module in _imported_modules(source)
        if module.split(".")[0] == "demo"
    }
    assert not users


def test_the_import_check_sees_imports_in_functions_too(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def later():\n    from terminals.resolution import resolve\n    import terminals.wake\n")
    assert _imported_modules(probe) == {"terminals.resolution", "terminals.wake"}


def test_recovery_decides_and_leaves_every_write_to_actions():
    tree = ast.parse((ROOT / "terminals" / "recovery.py").read_text())
    writes = {"update", "create", "delete", "save", "select_for_update", "bulk_create", "get_or_create"}
    called = {
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert called & writes == set()
    assert "django.db" not in _imported_modules(ROOT / "terminals" / "recovery.py")  # no transaction of its own
    through_actions = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "actions"
    }
    assert "filter" in called and {"take_over_lease", "settle_execution", "release_lease"} <= through_actions


@pytest.mark.django_db
def test_a_submission_is_announced_once_it_commits(django_capture_on_commit_callbacks):
    heard = []

    def listen(sender, execution, **kwargs):
        heard.append(execution.execution_id)

    execution_submitted.connect(listen)
    try:
        machine = make_machine()
        with django_capture_on_commit_callbacks(execute=False) as pending:
            make_execution(machine, execution_id="announced", spec=make_spec("true"))
        assert heard == []  # not before the commit
        for callback in pending:
            callback()
        assert heard == ["announced"]
        with django_capture_on_commit_callbacks(execute=True):
            make_execution(machine, execution_id="announced", spec=make_spec("true"))  # the same submission again
        assert heard == ["announced"]
    finally:
        execution_submitted.disconnect(listen)


@pytest.mark.django_db
def test_a_committed_submission_wakes_the_workers(django_capture_on_commit_callbacks):
    layer = get_channel_layer()

    async def wake_up():
        return await asyncio.wait_for(layer.receive(WAKE_CHANNEL), timeout=5)

    with django_capture_on_commit_callbacks(execute=True):
        execution = make_execution()
    assert Execution.objects.filter(pk=execution.pk).exists()
    assert asyncio.run(wake_up()) == {"type": "wake"}
