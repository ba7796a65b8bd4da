"""Distributed training (NW140, NW141): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import distributed

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW140": (
        [
            'import torch.distributed as dist\ndist.init_process_group("nccl")',
            'import torch.distributed as dist\ndist.init_process_group(backend="nccl", rank=0)',
            'import torch.distributed as dist\ng = dist.new_group([0, 1], backend="nccl")',
            "import torch.distributed as dist\nb = dist.Backend.NCCL",
            'import torch.distributed as dist\ndist.init_process_group("cpu:gloo,cuda:nccl")',
        ],
        [
            'import torch.distributed as dist\ndist.init_process_group("neuron")',
            'print("nccl")',
            'import torch.distributed as dist\ndist.init_process_group(backend="gloo")',
        ],
    ),
    "NW141": (
        [
            "import torch.nn as nn\nm = nn.DataParallel(nn.Linear(2, 2))",
            "import torch\nm = torch.nn.DataParallel(model).cuda()",
            "from torch.nn import DataParallel\nm = DataParallel(model, device_ids=[0, 1])",
            "from torch.nn.parallel import data_parallel\ny = data_parallel(model, x)",
        ],
        [
            "import torch.nn as nn\nm = nn.parallel.DistributedDataParallel(model)",
            "class DataParallel:\n    pass\nm = DataParallel()",
            'print("DataParallel")',
        ],
    ),
}


class TestRules(AreaCases):
    area = distributed.AREA
    cases = CASES
