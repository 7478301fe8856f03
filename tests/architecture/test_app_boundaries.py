"""The apps are layered: executions (records) knows nothing of terminals (processes), which reacts to its
signals; within terminals, recovery decides and actions write. A submission wakes the owner workers only
once it has committed."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
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


APPS = {"access", "agents", "api", "config", "demo", "executions", "files", "recordings", "sso", "terminals"}


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


# What other apps may use of the recordings app: its actions, and (in the owner worker) the recorder with the
# take it keeps on each live shell. Its models, store, pages and admin are its own; config mounts its routes.
RECORDINGS_ENTRANCES = {"recordings.actions", "recordings.recorder", "recordings.take"}


def _reached_in(source: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``source`` imports (``from package import module`` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == package:
            found |= {f"{package}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return {name for name in found if name == package or name.startswith(package + ".")}


def test_the_recordings_app_is_reached_through_its_actions():
    reached = {
        f"{source.relative_to(ROOT)}: {module}"
        for app in APPS - {"config", "recordings"}
        for source in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in source.parts
        for module in _reached_in(source, "recordings")
        if module not in RECORDINGS_ENTRANCES
    }
    assert not reached


def test_the_entrance_check_sees_each_form_of_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from recordings import actions, store\nimport recordings.views\nfrom recordings.models import X\n"
    )
    assert _reached_in(probe, "recordings") == {
        "recordings.actions",
        "recordings.store",
        "recordings.views",
        "recordings.models",
    }
    assert len(list((ROOT / "recordings").rglob("*.py"))) >= 15  # the app is where the check looks


def _modules() -> dict[str, Path]:
    found = {}
    for app in sorted(APPS | {"transport"}):
        for source in (ROOT / app).rglob("*.py"):
            if "migrations" not in source.parts:
                name = ".".join(source.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                found[name] = source
    return found


def _import_loops() -> list[list[str]]:
    """Every loop of imports between the apps' modules (in functions and TYPE_CHECKING blocks too; ``from
    package import module`` counts the module, not the package's ``__init__``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                inner = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                edges |= inner | ({node.module} if len(inner) < len(node.names) else set())
        graph[name] = (edges & modules.keys()) - {name}
    loops, seen, order, low, stack = [], {}, [0], {}, []

    def visit(name: str) -> None:  # Tarjan's strongly connected components
        seen[name] = low[name] = order[0]
        order[0] += 1
        stack.append(name)
        for other in graph[name]:
            if other not in seen:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], seen[other])
        if low[name] == seen[name]:
            component = []
            while (top := stack.pop()) != name:
                component.append(top)
            if component:
                loops.append(sorted([*component, name]))

    for name in sorted(graph):
        if name not in seen:
            visit(name)
    return loops


def test_no_module_imports_one_that_imports_it_back():
    assert len(_modules()) > 150  # the walk found the apps
    assert _import_loops() == []


def test_the_backends_run_without_django():
    """What a backend needs of the install is passed in (terminals/backends/config.py): every backend module
    imports, and works, with no Django loaded."""
    names = sorted(f"terminals.backends.{p.stem}" for p in (ROOT / "terminals" / "backends").glob("*.py"))
    assert len(names) > 10
    probe = f"import sys; [__import__(n) for n in {names!r}]; print(sorted(m for m in sys.modules if 'django' in m))"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (loaded.returncode, loaded.stdout.strip()) == (0, "[]"), loaded.stderr


def test_the_owner_worker_reads_its_settings_once():
    """The worker's services read what they run by from their context's WorkerConfig, made once at its start
    (terminals/owner/config.py): none reads Django's settings, on its hot path or anywhere else."""
    sources = [*sorted((ROOT / "terminals" / "owner").glob("*.py")), ROOT / "terminals" / "worker.py"]
    sources.append(ROOT / "recordings" / "recorder.py")
    readers = {
        str(source.relative_to(ROOT))
        for source in sources
        if source.name != "config.py" and "django.conf" in _imported_modules(source)
    }
    assert len(sources) > 12 and not readers


def test_no_module_over_400_lines_and_no_class_over_250():
    """Code one can hold in one's head: a module past 400 lines or a class past 250 is cut by what it does."""
    sources = [*_modules().values(), *sorted((ROOT / "clients" / "python" / "src").rglob("*.py"))]
    too_long = set()
    for source in sources:
        text = source.read_text()
        if len(text.splitlines()) > 400:
            too_long.add(f"{source.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:
                too_long.add(
                    f"{source.relative_to(ROOT)}: class {node.name}, {node.end_lineno - node.lineno + 1} lines"
                )
    assert len(sources) > 150 and not too_long


HANDLE_NAMES = {"handle", "intent"}


def _reads_by_key(source: Path) -> list[int]:
    """Where ``source`` reads a backend handle as a dict: ``handle[...]``, ``handle.get(...)``, ``... in handle``
    (a name or attribute called handle or intent)."""

    def named(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in HANDLE_NAMES) or (
            isinstance(node, ast.Attribute) and node.attr in HANDLE_NAMES
        )

    found = []
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Subscript) and named(node.value):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if named(node.func.value):
                found.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            if any(named(item) for item in node.comparators):
                found.append(node.lineno)
    return sorted(found)


def test_a_backend_handle_is_read_by_key_in_one_place():
    """A lease's handle is typed (terminals/backends/handles.py, the one place its JSON is read and written):
    nothing else reads it as a dict."""
    sources = [*_modules().values(), *sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    readers = [
        f"{source.relative_to(ROOT)}:{line}"
        for source in sources
        if source != ROOT / "terminals" / "backends" / "handles.py"
        for line in _reads_by_key(source)
    ]
    assert len(sources) > 300 and readers == []


def test_the_key_check_sees_each_way_of_reading_a_dict(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('handle["marker"]\nlease.handle.get("launch")\n"holder" in process.handle\nintent["x"]\n')
    assert _reads_by_key(probe) == [1, 2, 3, 4]


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
