"""CUDA environment variables (NW130): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import env

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW130": (
        [
            'import os\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"',
            'import os\nv = os.environ.get("CUDA_VISIBLE_DEVICES")',
            'import os\nv = os.getenv("CUDA_LAUNCH_BLOCKING")',
            'import subprocess\nsubprocess.run(cmd, env={"CUDA_VISIBLE_DEVICES": "1"})',
        ],
        [
            'print("set CUDA_VISIBLE_DEVICES=0 first")',
            'import os\nos.environ["NEURON_RT_VISIBLE_CORES"] = "0"',
            "# CUDA_VISIBLE_DEVICES\nx = 1",
        ],
    ),
}


class TestRules(AreaCases):
    area = env.AREA
    cases = CASES
