"""Host-side runtime (NW190, NW191, NW192): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import runtime

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW190": (
        [
            'import torch\ng = torch.Generator(device="cuda")',
            'import torch\ng = torch.Generator("cuda:0")',
            'import torch\ng = torch.Generator(torch.device("cuda"))',
        ],
        [
            "import torch\ng = torch.Generator()",
            'import torch\ng = torch.Generator(device="cpu")',
            'g = Generator(device="cuda")',
        ],
    ),
    "NW191": (
        [
            "from torch.utils.data import DataLoader\nl = DataLoader(ds, pin_memory=True)",
            "y = x.pin_memory()",
        ],
        [
            "from torch.utils.data import DataLoader\nl = DataLoader(ds, pin_memory=False)",
            "pin_memory = True",
        ],
    ),
    "NW192": (
        [
            'import torch.multiprocessing as mp\nmp.set_start_method("fork")',
            'import multiprocessing\nctx = multiprocessing.get_context("fork")',
        ],
        ['import torch.multiprocessing as mp\nmp.set_start_method("spawn")', 'fork("x")'],
    ),
}


class TestRules(AreaCases):
    area = runtime.AREA
    cases = CASES
