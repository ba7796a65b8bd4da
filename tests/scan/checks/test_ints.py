"""Integers outside int32 (NW181): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import ints

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW181": (
        [
            "import torch\nx = torch.full((2,), 2**40)",
            "y = ids * 6364136223846793005",
            "import torch\nt = torch.tensor([3_000_000_000])",
            "import torch\nm = torch.iinfo(torch.int64).max",
        ],
        [
            "import torch\nx = torch.full((2,), 2**31 - 1)",
            "N = 2**40",
            "import torch\ntorch.manual_seed(2**32)",
            "import torch\nx = torch.tensor([-2**31])",
            "y = ids * 1000",
        ],
    ),
}


class TestRules(AreaCases):
    area = ints.AREA
    cases = CASES
