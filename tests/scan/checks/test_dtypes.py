"""Dtypes and memory formats (NW180, NW182, NW193): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import dtypes

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW180": (
        [
            "import torch\nx = torch.zeros(2, dtype=torch.float64)",
            "import torch\ntorch.set_default_dtype(torch.double)",
            "y = x.double()",
            'import torch\nx = torch.zeros(2, dtype=torch.float64, device="cuda")',
            "import torch\nx = torch.zeros(2, dtype=torch.float64, device=dev)",
        ],
        [
            "import numpy as np\nx = np.float64(1)",
            "import torch\nx = torch.zeros(2)",
            "y = x.double(2)",
            "double = 2.0",
            # made on the CPU, where float64 stays float64 (a metric kept in double on the host)
            'import torch\nx = torch.zeros(2, dtype=torch.float64, device="cpu")',
            'import torch\nx = torch.zeros(2, device=torch.device("cpu"), dtype=torch.double)',
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


class TestRules(AreaCases):
    area = dtypes.AREA
    cases = CASES
