"""Host-side runtime: CUDA generators (NW190), pinned memory (NW191), the fork start method (NW192)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.checks.devices import CUDA_DEVICE
from neuron_workbench.scan.context import arg, is_true, str_value
from neuron_workbench.scan.rule import NEURON_NOTES, NEURON_SOURCE, Rule

NW190 = Rule(
    "NW190",
    "cuda-generator",
    "error",
    "`torch.Generator` on a CUDA device; per-device generators are not guaranteed on the target.",
    "Use a CPU `torch.Generator()` (or `torch.manual_seed`); do not expect CUDA's random streams.",
    f'{NEURON_NOTES} §7 (RNG: torch.Generator(device="neuron") was unavailable in a beta, [3P]); '
    f"{NEURON_NOTES} §10 (RNG parity not guaranteed)",
)
NW191 = Rule(
    "NW191",
    "pin-memory",
    "info",
    "Pinned host memory behaves differently on the target.",
    "Usually harmless; drop `pin_memory=True` if host-to-device copies misbehave.",
    f"{NEURON_NOTES} §10 (pin_memory: isPinnedPtr always true, PrivateUse1 host allocator; "
    f"{NEURON_SOURCE})",
)
NW192 = Rule(
    "NW192",
    "fork-start-method",
    "warning",
    "The Neuron runtime cannot be re-initialised in a forked child.",
    'Use the "spawn" start method.',
    f"{NEURON_NOTES} §2 (fork safety: 'use the spawn start method'; {NEURON_SOURCE})",
)

_FORK_CALLS = {
    "multiprocessing.set_start_method",
    "torch.multiprocessing.set_start_method",
    "multiprocessing.get_context",
    "torch.multiprocessing.get_context",
}


def _call(scan: Scan, node: ast.Call) -> None:
    func = node.func
    qn = scan.qn(func)
    if isinstance(func, ast.Attribute) and qn is None:
        if func.attr == "pin_memory" and not node.args:
            scan.report(NW191, node, "`.pin_memory()` pins host memory", pos=scan.attr_pos(func))
    elif qn == "torch.Generator":
        scan.device_arg_checked.add(id(node))
        _generator(scan, node)
    elif qn in _FORK_CALLS and str_value(arg(node, 0, "method")) == "fork":
        scan.report(
            NW192,
            node,
            f'`{qn}("fork")`: the Neuron runtime cannot be re-initialised in a forked child',
        )
    for kw in node.keywords:
        if kw.arg == "pin_memory" and is_true(kw.value):
            scan.report(NW191, kw.value, "`pin_memory=True` pins host memory for the accelerator")


def _generator(scan: Scan, node: ast.Call) -> None:
    device = arg(node, 0, "device")
    targets = [device.body, device.orelse] if isinstance(device, ast.IfExp) else [device]
    inner = [
        arg(d, 0, "type")
        for d in targets
        if isinstance(d, ast.Call) and scan.qn(d.func) == "torch.device"
    ]
    for d in targets + inner:
        value = str_value(d)
        head = str_value(d.values[0]) if isinstance(d, ast.JoinedStr) and d.values else None
        if (value and CUDA_DEVICE.fullmatch(value)) or (head and head.startswith("cuda")):
            assert d is not None
            scan.claimed.add(id(d))
            scan.report(NW190, node, "`torch.Generator` on a CUDA device")
            return


AREA = Area("runtime", (NW190, NW191, NW192), {ast.Call: _call})
