#!/usr/bin/env bash
# Create .venv with Python 3.12+ and install the pinned requirements (only when they changed).
set -euo pipefail
cd "$(dirname "$0")/.."

pick_python() {
    for candidate in python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            echo "$candidate"; return 0
        fi
    done
    return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    python=$(pick_python) || { echo "Tether needs Python 3.12 or newer (see .python-version)" >&2; exit 1; }
    echo "[setup] creating .venv with $($python --version)"
    rm -rf .venv
    "$python" -m venv .venv
fi

stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[setup] installing requirements"
    .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
    echo "$want" > "$stamp"
fi

# The Python client (clients/python), installed as its users install it (editable: its tests run its source).
stamp=.venv/.client.sha256
want=$(sha256sum clients/python/pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c 'import tether_client' 2>/dev/null; then
    echo "[setup] installing the Python client (clients/python)"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e clients/python
    echo "$want" > "$stamp"
fi
