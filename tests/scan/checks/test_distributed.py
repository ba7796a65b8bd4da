"""Distributed training (NW140): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import distributed

AREA = distributed.AREA

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


def test_cases_cover_every_rule_of_the_area():
    assert set(CASES) == {rule.id for rule in AREA.rules}
    for rule_id, (positives, lookalikes) in CASES.items():
        assert positives and lookalikes, rule_id


def test_rule_fires(rule_id, positive, rule_ids):
    assert rule_id in rule_ids(positive)


def test_rule_stays_silent_on_lookalike(rule_id, lookalike, rule_ids):
    assert rule_id not in rule_ids(lookalike)
