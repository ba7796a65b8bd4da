#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv in .venv with everything the workbench and its tests need.
# torch is installed first and pinned, so no later requirement can pull a different (CUDA) build.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.neuron-workbench-installed"
want="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "==> installing $TORCH_SPEC"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC"
echo "==> installing neuron-workbench and its test dependencies"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
echo "$want" > "$stamp"
