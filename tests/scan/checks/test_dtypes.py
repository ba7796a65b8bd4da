"""Dtypes and memory formats (NW180, NW182, NW193): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import dtypes

AREA = dtypes.AREA

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW180": (
        [
            "import torch\nx = torch.zeros(2, dtype=torch.float64)",
            "import torch\ntorch.set_default_dtype(torch.double)",
            "y = x.double()",
        ],
        [
            "import numpy as np\nx = np.float64(1)",
            "import torch\nx = torch.zeros(2)",
            "y = x.double(2)",
            "double = 2.0",
        ],
    ),
    "NW182": (
        [
            "import torch\nx = torch.zeros(2, dtype=torch.complex64)",
            "import torch\nz = torch.view_as_complex(x)",
            "import torch\ns = torch.fft.rfft(x)",
            "import torch\nz = torch.complex(a, b)",
        ],
        [
            "import torch\nr = torch.view_as_real(z)",
            "z = complex(1, 2)",
            "import torch\nf = torch.fft",
        ],
    ),
    "NW193": (
        [
            "import torch\nm = m.to(memory_format=torch.channels_last)",
            "import torch\nx = x.contiguous(memory_format=torch.channels_last_3d)",
        ],
        [
            "import torch\nx = x.contiguous(memory_format=torch.contiguous_format)",
            "channels_last = True",
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
