"""CUDA-only libraries (NW170): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import libraries

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


class TestRules(AreaCases):
    area = libraries.AREA
    cases = CASES
