"""torch.compile options (NW150, NW151, NW152): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import torch_compile

AREA = torch_compile.AREA

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


def test_cases_cover_every_rule_of_the_area():
    assert set(CASES) == {rule.id for rule in AREA.rules}
    for rule_id, (positives, lookalikes) in CASES.items():
        assert positives and lookalikes, rule_id


def test_rule_fires(rule_id, positive, rule_ids):
    assert rule_id in rule_ids(positive)


def test_rule_stays_silent_on_lookalike(rule_id, lookalike, rule_ids):
    assert rule_id not in rule_ids(lookalike)
