"""Shared by tests/views: a report of a model with known CPU fallbacks on emulated neuron."""

import torch
import torch.nn as nn

from neuron_workbench.cell.pipeline import compare_cell
from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.run import compile_cell
from neuron_workbench.trace.profile import op_profiler


class SortNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 7 * 7, 6)

    def forward(self, x):
        y = self.head(torch.flatten(self.features(x), 1))
        return torch.sort(y, dim=1).values


CELL = """model = SortNet().to("cuda")
out = model(images.to("cuda"))
out.sum().backward()
"""

FALLBACK_OPS = [
    "aten::max_pool2d_with_indices",
    "aten::max_pool2d_with_indices_backward",
    "aten::sort",
]


def make_report():
    torch.manual_seed(0)
    ns = {
        "__name__": "__main__",
        "torch": torch,
        "SortNet": SortNet,
        "images": torch.randn(2, 3, 16, 16),
    }
    result = compare_cell(
        compile_cell(CELL),
        ns,
        CompareOptions(ref="cpu", target="neuron"),
        instruments={"profile": op_profiler},
    )
    return result.report
