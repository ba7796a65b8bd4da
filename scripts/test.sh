#!/usr/bin/env bash
# Install everything the tests need into .venv, then run the whole suite: unit and integration
# tests under tests/, and the guided notebooks under notebooks/ through nbval.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# The browser tests drive JupyterLab in Debian's chromium (no browser download).
bash scripts/install_browser.sh
exec .venv/bin/python -m pytest tests notebooks --nbval-lax --nbval-current-env "$@"
