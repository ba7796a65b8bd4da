"""Recording what a run did: its ops (op profile), CPU fallbacks, and per-module statistics.

One module per recorder: :mod:`~neuron_workbench.trace.profile` (the op recorder, whose data is
:mod:`~neuron_workbench.trace.profile_data`), :mod:`~neuron_workbench.trace.fallback` (the
fallback report), :mod:`~neuron_workbench.trace.layers` (module calls) and
:mod:`~neuron_workbench.trace.optimizer` (optimizer steps). Comparing two runs' records lives in
:mod:`neuron_workbench.compare` (``profile_diff``, ``layer_divergence``).

Nothing here runs unless asked for: :func:`~neuron_workbench.trace.profile.op_profiler` is an
executor instrument (``RunSpec.instruments``) that ``%%neuron --profile`` adds; the fallback helpers
only read the events a run already recorded.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FallbackRow",
    "OpProfile",
    "OpProfileRecorder",
    "OpStat",
    "combined_chrome_trace",
    "cross_check",
    "fallback_table",
    "op_profiler",
    "strict_message",
    "strict_violations",
    "write_chrome_trace",
]

_RECORDER = {"OpProfileRecorder", "op_profiler"}
_PROFILE_DATA = {"OpProfile", "OpStat", "combined_chrome_trace", "write_chrome_trace"}


def __getattr__(name: str) -> Any:
    # Keep `import neuron_workbench.trace` free of torch until something is used.
    if name in _RECORDER:
        from neuron_workbench.trace import profile

        return getattr(profile, name)
    if name in _PROFILE_DATA:
        from neuron_workbench.trace import profile_data

        return getattr(profile_data, name)
    if name in __all__:
        from neuron_workbench.trace import fallback

        return getattr(fallback, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
