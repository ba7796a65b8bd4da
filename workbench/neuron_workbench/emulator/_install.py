"""The one-way registration sequence (``shared/notes/emulator.md`` §2.1).

Order matters and nothing can be undone within a process: rename PrivateUse1, generate the
``Tensor.neuron()``-style methods, register ``torch.<device>``, the ``_acc`` hook and device guard,
then the library kernels and a few Python-level patches (``torch.accelerator`` pieces the C++ side
cannot serve, pinned memory (emulated as a CPU copy that reports ``is_pinned``) and per-device
generators, which must fail with a clear message).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from neuron_workbench.emulator import _core, _guard, _native_core, _pinned, device_module, kernels
from neuron_workbench.emulator import native as _native
from neuron_workbench.emulator.profiles import Profile
from neuron_workbench.errors import BackendUnavailable


class _Hook(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_accel_patched = False


def _patch_accelerator(device_type: str, mod: Any) -> None:
    global _accel_patched
    if _accel_patched:
        return
    _accel_patched = True
    acc = torch.accelerator
    cuda_wins = torch.cuda.is_available()
    if cuda_wins:
        # Do not take torch.accelerator over from a real GPU: the emulated device is used only
        # when named explicitly. (Best effort: C++ callers of getAccelerator cannot be patched.)
        orig = acc.current_accelerator

        def current_accelerator(check_available: bool = False) -> torch.device | None:
            r = orig(check_available)
            if r is not None and r.type == device_type:
                return torch.device("cuda")
            return r

        acc.current_accelerator = current_accelerator
        return

    def _ours() -> bool:
        a = torch._C._accelerator_getAccelerator()
        return a is not None and a.type == device_type

    # The Python device guard has no synchronizeDevice and there is no DeviceAllocator, so these
    # fail in C++; route them to the emulator when the emulated device is the accelerator.
    def wrap(name: str, ours: Any) -> None:
        orig = getattr(acc, name, None)
        if orig is None:
            return

        def patched(*args: Any, **kwargs: Any) -> Any:
            if _ours():
                return ours(*args, **kwargs)
            return orig(*args, **kwargs)

        patched.__name__ = name
        patched.__doc__ = orig.__doc__
        setattr(acc, name, patched)

    wrap("synchronize", mod.synchronize)
    wrap("memory_allocated", mod.memory_allocated)
    wrap("max_memory_allocated", mod.max_memory_allocated)
    wrap("memory_reserved", mod.memory_reserved)
    wrap("max_memory_reserved", mod.max_memory_reserved)
    wrap("reset_peak_memory_stats", mod.reset_peak_memory_stats)
    wrap("reset_accumulated_memory_stats", mod.reset_accumulated_memory_stats)
    wrap("empty_cache", mod.empty_cache)
    wrap("memory_stats", device_module.flat_memory_stats)


def _patch_limits(device_type: str) -> None:
    # Pinned memory: PrivateUse1 becomes the pinning target and a Python backend has no pinned
    # allocator; pin in name only (a CPU copy that reports is_pinned), which changes only speed.
    _pinned.install()

    base = torch.Generator
    if getattr(base, "_neuron_workbench", False):
        return

    class _GeneratorMeta(type(base)):  # type: ignore[misc]
        # Existing generators (torch.default_generator) stay instances of torch.Generator.
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub: Any) -> bool:
            return issubclass(sub, base)

    class Generator(base, metaclass=_GeneratorMeta):  # type: ignore[valid-type, misc]
        """``torch.Generator``; emulated-device generators raise (the CPU generator is shared)."""

        _neuron_workbench = True

        def __new__(cls, device: Any = "cpu") -> Any:
            if device is not None and torch.device(device).type == device_type:
                raise NotImplementedError(
                    f"emulated {device_type}: per-device generators are not available (a Python "
                    "backend cannot provide one). The emulated device draws from the CPU default "
                    "generator; use torch.manual_seed(...) or torch.Generator('cpu')."
                )
            return base(device)

    Generator.__qualname__ = Generator.__name__ = "Generator"
    Generator.__module__ = "torch"
    torch.Generator = Generator  # type: ignore[misc]


def _patch_tpu_precision(mod: Any) -> None:
    # TorchTPU maps torch.set_float32_matmul_precision onto its modes (torchtpu.md §5).
    orig_set = torch.set_float32_matmul_precision
    orig_get = torch.get_float32_matmul_precision

    def set_float32_matmul_precision(precision: str) -> None:
        orig_set(precision)
        mod.set_precision(device_module._FROM_TORCH[precision])

    def get_float32_matmul_precision() -> str:
        return device_module._TO_TORCH.get(mod.get_precision(), orig_get())

    set_float32_matmul_precision.__doc__ = orig_set.__doc__
    get_float32_matmul_precision.__doc__ = orig_get.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision
    torch.get_float32_matmul_precision = get_float32_matmul_precision


def _default_to_foreach() -> None:
    """Optimizers and ``clip_grad_norm_`` take the foreach path for emulated tensors.

    PyTorch picks foreach for tensors of exact type ``Tensor``/``Parameter`` on supported devices
    (PrivateUse1 is one); emulated tensors are a wrapper subclass, so without this they would take
    the per-tensor loop that a real device's plain tensors never take.
    """
    import torch.optim.optimizer as optimizer_module
    import torch.utils._foreach_utils as foreach_utils

    for supported in (
        optimizer_module._foreach_supported_types,
        foreach_utils._foreach_supported_types,
    ):
        if _core.EmulatedTensor not in supported:
            supported.append(_core.EmulatedTensor)


def _generate_device_methods(device_type: str, for_storage: bool = False) -> None:
    """``Tensor.is_<device>``/``.<device>()``, ``Module.<device>()`` and ``PackedSequence``'s, once.

    Torch raises ``RuntimeError`` for a method generated before (an earlier install in this
    process); only the missing ones are asked for, so any error torch raises here is real. Storage
    methods (``UntypedStorage.neuron()``, which ``torch.load`` uses) need real device storage: the
    native core only.
    """
    packed_sequence = torch.nn.utils.rnn.PackedSequence
    missing = {
        "for_tensor": not hasattr(torch.Tensor, f"is_{device_type}"),
        "for_module": not hasattr(torch.nn.Module, device_type),
        "for_packed_sequence": not hasattr(packed_sequence, f"is_{device_type}"),
        "for_storage": for_storage and not hasattr(torch.UntypedStorage, f"is_{device_type}"),
    }
    if any(missing.values()):
        torch.utils.generate_methods_for_privateuse1_backend(**missing)


def _owned(device_type: str) -> BackendUnavailable:
    return BackendUnavailable(
        f"emulated {device_type} is not available: another PrivateUse1 hook is registered "
        "(a real backend owns the device); restart without it"
    )


def install(device_type: str, profile: Profile, status: Callable[[], Any] | None = None) -> None:
    """Register the emulated device (once per process).

    ``status`` answers ``torch.<device>.emulator_status()`` (the package's :func:`status`).
    """
    torch.utils.rename_privateuse1_backend(device_type)
    _core.configure_device(device_type)
    _core.NATIVE = profile.native_ops
    module = _native.load()
    if module is not None:
        # Hooks, device guard, allocator and kernels in C++ (emulator/native).
        if not _native_core.install(module, device_type):
            raise _owned(device_type)
    else:
        reason = _native.unavailable_reason()
        if reason and not reason.startswith(_native.CORE_ENV):
            # One line, once: the Python core works, only slower and without real storage.
            warnings.warn(
                f"emulated {device_type} uses the pure-Python core ({reason}); install a C++ "
                "compiler and ninja for the native core, or set "
                f"{_native.CORE_ENV}=python to choose the Python core",
                RuntimeWarning,
                stacklevel=3,
            )
        if not torch._C._acc.register_python_privateuseone_hook(_Hook()):
            raise _owned(device_type)
        torch._C._acc.register_python_privateuseone_device_guard(_guard.DeviceGuard())
    _guard.install_engine_proxy()
    _generate_device_methods(device_type, for_storage=module is not None)
    mod = device_module.build(device_type, status)
    torch._register_device_module(device_type, mod)
    sys.modules[f"torch.{device_type}"] = mod
    sys.modules[f"torch.{device_type}.memory"] = mod.memory
    kernels.register_all(native=module is not None)
    if module is None:
        _default_to_foreach()
    _patch_accelerator(device_type, mod)
    _patch_limits(device_type)
    if device_type == "tpu":
        _patch_tpu_precision(mod)
        # TorchTPU's device module defaults autocast to bfloat16 (updates-2026-12.md); PyTorch's
        # own default for PrivateUse1 is float16, which TorchNeuron keeps (torchneuron.md §10).
        torch.set_autocast_dtype(device_type, torch.bfloat16)
    from neuron_workbench.emulator import compile as _compile

    _compile.install()  # torch.compile selects the device's backend, as the SDKs patch it
