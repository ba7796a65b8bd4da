"""Process-wide torch settings a notebook changes in its cells, mirrored into a target process.

A cell runs in the kernel's torch as earlier cells left it: ``torch.set_default_dtype``,
``torch.set_grad_enabled(False)``, deterministic algorithms, anomaly detection, the float32 matmul
precision, the cuDNN / cuBLAS flags (``torch.backends.cudnn.deterministic``,
``torch.backends.cuda.matmul.allow_tf32``), the attention kernels ``scaled_dot_product_attention``
may pick (``torch.backends.cuda.enable_flash_sdp(False)``), the print options, the
``torch._dynamo.config`` values a cell changed (``capture_scalar_outputs = True``,
``recompile_limit``), the compiler's stance (``torch.compiler.set_stance("force_eager")``) and
its resets (``torch._dynamo.reset()``, ``torch.compiler.reset()``: counted, see
:func:`remember_dynamo_resets`), and the globals ``torch.serialization.add_safe_globals``
allowed for ``torch.load(..., weights_only=True)`` (a checkpoint holding a notebook's config dataclass). The
reference runs in the kernel and sees them; a target in another process (a worker, a Ray actor)
has its own torch, so each run request carries the kernel's settings and the target process takes
them before the run. A cell that changes one changes it in each process, as on one machine.

A backend may define its own default for a setting: TorchTPU computes float32 matmuls in its
DEFAULT mode (one bf16 pass) until the program asks for more, which torch reports as "medium"
where a CUDA machine reports "highest". The kernel's setting at torch's own default therefore
leaves the target at its backend's default; only a value the notebook chose travels. Once the
extension is loaded, a call of ``torch.set_float32_matmul_precision`` in the kernel (a plain cell's,
or a ``%%neuron`` cell's reference run) counts as a choice, "highest" too
(:func:`remember_chosen_precision`): the report's hint for a TPU's one-pass matmuls is that call.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch


def _deterministic() -> tuple[bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


def current() -> dict[str, Any]:
    """The settings of this process, as :func:`apply` takes them (one torch cannot read: left out)."""
    cudnn = torch.backends.cudnn
    cuda = torch.backends.cuda
    matmul = cuda.matmul
    readers: dict[str, Callable[[], Any]] = {
        "default_dtype": torch.get_default_dtype,
        "grad_enabled": torch.is_grad_enabled,
        "anomaly": lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        "deterministic": _deterministic,
        # cuBLAS's allow_tf32 is this setting too ("high" is TF32), so it travels as this alone
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda_matmul": lambda: {
            "allow_fp16_reduced_precision_reduction": (
                matmul.allow_fp16_reduced_precision_reduction
            ),
            "allow_bf16_reduced_precision_reduction": (
                matmul.allow_bf16_reduced_precision_reduction
            ),
        },
        "cudnn": lambda: {
            "enabled": cudnn.enabled,
            "benchmark": cudnn.benchmark,
            "deterministic": cudnn.deterministic,
            "allow_tf32": cudnn.allow_tf32,
        },
        "print_options": _print_options,
        # the attention kernels scaled_dot_product_attention may pick (enable_flash_sdp(False))
        "sdp_kernels": lambda: {name: getattr(cuda, f"{name}_enabled")() for name in _SDP_KERNELS},
        "safe_globals": _safe_globals,
    }
    settings: dict[str, Any] = {"float32_matmul_precision_chosen": _chosen[0]}
    for key, read in readers.items():
        # torch refuses to read the matmul precision once a program mixed its legacy and new
        # TF32 switches ("PyTorch is checking the matmul precision without a specific backend")
        with contextlib.suppress(RuntimeError, AttributeError):
            settings[key] = read()
    # Only a program that compiles imports Dynamo, and most change none of its config: the key is
    # there when one did (its absence sets the target's back to torch's defaults).
    if "torch._dynamo.config" in sys.modules and (dynamo := _dynamo_config()):
        settings["dynamo_config"] = dynamo
    # The same for the compiler's stance (``torch.compiler.set_stance("force_eager")``).
    if (stance := _compile_stance()) is not None:
        settings["compile_stance"] = stance
    # The resets of its caches, counted once Dynamo is loaded (before that, nothing to reset).
    remember_dynamo_resets()
    settings["dynamo_resets"] = _resets[0]
    return settings


#: The attention kernels ``torch.backends.cuda`` switches (``enable_flash_sdp(False)``).
_SDP_KERNELS = ("flash_sdp", "mem_efficient_sdp", "math_sdp", "cudnn_sdp")

_NO_DEFAULT = object()
#: Values a request's ``torch._dynamo.config`` settings may hold: they travel to another process.
_PLAIN = (bool, int, float, str, type(None))


def _dynamo_config() -> dict[str, Any]:
    """The ``torch._dynamo.config`` values this process changed from torch's defaults.

    Only plain values (flags, limits, names, and lists or sets of them) travel: a callable hook
    belongs to the process that set it.
    """
    config = sys.modules["torch._dynamo.config"]
    changed = config._get_dict(skip_default=True)  # type: ignore[attr-defined]
    defaults = config._config  # type: ignore[attr-defined]
    return {
        name: value
        for name, value in changed.items()
        # a value set back to its default counts as set (config.patch, which torch.export uses,
        # leaves eleven such): it is torch's default, sent for nothing
        if (name not in defaults or value != defaults[name].default)
        and (
            isinstance(value, _PLAIN)
            or (
                isinstance(value, (list, tuple, set, frozenset))
                and all(isinstance(item, _PLAIN) for item in value)
            )
        )
    }


#: The ``torch._dynamo.config`` names :func:`apply` set here: set back to torch's default once the
#: kernel's value goes back to it.
_dynamo_applied: set[str] = set()


def _apply_dynamo_config(values: dict[str, Any]) -> None:
    """Set ``torch._dynamo.config`` as ``values`` (another process's changed ones) say."""
    import torch._dynamo.config as config

    for name in _dynamo_applied - values.keys():
        with contextlib.suppress(AttributeError, KeyError, TypeError):
            setattr(config, name, config._config[name].default)  # type: ignore[attr-defined]
    _dynamo_applied.clear()
    for name, value in values.items():
        with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
            if getattr(config, name) != value:
                setattr(config, name, value)
            _dynamo_applied.add(name)


def _compile_stance() -> dict[str, Any] | None:
    """The ``torch.compiler.set_stance`` this process is at, None at torch's default.

    A backend it forces travels by name only: a callable one belongs to the process that set it.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    stance = getattr(eval_frame, "_stance", None)
    if stance is None:
        return None
    backend = stance.backend if isinstance(stance.backend, str) else None
    if stance.stance == "default" and not stance.skip_guard_eval_unsafe and backend is None:
        return None
    return {
        "stance": stance.stance,
        "skip_guard_eval_unsafe": bool(stance.skip_guard_eval_unsafe),
        "force_backend": backend,
    }


def _apply_compile_stance(stance: dict[str, Any] | None) -> None:
    """Set the compiler's stance as ``stance`` (another process's; None: torch's default) says.

    Dynamo is imported only for a stance other than the default: a process that has not imported
    it is at the default.
    """
    if stance == _compile_stance():
        return
    import torch.compiler

    stance = stance or {}
    with contextlib.suppress(RuntimeError, ValueError, TypeError):
        torch.compiler.set_stance(
            stance.get("stance", "default"),
            skip_guard_eval_unsafe=bool(stance.get("skip_guard_eval_unsafe", False)),
            force_backend=stance.get("force_backend"),
        )


#: How many times this process reset Dynamo (see :func:`remember_dynamo_resets`), a target process
#: as the kernel's count it last took.
_resets = [0]


def remember_dynamo_resets() -> bool:
    """Make ``torch._dynamo.reset`` count its calls, once Dynamo is loaded (once per process).

    ``torch.compiler.reset()`` calls it too. A reset in a plain cell emptied the kernel's compile
    caches only: a target process kept the graphs it had, and the next cell recompiled on the
    reference alone. The count travels with the settings, and a target process whose count differs
    resets before its run (:func:`apply`). A reset inside a ``%%neuron`` cell runs in each run
    and is counted in each process, so it is not done again.

    Returns
    -------
    bool
        Whether resets are counted (Dynamo is loaded in this process).
    """
    dynamo = sys.modules.get("torch._dynamo")
    reset = getattr(dynamo, "reset", None)
    if reset is None:  # not loaded yet, or still loading
        return False
    if getattr(reset, "_workbench_counts", False):
        return True

    @functools.wraps(reset)
    def counted_reset() -> None:
        reset()
        _resets[0] += 1

    counted_reset._workbench_counts = True  # type: ignore[attr-defined]
    dynamo.reset = counted_reset  # type: ignore[union-attr]
    return True


def _apply_dynamo_resets(count: int) -> None:
    """Reset Dynamo here unless this process already did the resets ``count`` (the kernel's) says."""
    remember_dynamo_resets()  # a reset inside the next run is counted here, as in the kernel
    if count == _resets[0]:
        return
    import torch._dynamo

    remember_dynamo_resets()
    torch._dynamo.reset()
    _resets[0] = count  # what this reset counted was the kernel's


def _matmul_precision() -> str | None:
    """The float32 matmul precision of this process (None where torch refuses to read it)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


def _safe_globals() -> list[Any]:
    """The globals ``torch.load(weights_only=True)`` may rebuild here, as the notebook allowed them.

    One that cannot be pickled (a function closing over a lock) stays behind, rather than every
    cell failing to reach its target.
    """
    from neuron_workbench.run.library_state import can_travel

    allowed = [entry for entry in torch.serialization.get_safe_globals() if can_travel(entry)]
    return sorted(allowed, key=_global_name)  # torch keeps a set: in the order of their names


def _global_name(entry: Any) -> str:
    """The name a checkpoint gives a safe global (a ``(global, name)`` pair names it itself)."""
    if isinstance(entry, tuple):
        return str(entry[1])
    return f"{getattr(entry, '__module__', '')}.{getattr(entry, '__qualname__', repr(entry))}"


def _apply_safe_globals(allowed: list[Any]) -> None:
    """Allow exactly ``allowed`` (another process's), with what this process allowed on its own.

    The list is set anew each time, not added to: a class the notebook defined again arrives as a
    new class of the same name, and the one a load rebuilds must be the cell's.
    """
    wanted = sorted(dict.fromkeys([*_own.get("safe_globals", []), *allowed]), key=_global_name)
    if _safe_globals() == wanted:
        return
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(wanted)


def _print_options() -> dict[str, Any]:
    get = getattr(torch._tensor_str, "get_printoptions", None)  # not public: may go
    return dict(get()) if get is not None else {}


#: Settings a backend may default differently, with torch's own default: at that value the target
#: process keeps its backend's default.
BACKEND_DEFAULTED = {"float32_matmul_precision": "highest"}
#: A target process's own settings, as its device left them (see :func:`keep_own`).
_own: dict[str, Any] = {}
#: Whether the notebook called ``torch.set_float32_matmul_precision`` here (see
#: :func:`remember_chosen_precision`).
_chosen = [False]


def remember_chosen_precision() -> None:
    """Make ``torch.set_float32_matmul_precision`` remember that the notebook chose (once per process).

    Without it a precision set to torch's own default ("highest") could not be told from none:
    the target's backend kept its own default (a TPU's one-pass bf16 matmuls), also in the cells
    after one that set it, where the kernel's stays as it was set.
    """
    set_precision = torch.set_float32_matmul_precision
    if getattr(set_precision, "_workbench_remembers", False):
        return

    @functools.wraps(set_precision)
    def set_float32_matmul_precision(precision: str) -> None:
        set_precision(precision)
        _chosen[0] = True

    set_float32_matmul_precision._workbench_remembers = True  # type: ignore[attr-defined]
    torch.set_float32_matmul_precision = set_float32_matmul_precision


def forget_chosen_precision() -> None:
    """As before any call of ``torch.set_float32_matmul_precision`` (a fresh notebook: tests)."""
    _chosen[0] = False


def keep_own() -> None:
    """Remember this process's settings as its backend's own (a target process, device ready).

    Only then does :func:`apply` keep a backend default where the kernel has torch's; a process
    that never called it (the kernel) takes settings exactly.
    """
    _own.clear()
    _own.update(current())


def apply(settings: dict[str, Any] | None) -> None:
    """Take ``settings`` (another process's :func:`current`) in this process.

    A setting this torch does not have (another version's) is left as it is; one of
    :data:`BACKEND_DEFAULTED` at torch's default goes back to this process's own.
    """
    if not settings:
        return
    defaulted = dict(BACKEND_DEFAULTED)
    chosen = bool(settings.get("float32_matmul_precision_chosen", False))
    if "float32_matmul_precision_chosen" in settings:  # taken too: current() gives it back
        _chosen[0] = chosen
    if chosen:
        defaulted.pop("float32_matmul_precision")  # the notebook's choice, torch's default too
    settings = {
        key: _own.get(key, value) if defaulted.get(key, _NO_DEFAULT) == value else value
        for key, value in settings.items()
    }
    if settings.get("default_dtype") is not None:
        torch.set_default_dtype(settings["default_dtype"])
    if "grad_enabled" in settings:
        torch.set_grad_enabled(settings["grad_enabled"])
    if "anomaly" in settings:
        enabled, check_nan = settings["anomaly"]
        torch.autograd.set_detect_anomaly(enabled, check_nan)
    if "deterministic" in settings:
        enabled, warn_only = settings["deterministic"]
        # only when it changes: torch's setter imports Inductor first (over a second in a new
        # worker, which then answered its first cell that much later)
        if (enabled, warn_only) != _deterministic():
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    precision = settings.get("float32_matmul_precision")
    if precision is not None and precision != _matmul_precision():
        set_precision = torch.set_float32_matmul_precision
        if getattr(set_precision, "_workbench_remembers", False):
            set_precision = set_precision.__wrapped__  # taking a setting is no choice of its own
        with contextlib.suppress(RuntimeError):
            set_precision(precision)
    dynamo = settings.get("dynamo_config")
    if dynamo is not None or _dynamo_applied:
        _apply_dynamo_config(dynamo or {})
    _apply_compile_stance(settings.get("compile_stance"))
    if settings.get("dynamo_resets") is not None:
        _apply_dynamo_resets(settings["dynamo_resets"])
    for name, enabled in settings.get("sdp_kernels", {}).items():
        with contextlib.suppress(AttributeError, RuntimeError, TypeError):
            if getattr(torch.backends.cuda, f"{name}_enabled")() != enabled:
                getattr(torch.backends.cuda, f"enable_{name}")(enabled)
    if "safe_globals" in settings:
        _apply_safe_globals(settings["safe_globals"])
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
