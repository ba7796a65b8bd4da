"""CUDA environment variables (NW130), in ``os.environ``, ``os.getenv`` and ``{...}`` entries."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.context import str_value
from neuron_workbench.scan.rule import NEURON_ENV, NEURON_NOTES, TPU_NOTES, Rule

NW130 = Rule(
    "NW130",
    "cuda-env-var",
    "warning",
    "A CUDA environment variable, which the target runtime ignores.",
    "`NEURON_RT_VISIBLE_CORES` for device selection, `NEURON_LAUNCH_BLOCKING` for synchronous "
    "launches; set them before `import torch`.",
    f"{NEURON_NOTES} §11 ({NEURON_ENV}); {NEURON_NOTES} §3 (env vars must be set before import "
    f"torch); {TPU_NOTES} §7",
)

# CUDA environment variables (NW130): name -> (neuron replacement, tpu replacement).
CUDA_ENV: dict[str, tuple[str, str]] = {
    "CUDA_VISIBLE_DEVICES": (
        "NEURON_RT_VISIBLE_CORES (NeuronCore ids, not GPU ids; torchneuron.md §11)",
        "no TorchTPU equivalent is given in the notes (torchtpu.md §7 lists only topology "
        "variables such as TORCH_TPU_DEVICES_PER_HOST)",
    ),
    "CUDA_LAUNCH_BLOCKING": ("NEURON_LAUNCH_BLOCKING=1", "TPU_LAUNCH_BLOCKING=1"),
    "PYTORCH_CUDA_ALLOC_CONF": (
        "no documented equivalent for the Neuron caching allocator (torchneuron.md §11 lists the "
        "allocator variables as unknown)",
        "no equivalent is given in the notes",
    ),
    "CUDA_DEVICE_ORDER": ("no equivalent; remove it", "no equivalent; remove it"),
    "CUDA_MODULE_LOADING": ("no equivalent; remove it", "no equivalent; remove it"),
}


def _prepare(scan: Scan, tree: ast.Module) -> None:
    # Environment lookups are calls whose string argument is not otherwise a device position;
    # they are claimed before the walk so that no other check reads the name as a device.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            _env_call(scan, node)


def _env_call(scan: Scan, node: ast.Call) -> None:
    qn = scan.qn(node.func)
    func = node.func
    is_env = qn in ("os.getenv", "os.putenv", "os.unsetenv") or (
        isinstance(func, ast.Attribute)
        and func.attr in ("get", "setdefault", "pop")
        and scan.qn(func.value) == "os.environ"
    )
    if is_env and node.args and str_value(node.args[0]) in CUDA_ENV:
        _report(scan, node.args[0])


def _report(scan: Scan, node: ast.AST) -> None:
    if id(node) in scan.claimed:
        return
    scan.claimed.add(id(node))
    name = str_value(node) or ""
    neuron, tpu = CUDA_ENV[name]
    scan.report(
        NW130,
        node,
        f"`{name}` is ignored by the {scan.target} runtime",
        neuron if scan.target == "neuron" else tpu,
    )


def _dict(scan: Scan, node: ast.Dict) -> None:
    for key in node.keys:
        if str_value(key) in CUDA_ENV:
            assert key is not None
            _report(scan, key)


def _subscript(scan: Scan, node: ast.Subscript) -> None:
    if str_value(node.slice) in CUDA_ENV:
        _report(scan, node.slice)


AREA = Area("env", (NW130,), {ast.Dict: _dict, ast.Subscript: _subscript}, prepare=_prepare)
