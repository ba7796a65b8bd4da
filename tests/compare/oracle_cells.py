"""A training cell the precision-budget tests run on the cpu reference and its float64 oracle."""

import torch

from neuron_workbench.run import RunSpec, compile_cell

TRAINING = (
    "torch.manual_seed(1)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
    'x = torch.randn(8, 16, device="cuda")\n'
    "drop = torch.nn.functional.dropout(x, 0.5)\n"
    "for _ in range(2):\n"
    "    out = model.cuda()(x)\n"
    "    loss = out.float().pow(2).mean()\n"
    "    opt.zero_grad(); loss.backward(); opt.step()\n"
    "value = loss.item()\n"
)


def spec_of(source, namespace=None):
    """The run spec of ``source`` in ``namespace`` (a fresh one with torch by default)."""
    namespace = {"torch": torch} if namespace is None else namespace
    return RunSpec(compile_cell(source), namespace)
