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
if ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing $TORCH_SPEC"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC"
  echo "==> installing neuron-workbench and its test dependencies"
  # Left over by the former setuptools backend: stale metadata beside the package on sys.path.
  rm -rf workbench/neuron_workbench.egg-info
  # An editable install (hatchling) with the front-end build hook off: the extension is built and
  # put in place below, whenever its sources change, and also on a machine without Node.js.
  SKIP_JUPYTER_BUILDER=1 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
  echo "$want" > "$stamp"
fi

# The emulator's native core (emulator/native/emucore.cpp): compiled once per torch version into
# ~/.cache/neuron-workbench, so no test or notebook process pays the build. Without a C++ compiler
# the emulator uses its pure-Python core; the line printed says what to install.
"$VENV/bin/python" -m neuron_workbench.emulator.native || true

# The JupyterLab extension (extensions/neuron-workbench-lab): built from npm-registry packages with
# the venv's jlpm (jupyter-builder) when its output is missing or older than its sources, then put
# where JupyterLab finds it. An editable install copies the wheel's shared-data only when pip runs
# (above, only when pyproject.toml changes), hence the copy here; a wheel (`pip install
# neuron-workbench`, `python -m build`) ships the same files under share/jupyter/labextensions
# (pyproject's hatch shared-data), built by its build hook.
EXT=extensions/neuron-workbench-lab
EXT_OUT=workbench/neuron_workbench/labextension
EXT_DEST="$VENV/share/jupyter/labextensions/neuron-workbench-lab"
ext_sources=("$EXT/package.json" "$EXT/yarn.lock" "$EXT/.yarnrc.yml" "$EXT/src" "$EXT/style" "$EXT/schema")
if ! [ -f "$EXT_OUT/package.json" ] || [ -n "$(find "${ext_sources[@]}" -newer "$EXT_OUT/package.json" -print -quit)" ]; then
  if command -v node >/dev/null 2>&1; then
    echo "==> building the JupyterLab extension ($EXT)"
    (
      export PATH="$PWD/$VENV/bin:$PATH"
      cd "$EXT"
      log=$(mktemp)
      if ! { jlpm install --immutable && rm -rf "../../$EXT_OUT" && jlpm build; } >"$log" 2>&1; then
        cat "$log" >&2
        exit 1
      fi
      rm -f "$log"
    )
  else
    echo "==> Node.js not found: the JupyterLab extension is not built (the Python side works without it)" >&2
  fi
fi
if [ -f "$EXT_OUT/package.json" ] && ! diff -rq -x install.json "$EXT_OUT" "$EXT_DEST" >/dev/null 2>&1; then
  rm -rf "$EXT_DEST"
  mkdir -p "$(dirname "$EXT_DEST")"
  cp -r "$EXT_OUT" "$EXT_DEST"
fi
if [ -f "$EXT_DEST/package.json" ]; then
  cp "$EXT/install.json" "$EXT_DEST/install.json"
else
  rm -rf "$EXT_DEST"  # no extension built: only the editable install's install.json would be there
fi
