"""Mixed precision (NW110, NW111, NW112, NW113): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import amp

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW110": (
        [
            'import torch\nwith torch.autocast("cuda"):\n    pass',
            'import torch\nwith torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast():\n    pass",
            "from torch.cuda.amp import autocast\nwith autocast():\n    pass",
            'import torch\nwith torch.amp.autocast("cuda"):\n    pass',
        ],
        [
            'import torch\nwith torch.autocast("neuron", dtype=torch.bfloat16):\n    pass',
            'import torch\nwith torch.autocast("cpu"):\n    pass',
            "def autocast():\n    pass\n\nwith autocast():\n    pass",
        ],
    ),
    "NW111": (
        [
            'import torch\nwith torch.autocast("cuda"):\n    pass',
            'import torch\nwith torch.autocast("neuron"):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast():\n    pass",
            "import torch\nwith torch.autocast(device_type=dev.type):\n    pass",
        ],
        [
            'import torch\nwith torch.autocast("neuron", dtype=torch.bfloat16):\n    pass',
            'import torch\nwith torch.autocast("cpu"):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast(True, torch.bfloat16):\n    pass",
        ],
    ),
    "NW112": (
        [
            'import torch\nwith torch.autocast("cuda", dtype=torch.float16):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast(dtype=torch.half):\n    pass",
        ],
        [
            'import torch\nwith torch.autocast("cuda", dtype=torch.bfloat16):\n    pass',
            'import torch\nwith torch.autocast("cpu", dtype=torch.float16):\n    pass',
            "import torch\nx = y.to(torch.float16)",
        ],
    ),
    "NW113": (
        [
            "import torch\ns = torch.cuda.amp.GradScaler()",
            "from torch.cuda.amp import GradScaler\ns = GradScaler()",
            "import torch\ns = torch.amp.GradScaler()",
            'import torch\ns = torch.amp.GradScaler("cuda")',
            "from torch.amp import GradScaler\ns = GradScaler(init_scale=1024)",
        ],
        [
            'import torch\ns = torch.amp.GradScaler("neuron")',
            "import torch\ns = torch.amp.GradScaler(device=dev)",
            "class GradScaler:\n    pass\n\ns = GradScaler()",
        ],
    ),
}


class TestRules(AreaCases):
    area = amp.AREA
    cases = CASES
