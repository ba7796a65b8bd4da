"""CUDA backend settings (NW120, NW121): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import backend_flags

AREA = backend_flags.AREA

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


def test_cases_cover_every_rule_of_the_area():
    assert set(CASES) == {rule.id for rule in AREA.rules}
    for rule_id, (positives, lookalikes) in CASES.items():
        assert positives and lookalikes, rule_id


def test_rule_fires(rule_id, positive, rule_ids):
    assert rule_id in rule_ids(positive)


def test_rule_stays_silent_on_lookalike(rule_id, lookalike, rule_ids):
    assert rule_id not in rule_ids(lookalike)
