"""CUDA backend settings (NW120, NW121): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import backend_flags

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW120": (
        [
            "import torch\ntorch.backends.cudnn.benchmark = True",
            "import torch\ntorch.backends.cudnn.deterministic = True",
            "from torch.backends import cudnn\ncudnn.enabled = False",
        ],
        ["import torch\ntorch.use_deterministic_algorithms(True)", "cudnn.benchmark = True"],
    ),
    "NW121": (
        [
            "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True",
            "import torch\ntorch.backends.cuda.enable_flash_sdp(False)",
        ],
        ['import torch\ntorch.set_float32_matmul_precision("high")', "backends.cuda.x = 1"],
    ),
}


class TestRules(AreaCases):
    area = backend_flags.AREA
    cases = CASES
