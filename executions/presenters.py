"""Plain-data views of records, shared by the CLI's --json output and the web views."""

from __future__ import annotations

from executions import pipes
from executions.models import Execution, Machine


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def execution_json(execution: Execution) -> dict:
    return {
        "scope": execution.scope,
        "execution_id": execution.execution_id,
        "aliases": [{"scope": a.scope, "id": a.alias_id} for a in execution.aliases.all()],
        "kind": execution.kind,
        "machine": execution.machine.name,
        "state": execution.state,
        "evidence": execution.evidence,
        "exit_code": execution.exit_code,
        "exit_signal": execution.exit_signal,
        "outcome": execution.outcome_label,
        "close_reason": execution.close_reason,
        "spec": execution.spec,
        "spec_digest": execution.spec_digest,
        "created_at": _iso(execution.created_at),
        "dispatched_at": _iso(execution.dispatched_at),
        "started_at": _iso(execution.started_at),
        "ended_at": _iso(execution.ended_at),
        "resolved_at": _iso(execution.resolved_at),
        "resolution_note": execution.resolution_note,
        "resolved_by": execution.resolved_by.get_username() if execution.resolved_by else None,
        # A command's captured terminal output (its last TETHER_COMMAND_OUTPUT_BYTES), as text.
        "output": bytes(execution.output or b"").decode("utf-8", "replace"),
        "output_truncated": execution.output_truncated,
        **_streams(execution),
    }


def _streams(execution: Execution) -> dict:
    """A command on pipes: its output as both streams in the order they came, and each apart (as text)."""
    if execution.spec.get("pty", True):
        return {}
    found = pipes.pieces(bytes(execution.output or b""), execution.output_truncated)
    text = {view: b"".join(p.data for p in found if view == "all" or p.stream == view) for view in pipes.View}
    return {"output": text["all"].decode("utf-8", "replace")} | {
        view.value: text[view].decode("utf-8", "replace") for view in (pipes.View.STDOUT, pipes.View.STDERR)
    }


def execution_text(execution: Execution) -> str:
    data = execution_json(execution)
    lines = [f"{data['scope']}/{data['execution_id']} on {data['machine']}: {data['outcome']}"]
    for key in ("state", "evidence", "exit_code", "kind", "created_at", "dispatched_at", "started_at", "ended_at"):
        if data[key] is not None and data[key] != "":
            lines.append(f"  {key}: {data[key]}")
    lines.append(f"  argv: {' '.join(data['spec']['argv'])}")
    if data["aliases"]:
        lines.append(f"  also named: {', '.join(f'{a["scope"]}/{a["id"]}' for a in data['aliases'])}")
    if data["resolution_note"]:
        by = f" by {data['resolved_by']}" if data["resolved_by"] else ""
        lines.append(f"  resolution: {data['resolution_note']} (at {data['resolved_at']}{by})")
    dropped = f"; {data['output_truncated']} earlier bytes not kept" if data["output_truncated"] else ""
    if "stdout" in data:  # on pipes
        for name in ("stdout", "stderr"):
            if data[name]:
                lines += [f"  {name} ({len(data[name].encode())} bytes{dropped}):", data[name].rstrip("\r\n")]
    elif data["output"]:
        lines.append(f"  output ({len(execution.output)} bytes{dropped}):")
        lines.append(data["output"].rstrip("\r\n"))
    return "\n".join(lines)


def machine_json(machine: Machine) -> dict:
    holder = machine.active_execution
    return {
        "name": machine.name,
        "backend": machine.backend,
        "ref": machine.ref,
        "engine": machine.engine,
        "host": machine.host,
        "scope": machine.scope,
        "state": machine.state,
        "incarnation": machine.incarnation,
        "slot": f"{holder.scope}/{holder.execution_id}" if holder else None,
        "slot_state": holder.state if holder else None,
    }
