"""The compiled cells several test folders run: an MLP compiled and called with two batch sizes
(a recompile on the target) and a compiled function with a ``print`` inside (a graph break)."""

MLP_SETUP = (
    "import torch\n"
    "import torch.nn as nn\n"
    "torch.manual_seed(0)\n"
    "mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))"
)


def compiled_mlp_cell(batches: tuple[int, int] = (3, 5), flags: str = "-o r") -> str:
    """The ``%%neuron`` cell; batch sizes of its own keep a worker that compiled ``mlp`` for others
    in an earlier test compiling again."""
    first, second = batches
    return (
        f"%%neuron {flags}".rstrip() + "\n"
        "cm = torch.compile(mlp.cuda())\n"
        f"a = cm(torch.ones({first}, 8).cuda())\n"
        f"b = cm(torch.ones({second}, 8).cuda())\n"
        "def f(t):\n"
        "    t = t.sin()\n"
        "    print('inside')\n"
        "    return t.cos()\n"
        "y = torch.compile(f)(torch.ones(3).cuda())"
    )
