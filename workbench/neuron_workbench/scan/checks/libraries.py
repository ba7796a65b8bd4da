"""Libraries that only work on NVIDIA GPUs (NW170), by import."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.rule import NEURON_LANDING, NEURON_NOTES, Rule

NW170 = Rule(
    "NW170",
    "cuda-only-library",
    "error",
    "A library that only works on NVIDIA GPUs.",
    "Replace it with the PyTorch equivalent named in the finding.",
    f"{NEURON_NOTES} §10 (custom CUDA kernels must be ported; {NEURON_LANDING}); {NEURON_NOTES} §5 "
    f"(no Inductor/Triton)",
)

_SDPA = "torch.nn.functional.scaled_dot_product_attention"
# CUDA-only libraries (NW170): import root -> replacement.
_CUDA_LIBRARIES: dict[str, str] = {
    "apex": "torch.autocast + torch.amp.GradScaler for apex.amp, torch.optim.AdamW for "
    "FusedAdam, torch.nn.LayerNorm for FusedLayerNorm, the neuron process group for apex DDP",
    "bitsandbytes": "no Neuron equivalent is documented; use torch.optim.AdamW and unquantized "
    "weights",
    "flash_attn": f"{_SDPA} (routed to an NKI kernel under torch.compile, torchneuron.md §11 "
    "TORCH_NEURONX_ENABLE_NKI_SDPA)",
    "xformers": _SDPA,
    "triton": "an NKI kernel (torchneuron.md §10)",
    "cupy": "torch ops on the device (or numpy on CPU)",
    "cupyx": "torch ops on the device (or numpy on CPU)",
    "pycuda": "torch ops on the device, or an NKI kernel",
    "pynvml": "torch.neuron.memory_* or the neuron-ls / neuron-top tools",
    "transformer_engine": "torch.autocast with dtype=torch.bfloat16",
    "tensorrt": 'torch.compile(backend="neuron")',
    "torch_tensorrt": 'torch.compile(backend="neuron")',
    "numba.cuda": "torch ops on the device, or an NKI kernel",
    "cuda": "torch ops on the device (cuda-python is NVIDIA-only)",
    "nvidia.dali": "torch.utils.data.DataLoader",
}


def _cuda_library(module: str) -> str | None:
    parts = module.split(".")
    for n in (2, 1):
        candidate = ".".join(parts[:n])
        if len(parts) >= n and candidate in _CUDA_LIBRARIES:
            return candidate
    return None


def _report(scan: Scan, node: ast.AST, lib: str) -> None:
    scan.report(
        NW170, node, f"`{lib}` only works on NVIDIA GPUs", f"replace it: {_CUDA_LIBRARIES[lib]}"
    )


def _import_from(scan: Scan, node: ast.ImportFrom) -> None:
    if node.level:
        return
    module = node.module or ""
    for full in [module] + [f"{module}.{a.name}" for a in node.names]:
        lib = _cuda_library(full)
        if lib:
            _report(scan, node, lib)
            break


def _import(scan: Scan, node: ast.Import) -> None:
    for alias in node.names:
        lib = _cuda_library(alias.name)
        if lib:
            _report(scan, node, lib)


AREA = Area("libraries", (NW170,), {ast.Import: _import, ast.ImportFrom: _import_from})
