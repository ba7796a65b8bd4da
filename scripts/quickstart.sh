#!/usr/bin/env bash
# The main job: set up .venv, run notebooks/00_quickstart.ipynb headless through %%neuron,
# write reports/quickstart.html (and .json), and print each cell's verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
mkdir -p reports
set +e
.venv/bin/neuron-workbench run notebooks/00_quickstart.ipynb \
  --html reports/quickstart.html --json reports/quickstart.json
status=$?
set -e
echo "report: $(pwd)/reports/quickstart.html"
exit $status
