"""Integers outside int32 where they meet torch (NW181): int64 on neuron may run as int32."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.rule import NEURON_NOTES, NEURON_SOURCE, Rule

NW181 = Rule(
    "NW181",
    "int32-overflow",
    "warning",
    "An integer outside the int32 range; int64 arithmetic on neuron may run as int32.",
    "Keep such values on CPU, or check that the computation stays inside int32.",
    f"{NEURON_NOTES} §7 (dtype_autocast: int64 to int32; 'int64 arithmetic may be int32' is an "
    f"inference; "
    f"{NEURON_SOURCE})",
)

_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)


def _int_value(node: ast.AST) -> int | None:
    # The value of an integer constant expression (literals, unary +/-, + - * ** <<), else None.
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _int_value(node.operand)
        if inner is None:
            return None
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp):
        left, right = _int_value(node.left), _int_value(node.right)
        if left is None or right is None:
            return None
        try:
            if isinstance(node.op, ast.Pow) and 0 <= right <= 256:
                return int(left**right)
            if isinstance(node.op, ast.LShift) and 0 <= right <= 256:
                return left << right
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
        except (OverflowError, ValueError):
            return None
    return None


def _check_int(scan: Scan, node: ast.AST) -> None:
    parent = scan.parents.get(id(node))
    if parent is not None and _int_value(parent) is not None:
        return  # the enclosing constant expression is checked instead
    value = _int_value(node)
    if value is None or _INT32_MIN <= value <= _INT32_MAX:
        return
    # Only where the value meets torch: an argument of a torch call, or arithmetic with a
    # non-constant operand (which may be a tensor).
    in_arith = isinstance(parent, (ast.BinOp, ast.AugAssign))
    anc: ast.AST | None = parent
    in_torch_call = False
    while anc is not None:
        if isinstance(anc, ast.Call):
            qn = scan.qn(anc.func) or ""
            if qn.startswith("torch.") and "seed" not in qn:
                in_torch_call = True
                break
        anc = scan.parents.get(id(anc))
    if in_arith or in_torch_call:
        scan.report(NW181, node, f"integer {value} does not fit in int32")


def _call(scan: Scan, node: ast.Call) -> None:
    if scan.qn(node.func) == "torch.iinfo" and scan.qn(node.args[0] if node.args else node) in (
        "torch.int64",
        "torch.long",
    ):
        scan.report(NW181, node, "int64 limits: int64 arithmetic on neuron may run as int32")


AREA = Area(
    "ints",
    (NW181,),
    {ast.Call: _call, ast.Constant: _check_int, ast.BinOp: _check_int, ast.UnaryOp: _check_int},
)
