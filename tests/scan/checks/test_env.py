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
    "NW131": (
        [
            'import subprocess\nsubprocess.run(["nvidia-smi", "-L"])',
            'import subprocess\nout = subprocess.check_output("nvcc --version", shell=True)',
            'import os\nos.system("/usr/local/cuda/bin/nvcc -V")',
            "import os\nos.popen('nvidia-smi | grep MiB')",
        ],
        [
            'import subprocess\nsubprocess.run(["neuron-ls"])',
            'print("run nvidia-smi first")',
            'import os\nos.system("echo nvidia")',
            "nvidia_smi = 1",
        ],
    ),
}


class TestRules(AreaCases):
    area = env.AREA
    cases = CASES


def test_a_notebooks_shell_lines_and_env_magics_are_scanned():
    # `!nvidia-smi`, `%env CUDA_VISIBLE_DEVICES=0` and a `%%bash` cell running nvcc were
    # skipped with every IPython line: a notebook's first cells passed clean
    from neuron_workbench.scan import scan_source

    cell = "!nvidia-smi\n%env CUDA_VISIBLE_DEVICES=0\nif ok:\n    !nvidia-smi -L\nout = !ls\n"
    found = [(f.rule_id, f.line, f.col) for f in scan_source(cell)]
    assert found == [("NW131", 1, 1), ("NW130", 2, 6), ("NW131", 4, 5)]
    assert [(f.rule_id, f.line) for f in scan_source("%%bash\necho hi\nnvcc --version\n")] == [
        ("NW131", 3)
    ]
    assert scan_source("%%html\n<b>nvidia-smi</b>\n") == []
