"""Integers outside int32 (NW181): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import ints

AREA = ints.AREA

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


def test_cases_cover_every_rule_of_the_area():
    assert set(CASES) == {rule.id for rule in AREA.rules}
    for rule_id, (positives, lookalikes) in CASES.items():
        assert positives and lookalikes, rule_id


def test_rule_fires(rule_id, positive, rule_ids):
    assert rule_id in rule_ids(positive)


def test_rule_stays_silent_on_lookalike(rule_id, lookalike, rule_ids):
    assert rule_id not in rule_ids(lookalike)
