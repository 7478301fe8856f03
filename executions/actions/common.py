"""What every action shares: who asked (``Actor``), the rule for identities, and the refusal a taken
command slot gets, the machine lookup."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser

from executions.errors import NotFound, SlotTaken, TransitionRefused, UsageError
from executions.models import Machine

IDENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")
MACHINE_NAME = re.compile(r"^[-a-zA-Z0-9_]{1,100}$")  # the API's schema says it too (api/schemas.py)


@dataclass(frozen=True)
class Actor:
    """Who asked for a change: a person, a worker or a management command."""

    label: str
    user: AbstractBaseUser | None = None

    @classmethod
    def for_user(cls, user: AbstractBaseUser) -> Actor:
        return cls(f"user:{user.get_username()}", user)

    @classmethod
    def command(cls, name: str) -> Actor:
        return cls(f"command:{name}")

    @classmethod
    def worker(cls, worker_id: str) -> Actor:
        return cls(f"worker:{worker_id}")


def check_identity(value: str, what: str) -> None:
    if not isinstance(value, str) or not IDENTITY.match(value):
        raise UsageError(
            f"{what} {value!r} must be 1-200 characters of letters, digits and ._:@/- starting with a letter or digit"
        )


def raise_slot_refusal(machine_pk: int, doing: str) -> None:
    machine = Machine.objects.select_related("active_execution").get(pk=machine_pk)
    holder = machine.active_execution
    if holder is not None:
        raise SlotTaken(machine.name, f"{holder.scope}/{holder.execution_id}", holder.state, doing, holder.pk)
    raise TransitionRefused(f"machine {machine.name}", machine.state, "in use", f"cannot {doing}")


def get_machine(name: str) -> Machine:
    try:
        return Machine.objects.select_related("active_execution").get(name=name)
    except Machine.DoesNotExist:
        raise NotFound(f"no machine named {name!r}") from None


def normal_path(path: str) -> str:
    """An absolute path with its ``.``, ``..`` and repeated slashes resolved as written (links are not)."""
    return "/" + posixpath.normpath(path).lstrip("/")
