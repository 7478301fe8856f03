"""Machine labels: ``key=value`` pairs that say what a machine is for (``team=payments``), so that access can
be granted to every machine that carries one. Keys and values are short, plain words: they appear in grants,
commands and URLs as they are."""

from __future__ import annotations

import re

from executions.errors import UsageError

KEY = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,62}$")
VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_LABELS = 32


def parse_label(text: str) -> tuple[str, str]:
    """``key=value`` as (key, value); UsageError saying what is wrong otherwise."""
    key, sep, value = (text or "").partition("=")
    if not sep:
        raise UsageError(f"label {text!r} must be key=value (for example team=payments)")
    check_label(key, value)
    return key, value


def check_label(key: str, value: str) -> None:
    if not isinstance(key, str) or not KEY.match(key):
        raise UsageError(f"label key {key!r} must be 1-63 of a-z, 0-9, '.', '_', '/' or '-', from a letter or digit")
    if not isinstance(value, str) or not VALUE.match(value):
        raise UsageError(f"label value {value!r} must be 1-63 of letters, digits, '.', '_' or '-'")


def parse_labels(texts: list[str]) -> dict[str, str]:
    """Several ``key=value`` as a dict; a key given twice with two values is refused."""
    labels: dict[str, str] = {}
    for text in texts:
        key, value = parse_label(text)
        if labels.get(key, value) != value:
            raise UsageError(f"label {key} given twice ({labels[key]} and {value})")
        labels[key] = value
    if len(labels) > MAX_LABELS:
        raise UsageError(f"at most {MAX_LABELS} labels a machine")
    return labels


def said(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items())) or "none"
