"""The torch.cuda API (NW103, NW104, NW105, NW107): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import cuda_api

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW103": (
        [
            "import torch\ntorch.cuda.synchronize()",
            "import torch as T\nT.cuda.empty_cache()",
            "from torch import cuda\nn = cuda.device_count()",
            "from torch.cuda import synchronize\nsynchronize()",
            "import torch\ns = torch.cuda.Stream()",
            "import torch\nok = torch.cuda.is_available()",
        ],
        [
            "import torch\ntorch.neuron.synchronize()",
            "cuda.synchronize()",
            "import numpy as torch_like\ntorch_like.cuda.synchronize()",
            "import torch\ntorch.accelerator.synchronize()",
        ],
    ),
    "NW104": (
        [
            "import torch\ntorch.cuda.get_device_capability()",
            "import torch\ntorch.cuda.nvtx.range_push('x')",
            "import torch\ntorch.cuda.mem_get_info()",
            "import torch\nt = torch.cuda.FloatTensor(3)",
        ],
        [
            "import torch\ntorch.neuron.get_device_name()",
            "get_device_capability()",
            "import torch\ntorch.cuda.get_device_name(0)",
        ],
    ),
    "NW105": (
        [
            "import torch\ng = torch.cuda.CUDAGraph()",
            "import torch\nwith torch.cuda.graph(g):\n    pass",
            "import torch\nf = torch.cuda.make_graphed_callables(m, (x,))",
        ],
        ["graph = build_graph()", "import torch\ng = torch.fx.Graph()"],
    ),
    "NW107": (
        [
            "from torch.cuda.amp import autocast",
            "from torch import cuda",
            "from torch.cuda import synchronize",
            "import torch.cuda as tc",  # every tc.f() stays CUDA's after the rewrite
            "import torch.cuda.nvtx as nv",
        ],
        [
            "from torch import autocast",
            "import torch.cuda_helpers_not_torch as x",
            "import torch.cuda",  # torch.cuda.f() spelled through torch: rewritten where used
            "from torch.amp import GradScaler",
        ],
    ),
}


class TestRules(AreaCases):
    area = cuda_api.AREA
    cases = CASES
