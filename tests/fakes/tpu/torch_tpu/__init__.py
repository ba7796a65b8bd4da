"""FAKE ``torch_tpu`` (TorchTPU 0.2.0) for neuron_workbench tests: no TPU, the workbench emulator underneath.

Implements the surface ``shared/notes/torchtpu.md`` documents and nothing else:

- autoload through the ``torch.backends`` entry point ``torch_tpu._loader:load`` (this folder's
  ``.dist-info``); the device is initialised only when "hardware" is detected
  (``FAKE_TORCH_TPU_DEVICES``, default 1), which renames PrivateUse1 to ``tpu`` and prints
  TorchTPU's message on stderr;
- ``torch.tpu.Precision`` / ``torch.tpu.precision`` and the ``torch.set_float32_matmul_precision``
  mapping (§5);
- CPU fallback off by default: an op outside the 0.2.0 coverage raises TorchTPU's exact error; with
  ``torch_tpu._internal.execution_mode.enable_cpu_fallback = True`` it runs on CPU and a warning is
  written to file descriptor 2 on every call, as ``ABSL_LOG(WARNING)`` does (§3);
- ``torch_tpu._internal.execution_mode.set_eager_mode`` (§6; the fake is synchronous in every mode)
  and ``torch_tpu._internal.utils.utils.OpTracer`` (§4).

Nothing else of ``torch.tpu`` exists here (no device, memory, seed or synchronize functions are
documented). The ``torch.compile`` patch, distributed backends and profiler are not faked.
"""

from __future__ import annotations

#: Read by neuron_workbench's adapters: every report of a run on this package says "fake".
__neuron_workbench_fake__ = (
    "fake torch_tpu 0.2.0+fake: the neuron_workbench emulator on the host CPU, no TPU"
)
__version__ = "0.2.0+fake"

from torch_tpu import _internal, _loader  # noqa: E402

_loader.load()

__all__ = ["_internal"]
