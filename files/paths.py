"""Which paths of a machine files may be moved to or from: those under one of its ``file_roots``. Checked twice:
here on the path as written (normalised, before anything is sent), and on the machine on the path as it
resolves there (symbolic links followed: files/scripts.py), so a link inside a root cannot lead outside it."""

from __future__ import annotations

from executions.actions.common import normal_path

MAX_PATH = 4096


class PathRefused(Exception):
    """Why a path may not be used (said to the caller as it is)."""


def normalised(path: str) -> str:
    """``path`` as an absolute, normalised path; PathRefused when it is not one."""
    if not path.startswith("/"):
        raise PathRefused("the path must be absolute (start with /)")
    if "\x00" in path or len(path.encode()) > MAX_PATH:
        raise PathRefused(f"the path must be at most {MAX_PATH} bytes, without NUL")
    return normal_path(path)


def within(path: str, roots: list[str]) -> bool:
    return any(root == "/" or path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def allowed(path: str, roots: list[str]) -> str:
    """The normalised ``path``, when it is under one of ``roots``; PathRefused otherwise (naming the roots: they
    are the machine's, which the caller may use)."""
    clean = normalised(path)
    if not roots:
        raise PathRefused("this machine allows no file transfers (an admin sets its file paths)")
    if not within(clean, roots):
        raise PathRefused(f"{clean} is outside the paths this machine allows ({', '.join(roots)})")
    return clean
