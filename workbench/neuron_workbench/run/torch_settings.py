"""Process-wide torch settings a notebook changes in its cells, mirrored into a target process.

A cell runs in the kernel's torch as earlier cells left it: ``torch.set_default_dtype``,
``torch.set_grad_enabled(False)``, deterministic algorithms, anomaly detection, the float32 matmul
precision, the cuDNN / cuBLAS flags (``torch.backends.cudnn.deterministic``,
``torch.backends.cuda.matmul.allow_tf32``) and the print options. The reference runs in the kernel
and sees them; a target in another process (a worker, a Ray actor) has its own torch, so each run
request carries the kernel's settings and the target process takes them before the run. A cell
that changes one changes it in each process, as on one machine.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def current() -> dict[str, Any]:
    """The settings of this process, as :func:`apply` takes them."""
    cudnn = torch.backends.cudnn
    matmul = torch.backends.cuda.matmul
    return {
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "anomaly": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        "deterministic": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul": {
            "allow_tf32": matmul.allow_tf32,
            "allow_fp16_reduced_precision_reduction": (
                matmul.allow_fp16_reduced_precision_reduction
            ),
            "allow_bf16_reduced_precision_reduction": (
                matmul.allow_bf16_reduced_precision_reduction
            ),
        },
        "cudnn": {
            "enabled": cudnn.enabled,
            "benchmark": cudnn.benchmark,
            "deterministic": cudnn.deterministic,
            "allow_tf32": cudnn.allow_tf32,
        },
        "print_options": _print_options(),
    }


def _print_options() -> dict[str, Any]:
    get = getattr(torch._tensor_str, "get_printoptions", None)  # not public: may go
    return dict(get()) if get is not None else {}


def apply(settings: dict[str, Any] | None) -> None:
    """Take ``settings`` (another process's :func:`current`) in this process.

    A setting this torch does not have (another version's) is left as it is.
    """
    if not settings:
        return
    if settings.get("default_dtype") is not None:
        torch.set_default_dtype(settings["default_dtype"])
    if "grad_enabled" in settings:
        torch.set_grad_enabled(settings["grad_enabled"])
    if "anomaly" in settings:
        enabled, check_nan = settings["anomaly"]
        torch.autograd.set_detect_anomaly(enabled, check_nan)
    if "deterministic" in settings:
        enabled, warn_only = settings["deterministic"]
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    if "float32_matmul_precision" in settings:
        torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    options = settings.get("print_options")
    if options and options != _print_options():
        with contextlib.suppress(TypeError):
            torch.set_printoptions(**options)
    for owner, flags in (
        (torch.backends.cuda.matmul, settings.get("cuda_matmul", {})),
        (torch.backends.cudnn, settings.get("cudnn", {})),
    ):
        for name, value in flags.items():
            with contextlib.suppress(AttributeError, RuntimeError, TypeError):
                if getattr(owner, name) != value:
                    setattr(owner, name, value)
