"""The MCP server at /mcp, driven by the MCP SDK's own client (ClientSession over Streamable HTTP) against
daphne and a real worker: the tools tell the truth (exits seen, unknown as unknown), run nothing twice, and
answer only what the token's user may reach."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult

from api.models import ApiCall
from api.tokens import create_token, revoke_token
from tests.bridge.harness import Stack
from tests.factories import make_unknown_execution

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def _token(user, *scopes: str) -> str:
    return create_token(user, name=f"mcp-{uuid.uuid4().hex[:8]}", scopes=list(scopes or ("read", "run", "terminals")))[
        1
    ]


class Agent:
    """One MCP client session with a token (the SDK's ClientSession over its Streamable HTTP transport)."""

    def __init__(self, session: ClientSession):
        self.session = session

    async def call(self, tool: str, **arguments):
        result = await self.session.call_tool(tool, arguments)
        assert not result.isError, result.content[0].text
        return result

    async def refused(self, tool: str, **arguments) -> tuple[str, dict]:
        result = await self.session.call_tool(tool, arguments)
        assert result.isError, result
        code, _, rest = result.content[0].text.partition(": ")
        return code, json.loads(rest.split("\n", 1)[1])


@contextlib.asynccontextmanager
async def agent_of(port: int, raw: str):
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {raw}"}, timeout=120) as http:
        async with streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield Agent(session)


def _raw_call(port: int, raw: str, tool: str, arguments: dict, timeout: float) -> httpx.Response:
    """One tools/call as a bare HTTP request (no session: the server is stateless)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"Authorization": f"Bearer {raw}", "Accept": "application/json, text/event-stream"}
    return httpx.post(f"http://127.0.0.1:{port}/mcp", json=body, headers=headers, timeout=timeout)


def test_an_agent_lists_runs_reads_awaits_and_cancels_over_mcp(stack, place, operator, bob, tmp_path):
    place("local", "mcp-box")
    raw = _token(operator)
    launches = tmp_path / "launches"

    async def agent():
        async with agent_of(stack.ports[0], raw) as a:
            tools = {tool.name: tool for tool in (await a.session.list_tools()).tools}
            assert set(tools) >= {"list_workspaces", "run_command", "read_output", "await_command", "cancel_command",
                                  "write_stdin", "open_terminal", "send_keys", "read_screen",
                                  "close_terminal"}  # fmt: skip
            assert tools["read_output"].annotations.readOnlyHint is True
            assert tools["run_command"].annotations.idempotentHint is True
            assert tools["run_command"].annotations.destructiveHint is True
            assert tools["run_command"].outputSchema["properties"]["execution"]
            assert tools["run_command"].inputSchema["additionalProperties"] is False

            listed = (await a.call("list_workspaces")).structuredContent["workspaces"]
            assert [(w["name"], w["backend"], w["slot"]["held"]) for w in listed] == [("mcp-box", "local", False)]

            # exit 0, waited for; exit 7: the program's own codes, with the output's text.
            argv = ["sh", "-c", f"echo launched >> {launches}; echo hello-$((6*7)); exit 0"]
            ran = await a.call("run_command", machine="mcp-box", scope="agent", id="one", argv=argv, wait_seconds=30)
            said = ran.structuredContent
            assert (said["created"], said["final"], said["execution"]["state"]) == (True, True, "completed")
            assert said["execution"]["exit_code"] == 0 and "hello-42" in said["output"]["text"]
            assert "hello-42" in ran.content[0].text
            seven = await a.call(
                "run_command", machine="mcp-box", scope="agent", id="seven", argv=["sh", "-c", "exit 7"],
                wait_seconds=30, idle_seconds=0,
            )  # fmt: skip
            assert seven.structuredContent["execution"]["exit_code"] == 7
            assert seven.structuredContent["execution"]["spec"]["idle_seconds"] == 0  # a quiet build is not reaped

            # The same call again (an answer the agent never saw): the same execution, nothing ran again.
            again = await a.call("run_command", machine="mcp-box", scope="agent", id="one", argv=argv, wait_seconds=5)
            assert again.structuredContent["created"] is False
            assert again.structuredContent["execution"]["id"] == said["execution"]["id"]
            assert launches.read_text() == "launched\n"

            # On pipes: stdout and stderr apart, stdin written once per seq and closed.
            piped = await a.call(
                "run_command", machine="mcp-box", scope="agent", id="piped", pty=False,
                argv=["sh", "-c", "printf out; printf err >&2; cat; exit 2"],
            )  # fmt: skip
            piped_pk = piped.structuredContent["execution"]["id"]
            written = await a.call("write_stdin", execution=piped_pk, seq=0, data="in\n", eof=True)
            assert written.structuredContent == {"written": True, "repeated": False, "seq": 0}
            ended = (await a.call("await_command", execution=piped_pk, timeout_seconds=30)).structuredContent
            assert (ended["execution"]["exit_code"], ended["execution"]["pty"]) == (2, False)
            assert (ended["stdout"]["text"], ended["stderr"]["text"]) == ("outin\n", "err")
            err = (await a.call("read_output", execution=piped_pk, stream="stderr", since=1)).structuredContent
            assert (err["text"], err["offset"], err["final"]) == ("rr", 1, True)

            # Output by offset: next, end, final; the head and tail of a long output with what was left out.
            pk = said["execution"]["id"]
            first = (await a.call("read_output", execution=pk, since=0, size=4)).structuredContent
            assert (first["offset"], first["next"]) == (0, 4)
            rest = (await a.call("read_output", execution=pk, since=first["next"])).structuredContent
            text = base64.b64decode(first["data"]) + base64.b64decode(rest["data"])
            assert text == b"hello-42\r\n" and rest["final"] is True
            long = await a.call(
                "run_command", machine="mcp-box", scope="agent", id="long", argv=["seq", "1", "20000"], wait_seconds=30
            )
            output = long.structuredContent["output"]
            assert output["text"].startswith("1\r\n2\r\n") and output["text"].endswith("19999\r\n20000\r\n")
            assert output["omitted"] == output["end"] - 4096 - 12288 > 0
            assert f"{output['omitted']} bytes left out" in output["text"]

            # A running command: awaited with a bound (not final), then cancelled, then ended by its worker.
            slow = await a.call(
                "run_command", machine="mcp-box", scope="agent", id="slow", argv=["sleep", "300"], wait_seconds=0
            )
            slow_pk = slow.structuredContent["execution"]["id"]
            started = time.monotonic()
            waited = (await a.call("await_command", execution=slow_pk, timeout_seconds=2)).structuredContent
            assert waited["final"] is False and waited["awaiting"] in ("start", "program")
            assert time.monotonic() - started < 10
            listed = (await a.call("list_workspaces")).structuredContent["workspaces"]
            assert listed[0]["slot"] | {"state": "-"} == {
                "held": True, "by": "you", "execution": slow_pk, "label": "agent/slow", "state": "-"
            }  # fmt: skip
            deadline = time.monotonic() + 30
            while (await a.call("await_command", execution=slow_pk, timeout_seconds=0)).structuredContent["execution"][
                "state"
            ] != "running":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            cancelled = (await a.call("cancel_command", execution=slow_pk, reason="not needed")).structuredContent
            assert cancelled["ended"] is False
            ended = (await a.call("await_command", execution=slow_pk, timeout_seconds=30)).structuredContent
            assert ended["final"] is True and ended["execution"]["evidence"] in ("signaled", "killed", "cancelled")

            # Refusals carry the API's problem: an unknown argument, a bad field, a slot that is yours.
            code, problem = await a.refused("run_command", machine="mcp-box", scope="agent", id="x", argv=["true"],
                                            evn={"A": "1"})  # fmt: skip
            assert (code, problem["fields"]) == ("unknown_fields", ["evn"])
            code, _ = await a.refused("run_command", machine="mcp-box", scope="agent", id="-x", argv=["true"])
            assert code == "validation_error"
            code, problem = await a.refused("read_output", execution=999999)
            assert (code, problem["status"]) == ("not_found", 404)
            code, _ = await a.refused("format_disk")
            assert code == "not_found"
            return pk

    pk = asyncio.run(agent())

    # Another user's token: no workspace, and the execution is as one that does not exist.
    theirs = _token(bob)

    async def stranger():
        async with agent_of(stack.ports[0], theirs) as b:
            assert (await b.call("list_workspaces")).structuredContent["workspaces"] == []
            for tool in ("read_output", "await_command", "cancel_command"):
                code, problem = await b.refused(tool, execution=pk)
                assert code == "not_found" and "operator" not in json.dumps(problem)
            code, _ = await b.refused("run_command", machine="mcp-box", scope="b", id="1", argv=["true"])
            assert code == "not_found"

    asyncio.run(stranger())
    tools = set(ApiCall.objects.filter(token__user=operator, method="MCP").values_list("path", flat=True))
    assert {"/mcp tools/call run_command", "/mcp tools/call read_output", "/mcp tools/call cancel_command"} <= tools
    refused = ApiCall.objects.filter(token__user=operator, problem="unknown_fields", method="MCP")
    assert refused.count() == 1


def test_a_run_whose_answer_was_dropped_runs_once_and_a_revoked_token_is_refused_at_its_next_call(
    stack, place, operator, tmp_path
):
    place("local", "mcp-drop")
    raw = _token(operator)
    launches = tmp_path / "launches"
    argv = ["sh", "-c", f"echo launched >> {launches}; sleep 2; echo done"]
    arguments = {"machine": "mcp-drop", "scope": "agent", "id": "dropped", "argv": argv, "wait_seconds": 30}
    with pytest.raises(httpx.ReadTimeout):  # the agent gave up on the answer: did it run?
        _raw_call(stack.ports[0], raw, "run_command", arguments, timeout=1.0)

    async def retry():
        async with agent_of(stack.ports[0], raw) as a:
            said = (await a.call("run_command", **arguments)).structuredContent
            assert said["created"] is False and said["final"] is True
            assert said["execution"]["exit_code"] == 0 and "done" in said["output"]["text"]
            return a

    asyncio.run(retry())
    assert launches.read_text() == "launched\n"

    token = ApiCall.objects.filter(token__user=operator).first().token
    revoke_token(token.pk, by=operator, reason="test")
    answer = _raw_call(stack.ports[0], raw, "list_workspaces", {}, timeout=10)
    assert answer.status_code == 401 and answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "token_revoked"
    assert answer.headers["www-authenticate"].startswith("Bearer")
    unsigned = httpx.post(f"http://127.0.0.1:{stack.ports[0]}/mcp", json={}, timeout=10)
    assert (unsigned.status_code, unsigned.json()["code"]) == (401, "unauthenticated")
    foreign = _raw_call(stack.ports[0], raw, "list_workspaces", {}, timeout=10)
    assert foreign.status_code == 401
    evil = httpx.post(
        f"http://127.0.0.1:{stack.ports[0]}/mcp", json={}, timeout=10,
        headers={"Origin": "http://evil.example", "Authorization": f"Bearer {raw}"},
    )  # fmt: skip
    assert (evil.status_code, evil.json()["code"]) == (403, "forbidden")
    listening = httpx.get(
        f"http://127.0.0.1:{stack.ports[0]}/mcp", timeout=10,
        headers={"Accept": "text/event-stream", "Authorization": f"Bearer {raw}"},
    )  # fmt: skip
    assert (listening.status_code, listening.headers["allow"]) == (405, "POST")  # no stream left open
    elsewhere = httpx.post(
        f"http://127.0.0.1:{stack.ports[0]}/mcp", json={}, timeout=10, headers={"Host": "evil.example"}
    )
    assert (elsewhere.status_code, elsewhere.json()["code"]) == (400, "invalid_request")


def test_a_terminal_is_opened_typed_into_read_as_a_screen_and_closed(stack, place, operator):
    place("local", "mcp-shell")
    raw = _token(operator, "terminals")

    async def agent():
        async with agent_of(stack.ports[0], raw) as a:
            opened = (await a.call("open_terminal", machine="mcp-shell")).structuredContent
            terminal = opened["terminal"]["id"]
            assert opened["created"] is True
            again = (await a.call("open_terminal", machine="mcp-shell")).structuredContent
            assert (again["created"], again["terminal"]["id"]) == (False, terminal)
            assert (await a.call("send_keys", terminal=terminal, seq=1, keys="clear; echo screen-$((6*7))\r")
                    ).structuredContent == {"written": True, "repeated": False, "seq": 1}  # fmt: skip
            repeated = await a.call("send_keys", terminal=terminal, seq=1, keys="clear; echo screen-$((6*7))\r")
            assert repeated.structuredContent["repeated"] is True
            code, problem = await a.refused("send_keys", terminal=terminal, seq=5, keys="x")
            assert (code, problem["expected"]) == ("input_gap", 2)
            deadline = time.monotonic() + 20
            while True:
                screen = (await a.call("read_screen", terminal=terminal)).structuredContent
                # the echo and the prompt after it (a read can come between the two writes)
                drawn = screen["lines"][1:2] != [""] and screen["lines"][1].endswith(("$", "#"))
                if "screen-42" in screen["lines"] and drawn:
                    break
                assert time.monotonic() < deadline, screen
                await asyncio.sleep(0.2)
            assert (screen["cols"], screen["rows"], len(screen["lines"])) == (80, 24, 24)
            # cleared: the output on the first row, the prompt on the second, the cursor after it
            assert screen["lines"].index("screen-42") == 0 and screen["cursor"]["row"] == 1
            assert screen["cursor"]["col"] == len(screen["lines"][1]) + 1 and screen["lines"][2:] == [""] * 22
            assert screen["complete"] is True and screen["process_state"] == "live"
            assert screen["lines"].count("screen-42") == 1  # echoed once (seq 1 was written once)
            closed = (await a.call("close_terminal", terminal=terminal, reason="done")).structuredContent
            assert closed["process_state"] in ("closing", "closed")

    asyncio.run(agent())


def test_an_unknown_outcome_is_said_as_unknown_and_what_an_operator_must_check(stack, place, operator):
    execution = make_unknown_execution(place("local", "mcp-unknown"), operator, "lost")
    raw = _token(operator, "read")

    async def agent():
        async with agent_of(stack.ports[0], raw) as a:
            said = await a.call("await_command", execution=execution.pk, timeout_seconds=2)
            outcome = said.structuredContent
            assert (outcome["final"], outcome["awaiting"], outcome["execution"]["state"]) == (
                False,
                "operator",
                "unknown",
            )
            assert outcome["execution"]["exit_code"] is None and "mcp-unknown" in outcome["operator_must_check"]
            assert "UNKNOWN" in said.content[0].text and "exit" not in said.content[0].text.split("\n")[0]

    asyncio.run(agent())


def test_a_worker_killed_mid_command_gives_the_exit_read_back_never_a_made_up_one(place, operator):
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"}
    try:
        stack.start("local")
        place("local", "mcp-kill")
        raw = _token(operator)

        async def agent():
            async with agent_of(stack.ports[0], raw) as a:
                argv = ["sh", "-c", "echo started; sleep 3; echo finished; exit 5"]
                ran = await a.call("run_command", machine="mcp-kill", scope="agent", id="kill", argv=argv)
                pk = ran.structuredContent["execution"]["id"]
                deadline = time.monotonic() + 30
                while "started" not in (await a.call("read_output", execution=pk)).structuredContent["text"]:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
                stack.workers[0].kill()
                stack.workers[0].wait()
                stack.start_worker("local")
                deadline = time.monotonic() + 60
                while not (
                    outcome := (await a.call("await_command", execution=pk, timeout_seconds=5)).structuredContent
                )["final"]:
                    assert time.monotonic() < deadline, outcome
                # The held shell's own exit, read back by the new worker: 5, and every byte it printed.
                assert (outcome["execution"]["state"], outcome["execution"]["exit_code"]) == ("completed", 5)
                assert "started" in outcome["output"]["text"] and "finished" in outcome["output"]["text"]

        asyncio.run(agent())
    finally:
        stack.stop()


@pytest.mark.filterwarnings("ignore:The experimental tasks API is deprecated:DeprecationWarning")  # docs/mcp.md
def test_a_long_command_as_an_mcp_task_follows_its_execution_and_an_unknown_one_is_neither_done_nor_failed(
    place, operator, bob
):
    place("local", "mcp-tasks")  # the unknown one on a machine of its own: it holds its machine's slot
    lost = make_unknown_execution(place("local", "mcp-tasks-lost"), operator, "lost-task")
    raw, theirs = _token(operator), _token(bob)
    stack = Stack()
    stack.extra_env |= {"TETHER_API_MAX_WAIT_SECONDS": "2"}  # how long tasks/result waits for an end
    stack.start("local")

    async def agent():
        async with agent_of(stack.ports[0], raw) as a:
            tools = {tool.name: tool for tool in (await a.session.list_tools()).tools}
            assert tools["run_command"].execution.taskSupport == "optional"
            argv = ["sh", "-c", "sleep 1; echo task-done; exit 3"]
            arguments = {"machine": "mcp-tasks", "scope": "agent", "id": "task-1", "argv": argv, "wait_seconds": 60}
            started = time.monotonic()
            created = await a.session.experimental.call_tool_as_task("run_command", arguments)
            assert time.monotonic() - started < 5  # answered at once, not after the command
            task = created.task.taskId
            assert created.task.status == "working"
            seen = []
            async for status in a.session.experimental.poll_task(task):
                seen.append(status.status)
            assert seen[-1] == "completed" and "working" in seen
            result = await a.session.experimental.get_task_result(task, CallToolResult)
            assert result.structuredContent["execution"]["exit_code"] == 3
            assert "task-done" in result.structuredContent["output"]["text"]
            assert task in [t.taskId for t in (await a.session.experimental.list_tasks()).tasks]

            # A result is a task's last word: a running one's is refused (ask again), never given as its end.
            slow = await a.session.experimental.call_tool_as_task(
                "run_command", {"machine": "mcp-tasks", "scope": "agent", "id": "task-slow", "argv": ["sleep", "300"]}
            )
            with pytest.raises(McpError) as working:
                await a.session.experimental.get_task_result(slow.task.taskId, CallToolResult)
            assert "still working" in str(working.value)
            await a.session.experimental.cancel_task(slow.task.taskId)
            statuses = [status async for status in a.session.experimental.poll_task(slow.task.taskId)]
            status = statuses[-1]
            assert (status.status, status.model_extra["tetherState"]) == ("completed", "completed")
            killed = await a.session.experimental.get_task_result(slow.task.taskId, CallToolResult)
            assert killed.structuredContent["execution"]["evidence"] in ("signaled", "killed")

            unknown = await a.session.experimental.get_task(f"execution-{lost.pk}")
            assert unknown.status == "input_required" and unknown.model_extra["tetherState"] == "unknown"
            assert "operator" in unknown.statusMessage and "mcp-tasks-lost" in unknown.statusMessage
            with pytest.raises(McpError) as taken:  # refused before a task exists: an error, not a task
                await a.session.experimental.call_tool_as_task(
                    "run_command", {"machine": "mcp-tasks-lost", "scope": "agent", "id": "t2", "argv": ["true"]}
                )
            assert "slot_taken" in str(taken.value)
            said = await a.session.experimental.get_task_result(f"execution-{lost.pk}", CallToolResult)
            assert said.structuredContent["awaiting"] == "operator"
            assert said.structuredContent["execution"]["exit_code"] is None
            return task

        return None

    try:
        task = asyncio.run(agent())

        async def stranger():
            async with agent_of(stack.ports[0], theirs) as b:
                with pytest.raises(McpError) as refused:
                    await b.session.experimental.get_task(task)
                assert "not_found" in str(refused.value)
                assert (await b.session.experimental.list_tasks()).tasks == []

        asyncio.run(stranger())
    finally:
        stack.stop()
