"""A change that takes access away and an act that relies on access never cross (docs/access.md).

An open (a shell, a command) is decided before its transaction starts, which leaves a window: a grant revoked, a
person taken out of a group or deactivated, a token revoked or a label taken off the machine, committed while
the open was on its way, and the open would commit after it. So the act decides again inside its own
transaction (:func:`decided_again`), on what is committed then, behind a fence the changes hold:

- the person's row and the token's row, locked FOR SHARE (a deactivation or a token's revoke updates them);
- one PostgreSQL advisory lock: shared by the acts, exclusive for a change (:func:`narrowing`), so that a
  change waits for the acts deciding now to commit, and acts after it wait for the change to commit and see it;
- the machine's row (its labels).

The locks are taken in that order everywhere (a person's row, the token's, the fence, the machine's), so a
change and an act wait for each other. Either the act commits first (and the change, when it commits, closes
the sockets on what it took away, as for everything else: the shell or command itself runs on, for operators to
keep or end), or the change does and the act is refused. Never an open after the revoke committed.

On SQLite (the embedded mode, one process) the act still decides again on what is committed, without the locks.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.functions import Now

from access.policy import Do, Reach
from executions.locks import Lock, held_until_commit
from executions.models import Machine


def narrowing() -> None:
    """Inside the transaction of a change that may take access away: waits for the acts deciding now to
    commit; acts after this wait for it to commit, then decide on it."""
    assert connection.in_atomic_block, "narrowing() is taken inside the change's own transaction"
    held_until_commit(Lock.FENCE)  # one for every change of access (they are rare; acts share it)


def _locked_row(model, pk) -> bool:
    """Lock ``model``'s row ``pk`` FOR SHARE (an UPDATE of it waits for this transaction, or this for it)."""
    if connection.vendor != "postgresql":
        return model._default_manager.filter(pk=pk).exists()
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE {model._meta.pk.column} = %s FOR SHARE", [pk])
        return cursor.fetchone() is not None


def decided_again(who, do: Do, machine: Machine) -> bool:
    """Inside the transaction of an act on ``machine`` (an open, a submission): whether ``who`` (a user or an
    API token) may still ``do`` it, decided on what is committed once the changes in flight have committed.
    The rows it read stay locked until the act commits."""
    assert connection.in_atomic_block, "decided_again() is asked inside the act's own transaction"
    token = who if hasattr(who, "digest") and hasattr(who, "scopes") else None
    user = token.user if token is not None else who
    if user is None or not user.is_authenticated or not _locked_row(get_user_model(), user.pk):
        return False
    if token is not None and not _locked_row(type(token), token.pk):
        return False
    held_until_commit(Lock.FENCE, shared=True)
    fresh_machine = Machine.objects.select_for_update(no_key=True).filter(pk=machine.pk).first()
    fresh_user = get_user_model().objects.filter(pk=user.pk).first()  # no cached permissions, is_active as it is
    if fresh_machine is None or fresh_user is None:
        return False
    if token is not None:
        token = type(token).objects.filter(pk=token.pk, revoked_at__isnull=True, expires_at__gt=Now()).first()
        if token is None:
            return False
        return Reach(fresh_user, token).may(Do(do), fresh_machine)
    return Reach(fresh_user).may(Do(do), fresh_machine)
