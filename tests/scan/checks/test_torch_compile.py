"""torch.compile options (NW150, NW151, NW152): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import torch_compile

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW150": (
        [
            'import torch\nm = torch.compile(m, mode="max-autotune")',
            'import torch\n@torch.compile(mode="reduce-overhead")\ndef f(x):\n    return x',
        ],
        [
            'import torch\nm = torch.compile(m, mode="default")',
            "import torch\nm = torch.compile(m)",
            'mode = "max-autotune"',
        ],
    ),
    "NW151": (
        ["import torch\nm = torch.compile(m, dynamic=True)"],
        ["import torch\nm = torch.compile(m, dynamic=False)", "f(dynamic=True)"],
    ),
    "NW152": (
        [
            'import torch\nm = torch.compile(m, backend="inductor")',
            'import torch\nm = torch.compile(m, backend="cudagraphs")',
        ],
        [
            'import torch\nm = torch.compile(m, backend="neuron")',
            'import torch\nm = torch.compile(m, backend="aot_eager")',
        ],
    ),
}


class TestRules(AreaCases):
    area = torch_compile.AREA
    cases = CASES
