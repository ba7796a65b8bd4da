#!/usr/bin/env bash
# Install everything the tests need into .venv, then run the whole suite: unit and integration
# tests under tests/, and the guided notebooks under notebooks/ through nbval.
#
# Two pytest sessions: first everything users run (this process holds no accelerator, so %%neuron
# runs its target in a worker, the default path) with the notebooks; then the tests that need the
# emulated device in the test process itself (marked inprocess_device: the emulator, the adapters,
# --executor inprocess), which must install it before the process's first backward pass.
#
# Each session spreads its test files over two processes (pytest-xdist; a file's tests stay in one
# process, so its module fixtures are built once): most tests wait on kernels, workers, builds or a
# browser, so a 2-core machine runs the suite in a little over half the time. `-n 0` (passed on)
# runs a session in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# The browser tests drive JupyterLab in Debian's chromium (no browser download).
bash scripts/install_browser.sh
status=0
.venv/bin/python -m pytest tests notebooks --nbval-lax --nbval-current-env -m "not inprocess_device" -n 2 --dist loadfile "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
status=0
.venv/bin/python -m pytest tests -m inprocess_device -n 2 --dist loadfile "$@" || status=$?
# 5: no test selected (arguments naming only default-path tests)
if [ "$status" -eq 5 ]; then status=0; fi
exit "$status"
