"""Spellings of ATen op names: one base name per op, whatever overload or namespace was written.

Shared by the backends' dispatch recorders, the fallback report, the op profile and the profile
diff: a leaf module, so each layer can use it.
"""

from __future__ import annotations

__all__ = ["normalize_op"]


def normalize_op(name: str) -> str:
    """Base ATen name of an op spelling: ``sort``, ``aten::sort``, ``aten::sort.stable`` → ``aten::sort``."""
    name = str(name).strip()
    if "::" not in name:
        name = f"aten::{name}"
    namespace, _, rest = name.partition("::")
    return f"{namespace}::{rest.split('.', 1)[0]}"
