"""The portal's pages: "My workspaces" and the terminal page. Views read; ``terminals.actions`` changes state."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import OuterRef, Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render, resolve_url
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST, require_safe

from access.policy import Do, machine_named, may, reach_of
from executions.errors import ExecutionError, SlotTaken
from executions.models import ENDED_STATES, Execution, Kind, Machine, State
from executions.spec import ExecutionSpec
from terminals import actions
from terminals.models import CommandRecord, ProcessState, TerminalSession
from terminals.protocol import Role, Via


@dataclass
class Workspace:
    """One row of "My workspaces": a machine and what the user may know about its terminal."""

    machine: Machine
    role: str  # the user's roles on it, in their words (operate; use, watch; ...)
    can_open: bool  # they may open a shell there
    session: TerminalSession | None  # the machine's open session, when it is this user's to see
    in_use_by_other: bool
    last_outcome: str
    owner: str = ""  # whose the open shell is, when it is someone else's (staff see it)
    last_command: CommandRecord | None = None  # the open session's latest typed command

    @property
    def foreign(self) -> bool:
        return bool(self.owner)


def _workspaces(user) -> list[Workspace]:
    reach = reach_of(user)
    roles = {machine.pk: reach.role(machine) for machine in reach.machines(Do.SEE)}
    machines = [machine for machine in reach.machines(Do.SEE)]
    open_sessions = {
        session.machine_id: session
        for session in TerminalSession.objects.filter(
            machine__in=machines, process_state__in=[ProcessState.LIVE, ProcessState.CLOSING]
        ).select_related("execution", "user")
    }
    ended = Execution.objects.filter(kind=Kind.TERMINAL, state__in=sorted(ENDED_STATES))
    watched = {machine.pk for machine in machines if reach.may(Do.WATCH, machine)}
    # Another user's shell history on a shared machine is for those who may watch its shells.
    ended = ended.filter(Q(requested_by=user) | Q(machine__in=watched))
    latest = ended.filter(machine=OuterRef("pk")).order_by("-ended_at", "-id").values("pk")[:1]
    last_ids = Machine.objects.filter(pk__in=[m.pk for m in machines]).annotate(last=Subquery(latest))
    last_outcome = {
        execution.machine_id: execution.outcome_label
        for execution in Execution.objects.filter(pk__in=[row.last for row in last_ids if row.last])
    }
    latest_command = CommandRecord.objects.filter(session=OuterRef("pk")).order_by("-id").values("pk")[:1]
    with_last = TerminalSession.objects.filter(pk__in=[s.pk for s in open_sessions.values()])
    command_ids = [row.last for row in with_last.annotate(last=Subquery(latest_command)) if row.last]
    last_command = {record.session_id: record for record in CommandRecord.objects.filter(pk__in=command_ids)}
    rows = []
    for machine in machines:
        session = open_sessions.get(machine.pk)
        visible = session is not None and actions.may_view_session(user, session)
        foreign = session is not None and session.user_id != user.pk
        rows.append(
            Workspace(
                machine=machine,
                role=roles[machine.pk],
                can_open=reach.may(Do.USE, machine),
                session=session if visible else None,
                in_use_by_other=session is not None and not visible,
                last_outcome=last_outcome.get(machine.pk, ""),
                # Whose shell it is, to those who may watch it; others see only that one is open.
                owner=session.user.get_username() if foreign and visible else "",
                last_command=last_command.get(session.pk) if visible else None,
            )
        )
    return rows


@login_required
@require_GET
def workspaces(request: HttpRequest) -> HttpResponse:
    context = {"workspaces": _workspaces(request.user)}
    # htmx refreshes only the list; a plain request (or no JS at all) gets the whole page.
    template = "terminals/workspaces.html#workspace-list" if request.htmx else "terminals/workspaces.html"
    return render(request, template, context)


HISTORY_PAGE = 50


def seen_machine(user, name: str) -> Machine:
    """The workspace ``name`` when it exists for ``user`` (any role); else 404, as for one that does not exist."""
    machine = machine_named(user, name)
    if machine is None:
        raise Http404("No such workspace")
    return machine


@login_required
@require_GET
def history(request: HttpRequest, name: str) -> HttpResponse:
    """A machine's executions, newest first: state, how we know, exit code, times and who asked.

    Others' executions only to those who may watch the machine (another user's history is not everyone's)."""
    machine = seen_machine(request.user, name)
    executions = Execution.objects.filter(machine=machine).select_related("requested_by").order_by("-created_at", "-id")
    if not may(request.user, Do.WATCH, machine):
        executions = executions.filter(requested_by=request.user)
    try:
        page = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        page = 1
    rows = list(executions[(page - 1) * HISTORY_PAGE : page * HISTORY_PAGE + 1])
    context = {
        "machine": machine,
        "executions": rows[:HISTORY_PAGE],
        "page": page,
        "has_next": len(rows) > HISTORY_PAGE,
    }
    return render(request, "terminals/history.html", context)


@login_required
@require_POST
def open_machine(request: HttpRequest, name: str) -> HttpResponse:
    machine = seen_machine(request.user, name)  # one they may not reach does not exist for them
    if not actions.may_use_machine(request.user, machine):
        opened = TerminalSession.objects.filter(machine=machine, process_state__in=[ProcessState.LIVE, "closing"])
        shown = opened.first()
        if shown is not None and actions.may_view_session(request.user, shown):
            return redirect("terminals:terminal", session_id=shown.id)  # to watch it
        messages.error(request, f"You may watch {machine.name}'s shells, not open one: your role there is watch.")
        return redirect("terminals:workspaces")
    try:
        session, _ = actions.open_terminal(machine, request.user)
    except SlotTaken as busy:
        messages.error(request, busy_text(machine, busy, request.user))
        return redirect("terminals:workspaces")
    except ExecutionError as refused:  # a guard (cap, someone else's shell), never a 500
        messages.error(request, f"Could not open {machine.name}: {refused}")
        return redirect("terminals:workspaces")
    return redirect("terminals:terminal", session_id=session.id)


def busy_text(machine: Machine, busy: SlotTaken, user) -> str:
    """Why a machine takes no new shell now, in a user's words (its slot holds one execution at a time). The
    command holding it is named only to who may watch it: another user's work is not theirs to know of."""
    holder = Execution.objects.select_related("machine", "terminal_session").filter(pk=busy.holder_pk).first()
    if holder is None or not may(user, Do.WATCH, holder):
        busy.holder_label = "another user's command"
    if busy.holder_state == State.UNKNOWN:
        return (
            f"{machine.name} cannot start a new shell yet: the last command or shell on it ended with an unknown "
            "outcome (Tether lost the worker running it). An operator must check it and resolve it first "
            f"(Admin → Executions → {busy.holder_label} → check and resolve)."
        )
    if busy.holder_state == State.PENDING:
        return f"{machine.name} is about to run {busy.holder_label}: try again when it has finished."
    return f"{machine.name} is busy running {busy.holder_label}: try again when it has finished."


def terminal_page_state(request: HttpRequest, session: TerminalSession, *, ws_path: str, **page) -> dict:
    """What the terminal page's script is told (``page``: who this window is to the session, and its links)."""
    return {
        "session": str(session.id),
        "machine": session.machine.name,
        "wsPath": ws_path,
        "processState": session.process_state,
        "generation": session.generation,
        # The limit this shell really has: fixed in its spec when it was opened (by whichever web process
        # handled the Open), not this process's setting, which may differ.
        "idleMinutes": max(1, round(ExecutionSpec.from_json(session.execution.spec).idle_seconds / 60)),
        "loginUrl": f"{resolve_url(settings.LOGIN_URL)}?{urlencode({'next': request.get_full_path()})}",
        "workspacesUrl": reverse("terminals:workspaces"),
        "fontSize": actions.font_size_of(request.user),
        "me": request.user.get_username(),
        "preferencesUrl": reverse("terminals:preferences"),
        **page,
    }


@login_required
@require_safe
def terminal(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = TerminalSession.objects.select_related("machine", "execution", "user").filter(pk=session_id).first()
    # Unknown and unreachable sessions look the same, to staff too, so session ids cannot be probed.
    if session is None or not actions.may_view_session(request.user, session):
        raise Http404("No such terminal")
    foreign = session.user_id != request.user.pk
    # Another user's shell (staff who may watch it): the page watches it read-only; taking it over (with that
    # permission) is a click the user is told of.
    page_state = terminal_page_state(
        request,
        session,
        ws_path=f"/ws/terminals/{session.id}/",
        owner=session.user.get_username() if foreign else "",
        role=Role.OBSERVER if foreign else Role.WRITER,
        via=(Via.STAFF if request.user.is_staff else Via.TEAM) if foreign else Via.OWN,
        canTakeOver=foreign and actions.may_take_over(request.user, session),
        sharesUrl=reverse("recordings:session_shares", args=[session.id])
        if actions.may_share(request.user, session)
        else "",
        recordingsUrl=reverse("recordings:machine_recordings", args=[session.machine.name]),
        commandsUrl=reverse("terminals:commands", args=[session.id]),
    )
    return render(request, "terminals/terminal.html", {"session": session, "page_state": page_state})


@login_required
@require_GET
def commands(request: HttpRequest, session_id: UUID) -> JsonResponse:
    """The session's typed commands (its latest 200), and whether its shell's commands are tracked."""
    session = TerminalSession.objects.filter(pk=session_id).first()
    if session is None or not actions.may_view_session(request.user, session):
        raise Http404("No such terminal")
    body = {"generation": session.generation, "tracking": actions.tracking(session)}
    return JsonResponse(body | {"commands": actions.session_commands(session)})


@login_required
@require_POST
def preferences(request: HttpRequest) -> JsonResponse:
    """Keep the terminal page's font size for this user (the page posts it, with its CSRF token)."""
    try:
        size = int(request.POST.get("font_size", ""))
    except ValueError:
        size = -1
    try:
        kept = actions.set_font_size(request.user, size)
    except ExecutionError as refused:
        return JsonResponse({"error": str(refused)}, status=400)
    return JsonResponse({"font_size": kept})
