"""Custom GPU code: C++/CUDA extensions (NW160) and Triton/Numba/CuPy/PyCUDA kernels (NW161)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.context import arg, is_true, kwarg, str_value
from neuron_workbench.scan.rule import NEURON_LANDING, NEURON_NOTES, Rule

NW160 = Rule(
    "NW160",
    "cuda-extension",
    "error",
    "A C++/CUDA extension built from CUDA sources cannot run on the target.",
    "Port the kernel to NKI (`@nki.jit` + `torch_neuronx.nki_op`), or express it in PyTorch ops.",
    f"{NEURON_NOTES} §10 (custom CUDA/Triton kernels become NKI kernels; {NEURON_LANDING})",
)
NW161 = Rule(
    "NW161",
    "gpu-kernel",
    "error",
    "A GPU kernel written with Triton, Numba CUDA, CuPy or PyCUDA cannot run on the target.",
    "Port the kernel to NKI (`@nki.jit` + `torch_neuronx.nki_op`), or express it in PyTorch ops.",
    f"{NEURON_NOTES} §10 (custom CUDA/Triton kernels become NKI kernels; {NEURON_LANDING})",
)

_EXT_LOAD = "torch.utils.cpp_extension.load"
_EXT_LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
_EXT_CUDA_EXTENSION = "torch.utils.cpp_extension.CUDAExtension"
_KERNEL_DECORATORS = {
    "triton.jit",
    "triton.autotune",
    "triton.heuristics",
    "numba.cuda.jit",
    "numba.cuda.reduce",
}
_KERNEL_CALLS = {
    "cupy.RawKernel",
    "cupy.RawModule",
    "cupy.ElementwiseKernel",
    "cupy.ReductionKernel",
    "pycuda.compiler.SourceModule",
    "numba.cuda.jit",
}


def _call(scan: Scan, node: ast.Call) -> None:
    qn = scan.qn(node.func)
    if qn in (_EXT_LOAD, _EXT_LOAD_INLINE, _EXT_CUDA_EXTENSION):
        _extension(scan, node, qn)
    elif qn in _KERNEL_CALLS:
        scan.report(NW161, node, f"`{qn}` compiles a CUDA kernel")


def _extension(scan: Scan, node: ast.Call, qn: str) -> None:
    name = qn.rsplit(".", 1)[-1]
    if qn == _EXT_CUDA_EXTENSION:
        scan.report(NW160, node, "`CUDAExtension` builds CUDA code")
        return
    cuda = is_true(kwarg(node, "with_cuda")) or kwarg(node, "extra_cuda_cflags") is not None
    if qn == _EXT_LOAD_INLINE:
        src = arg(node, 2, "cuda_sources")
        cuda = cuda or (
            src is not None and not (isinstance(src, ast.Constant) and src.value is None)
        )
    else:
        sources = arg(node, 1, "sources")
        items = sources.elts if isinstance(sources, (ast.List, ast.Tuple)) else [sources]
        cuda = cuda or any((str_value(s) or "").endswith((".cu", ".cuh")) for s in items)
    if cuda:
        scan.report(NW160, node, f"`{name}` compiles CUDA sources into an extension")


def _function_def(scan: Scan, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    for deco in node.decorator_list:
        # Call decorators listed in _KERNEL_CALLS are reported by the call hook.
        qn = scan.qn(deco.func if isinstance(deco, ast.Call) else deco)
        if qn in _KERNEL_DECORATORS and not (isinstance(deco, ast.Call) and qn in _KERNEL_CALLS):
            scan.report(NW161, deco, f"`@{qn}` defines a GPU kernel (`{node.name}`)")


AREA = Area(
    "kernels",
    (NW160, NW161),
    {ast.Call: _call, ast.FunctionDef: _function_def, ast.AsyncFunctionDef: _function_def},
)
