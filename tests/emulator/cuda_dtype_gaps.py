"""Derive the emulator's CUDA dtype-gap table from PyTorch's OpInfo data.

A gap is an ATen overload whose CPU kernel lacks a dtype that CUDA supports (``torch.histc`` on
int32). The table, ``emulator/coverage/cuda-dtype-gaps.json``, maps each such overload to the
dtypes concerned and, for each, the dtype the emulator computes it in: the first candidate (exact
for the source dtype, see :data:`CANDIDATES`) with which the CPU kernel runs every failing call
found and whose results, cast back, have the dtypes the meta kernel gives for the original call.

How the gaps are found: for every ``op_db`` entry and every dtype in :data:`DTYPES` that OpInfo
lists for CUDA (``dtypesIfCUDA``) but not for CPU (``dtypes``), the first :data:`MAX_SAMPLES`
samples run on CPU (forward, and backward where the op supports autograd) under a dispatch mode
that remembers the last ATen op; a "not implemented for" / "Unsupported dtype" error names the
overload that lacks the dtype. OpInfo's own lists are only the filter: the failing kernel is what
is recorded.

Usage::

    python tests/emulator/cuda_dtype_gaps.py            # print the table
    python tests/emulator/cuda_dtype_gaps.py --write    # update the packaged file
    python tests/emulator/cuda_dtype_gaps.py --check    # exit 1 when the file is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "workbench" / "neuron_workbench" / "emulator" / "coverage" / "cuda-dtype-gaps.json"
MAX_SAMPLES = 4
DTYPES = ("float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")
# Wider dtypes that hold every value of the source exactly, in order of preference (the narrowest
# first, so type promotion inside the kernel changes least).
CANDIDATES = {
    "bool": ("uint8", "int32", "int64", "float32"),
    "uint8": ("int16", "int32", "int64", "float32", "float64"),
    "int8": ("int16", "int32", "int64", "float32", "float64"),
    "int16": ("int32", "int64", "float32", "float64"),
    "int32": ("int64", "float64"),
    "int64": ("float64",),  # exact up to 2**53
    "float16": ("float32", "float64"),
    "bfloat16": ("float32", "float64"),
}
_MISSING = ("not implemented for", "Unsupported dtype")


def _overload(func: Any) -> str:
    s = func._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


def _find_failures(known: dict) -> dict[tuple[str, str], list[tuple[Any, tuple, dict]]]:
    """(overload, dtype) -> the failing calls (func, args, kwargs) seen on CPU.

    Gaps already ``known`` (``{overload: {dtype: wider}}``) are computed as the emulator computes
    them, so the ops after them (a backward) are reached.
    """
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._python_dispatch import TorchDispatchMode

    from neuron_workbench.emulator import _policy

    class Last(TorchDispatchMode):
        call: Any = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.call = (func, args, kwargs or {})
            gaps = known.get(_overload(func))
            if gaps is not None:
                return _policy.run_widened(func, gaps, list(args), kwargs or {})
            return func(*args, **(kwargs or {}))

    def tensors(obj: Any) -> list:
        if isinstance(obj, torch.Tensor):
            return [obj]
        if isinstance(obj, (list, tuple)):
            return [t for o in obj for t in tensors(o)]
        if isinstance(obj, dict):
            return [t for o in obj.values() for t in tensors(o)]
        return []

    found: dict[tuple[str, str], list] = {}
    for op in op_db:
        cuda, cpu = set(op.supported_dtypes("cuda")), set(op.supported_dtypes("cpu"))
        for name in DTYPES:
            dtype = getattr(torch, name)
            if dtype not in cuda or dtype in cpu:
                continue
            grad = op.supports_autograd and dtype.is_floating_point
            try:
                torch.manual_seed(0)
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=grad))[:MAX_SAMPLES]
            except Exception:
                continue
            for s in samples:
                mode = Last()
                try:
                    with mode:
                        out = op(s.input, *s.args, **s.kwargs)
                        outs = [t for t in tensors(out) if t.requires_grad]
                        if grad and outs:
                            torch.autograd.backward([t.float().sum() for t in outs])
                except Exception as exc:
                    text = str(exc)
                    if mode.call is None or not any(m in text for m in _MISSING):
                        continue
                    func, args, kwargs = mode.call
                    if func.namespace != "aten":
                        continue
                    found.setdefault((_overload(func), name), []).append((func, args, kwargs))
    return found


def _compute_dtype(calls: list, src: str) -> str | None:
    """The first candidate that runs every call and gives the meta kernel's output dtypes."""
    import torch

    source = getattr(torch, src)

    def conv(obj: Any, to: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            return t.to(to) if t.dtype is source else t.clone()
        if isinstance(obj, (list, tuple)):
            return type(obj)(conv(o, to) for o in obj)
        return obj

    def meta(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.detach().to("meta")
        if isinstance(obj, (list, tuple)):
            return type(obj)(meta(o) for o in obj)
        return obj

    def dtypes(out: Any, back: bool, wide: Any) -> list:
        if isinstance(out, torch.Tensor):
            return [source if back and out.dtype is wide else out.dtype]
        if isinstance(out, (list, tuple)):
            return [d for o in out for d in dtypes(o, back, wide)]
        return []

    for cand in CANDIDATES[src]:
        wide = getattr(torch, cand)
        ok = True
        for func, args, kwargs in calls:
            try:
                got = dtypes(func(*conv(args, wide), **conv(kwargs, wide)), True, wide)
            except Exception:
                ok = False
                break
            try:
                want = dtypes(func(*meta(args), **meta(kwargs)), False, None)
            except Exception:
                continue  # no meta kernel for it: the CPU run is the check
            if got != want:
                ok = False
                break
        if ok:
            return cand
    return None


def derive() -> dict[str, Any]:
    """The table: ``{"gaps": {overload: {dtype: compute dtype}}}`` (no gap without a compute dtype)."""
    warnings.simplefilter("ignore")
    import torch

    gaps: dict[str, dict[str, str]] = {}
    for _ in range(4):  # a gap found hides the ones after it (its backward): look again
        known = {
            op: {getattr(torch, a): getattr(torch, b) for a, b in d.items()}
            for op, d in gaps.items()
        }
        new = 0
        for (overload, src), calls in sorted(_find_failures(known).items()):
            if src in gaps.get(overload, {}):
                continue
            wide = _compute_dtype(calls, src)
            if wide is not None:
                gaps.setdefault(overload, {})[src] = wide
                new += 1
        if not new:
            break
    return {
        "about": "ATen overloads whose CPU kernel lacks a dtype CUDA supports (OpInfo "
        "dtypesIfCUDA vs dtypes), and the dtype the emulator computes each in; generated by "
        "tests/emulator/cuda_dtype_gaps.py",
        "torch": torch.__version__.split("+")[0],
        "gaps": gaps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="update the packaged table")
    group.add_argument("--check", action="store_true", help="exit 1 if the table is out of date")
    args = parser.parse_args(argv)
    table = derive()
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if args.write:
        TABLE.write_text(text, encoding="utf-8")
        return 0
    if args.check:
        current = json.loads(TABLE.read_text(encoding="utf-8"))
        if current.get("gaps") != table["gaps"]:
            sys.stderr.write(
                f"{TABLE.name} is out of date for torch {table['torch']}: run "
                "python tests/emulator/cuda_dtype_gaps.py --write\n"
            )
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
