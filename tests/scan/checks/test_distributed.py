"""Distributed training (NW140): each rule fires on its snippets and not on look-alikes."""

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
}


class TestRules(AreaCases):
    area = distributed.AREA
    cases = CASES
