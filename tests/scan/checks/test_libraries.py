"""CUDA-only libraries (NW170): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import libraries

AREA = libraries.AREA

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW170": (
        [
            "import apex",
            "from apex.optimizers import FusedAdam",
            "import bitsandbytes as bnb",
            "from flash_attn import flash_attn_func",
            "import xformers.ops",
            "import triton",
            "import cupy as cp",
            "from numba import cuda",
            "import numba.cuda",
            "import pynvml",
        ],
        [
            "import numba",
            "from numba import jit",
            "import torch",
            "import apexlike",
            "import flash",
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
