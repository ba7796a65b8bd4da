"""Op-level profiling of one run, profile diffs, Chrome traces, and the CPU-fallback report.

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
    "profile_diff",
    "strict_message",
    "strict_violations",
]

_PROFILE = {
    "OpProfile",
    "OpProfileRecorder",
    "OpStat",
    "combined_chrome_trace",
    "op_profiler",
    "profile_diff",
}


def __getattr__(name: str) -> Any:
    # Keep `import neuron_workbench.trace` free of torch until something is used.
    if name in _PROFILE:
        from neuron_workbench.trace import profile

        return getattr(profile, name)
    if name in __all__:
        from neuron_workbench.trace import fallback

        return getattr(fallback, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
