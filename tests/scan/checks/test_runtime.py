"""Host-side runtime (NW190, NW191, NW192): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import runtime

AREA = runtime.AREA

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


def test_cases_cover_every_rule_of_the_area():
    assert set(CASES) == {rule.id for rule in AREA.rules}
    for rule_id, (positives, lookalikes) in CASES.items():
        assert positives and lookalikes, rule_id


def test_rule_fires(rule_id, positive, rule_ids):
    assert rule_id in rule_ids(positive)


def test_rule_stays_silent_on_lookalike(rule_id, lookalike, rule_ids):
    assert rule_id not in rule_ids(lookalike)
