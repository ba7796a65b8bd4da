"""Device placement: "cuda" device strings (NW101), ``.cuda()`` (NW102) and ``.is_cuda`` (NW106).

Strings are only ever checked in *device positions* (``torch.device(...)``, ``.to(...)``,
``device=``, assignments to device-named variables, comparisons with ``.device.type``,
device-choice conditionals, ``{"device": ...}`` entries, defaults of ``device`` parameters and of
``--device`` options), so ``print("using cuda")`` or a comment never fires. Other areas that meet
a device argument of their own (autocast, GradScaler) call :func:`check_device` with their rule.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.context import (
    DEVICE_ARG0_CALLS,
    arg,
    dotted,
    is_device_ish,
    kwarg,
    str_value,
)
from neuron_workbench.scan.rule import NEURON_LANDING, NEURON_NOTES, NEURON_SOURCE, TPU_NOTES, Rule

NW101 = Rule(
    "NW101",
    "device-string",
    "info",
    'A "cuda" device string where a device is expected.',
    'Use the target device string ("cuda:N" becomes "neuron:N" or "tpu:N").',
    f"{NEURON_NOTES} §10 (`.to('cuda')` becomes `.to('neuron')`); {NEURON_LANDING}; {TPU_NOTES} §2",
    fixable=True,
)
NW102 = Rule(
    "NW102",
    "cuda-method",
    "info",
    "`.cuda()` moves a tensor or module to a CUDA GPU.",
    '`.to("neuron")` (or `.to("tpu")`).',
    f"{NEURON_NOTES} §10; {NEURON_LANDING}",
    fixable=True,
)
NW106 = Rule(
    "NW106",
    "is-cuda",
    "info",
    "`.is_cuda` is False for every tensor on the target.",
    "`.is_neuron` (or `.is_tpu`), generated for the PrivateUse1 backend.",
    f"{NEURON_NOTES} §2 (generate_methods_for_privateuse1_backend adds tensor.is_neuron); "
    f"{NEURON_SOURCE}; {TPU_NOTES} §2",
    fixable=True,
)

#: "cuda" or "cuda:N" exactly; anything longer is prose, not a device.
CUDA_DEVICE = re.compile(r"cuda(:\d+)?")
_ANY_DEVICE = re.compile(r"(cuda|cpu|mps|xpu|neuron|tpu|xla|meta|hpu|npu)(:\d+)?")
_DEVICE_KEYWORDS = ("device", "map_location", "device_type")


def _device_message(text: str, where: str) -> str:
    suffix = f" ({where})" if where else ""
    return f"device string {text} names a CUDA GPU{suffix}"


def check_device(
    scan: Scan,
    expr: ast.AST | None,
    rule: Rule = NW101,
    where: str = "",
    message: Callable[[str], str] | None = None,
    suggestion: Callable[[str], str] | None = None,
    fixable: bool = True,
) -> None:
    """Report a "cuda" device string (or f-string) in a device position, with a fix.

    Parameters
    ----------
    scan : Scan
        The module's scan.
    expr : ast.AST or None
        The expression in the device position; conditionals and ``or`` chains are followed.
    rule : Rule
        The rule to report (NW101 unless the caller has its own).
    where : str
        The device position, appended to the default message, e.g. ``"`.to()`"``.
    message, suggestion : callable, optional
        Build the message from the quoted old string and the suggestion from the quoted new one.
    fixable : bool
        False: no fix is offered (the string must change together with code the rewrite leaves).
    """
    if expr is None:
        return
    if isinstance(expr, ast.IfExp):
        held = _cuda_query_kept(scan, expr.test)
        if held is not None:
            # `"cuda" if tc.is_available() else "cpu"`: the query stays torch.cuda's (the rewrite
            # cannot reach an alias or a name imported from it), False on the target, so a new
            # device string alone would pick "cpu" there without a word: both change by hand
            advise = suggestion or (lambda new: f"use {new}")

            def together(new: str) -> str:
                return (
                    f"{advise(new)}, together with `{held}` in the condition, which stays "
                    f"torch.cuda's (False on {scan.target}: this would pick the other device)"
                )

            for branch in (expr.body, expr.orelse):
                check_device(scan, branch, rule, where, message, together, fixable=False)
            return
        check_device(scan, expr.body, rule, where, message, suggestion, fixable)
        check_device(scan, expr.orelse, rule, where, message, suggestion, fixable)
        return
    if isinstance(expr, ast.BoolOp):
        for value in expr.values:
            check_device(scan, value, rule, where, message, suggestion, fixable)
        return
    if id(expr) in scan.claimed:
        return
    describe = message or (lambda text: _device_message(text, where))
    advise = suggestion or (lambda new: f"use {new}")
    value = str_value(expr)
    if value is not None:
        m = CUDA_DEVICE.fullmatch(value)
        if m:
            new = scan.target + (m.group(1) or "")
            scan.claimed.add(id(expr))
            scan.report(
                rule,
                expr,
                describe(f'"{value}"'),
                advise(f'"{new}"'),
                scan.fix("string", expr, "SimpleString", new=new)
                if fixable and _single_literal(scan, expr)
                else None,
            )
        return
    if isinstance(expr, ast.JoinedStr) and expr.values:
        head = str_value(expr.values[0])
        if head is not None and re.match(r"cuda(:|$)", head):
            scan.claimed.add(id(expr))
            scan.report(
                rule,
                expr,
                describe(f'f"{head}..."'),
                advise(f'f"{scan.target}{head[4:]}..."'),
                scan.fix("fstring", expr, "FormattedString", new=scan.target) if fixable else None,
            )


def _cuda_query_kept(scan: Scan, test: ast.AST) -> str | None:
    """The call in ``test`` to a ``torch.cuda`` function the rewrite leaves as it is, if any.

    The rewrite changes ``torch.cuda.f()`` spelled through torch (``torch.cuda.is_available()``);
    through an alias (``import torch.cuda as tc``) or a name imported from it, the call stays.
    """
    for node in ast.walk(test):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        qualified = scan.qn(func)
        if qualified is None or not qualified.startswith("torch.cuda."):
            continue
        through_torch = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name)
            and scan.qn(func.value.value) == "torch"
        )
        if not through_torch:
            return f"{ast.get_source_segment(scan.source, func) or qualified}()"
    return None


def _single_literal(scan: Scan, node: ast.AST) -> bool:
    # "cu" "da" is one ast.Constant but two literals, which the rewrite does not handle.
    segment = ast.get_source_segment(scan.source, node) or ""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(segment).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    return sum(t.type == tokenize.STRING for t in tokens) == 1


def _call(scan: Scan, node: ast.Call) -> None:
    qn = scan.qn(node.func)
    func = node.func
    if isinstance(func, ast.Attribute) and qn is None:
        if func.attr == "cuda":
            _cuda_method(scan, node, func)
        elif func.attr == "to" and node.args:
            check_device(scan, node.args[0], where="`.to()`")
        elif func.attr == "add_argument" and any(
            "device" in (str_value(a) or "") for a in node.args
        ):
            check_device(scan, kwarg(node, "default"), where="argparse default")
    if qn in DEVICE_ARG0_CALLS:
        check_device(scan, arg(node, 0, "type" if qn == "torch.device" else "device_type"))
    if id(node) in scan.device_arg_checked:
        return
    for kw in node.keywords:
        if kw.arg in _DEVICE_KEYWORDS:
            check_device(scan, kw.value, where=f"`{kw.arg}=`")


def _cuda_method(scan: Scan, node: ast.Call, func: ast.Attribute) -> None:
    device_arg = arg(node, 0, "device")
    other_kw = [k for k in node.keywords if k.arg not in ("device",)]
    fixable = (
        len(node.args) <= 1
        and not any(isinstance(a, ast.Starred) for a in node.args)
        and all(k.arg in ("non_blocking", "memory_format") for k in other_kw)
    )
    new = scan.target
    if device_arg is not None:
        if isinstance(device_arg, ast.Constant) and device_arg.value is None:
            pass
        elif (
            isinstance(device_arg, ast.Constant)
            and isinstance(device_arg.value, int)
            and not isinstance(device_arg.value, bool)
        ):
            new = f"{scan.target}:{device_arg.value}"
        else:
            fixable = False
    fix = scan.fix("cuda_method", node, "Call", new=new) if fixable else None
    suggestion = (
        f'use `.to("{new}")`'
        if fixable
        else f'use `.to(...)` with a "{scan.target}" device (the argument is not a '
        "literal index, so it is left for you)"
    )
    scan.report(
        NW102, node, "`.cuda()` moves to a CUDA GPU", suggestion, fix, pos=scan.attr_pos(func)
    )


def _function_def(scan: Scan, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    args = node.args
    positional = args.posonlyargs + args.args
    for param, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
        if "device" in param.arg.lower():
            check_device(scan, default, where=f"default of `{param.arg}`")
    for param, default in zip(args.kwonlyargs, args.kw_defaults):
        if default is not None and "device" in param.arg.lower():
            check_device(scan, default, where=f"default of `{param.arg}`")


def _assign(scan: Scan, node: ast.Assign) -> None:
    for target in node.targets:
        if is_device_ish(target, scan.ctx):
            check_device(scan, node.value, where=f"assigned to `{dotted(target)}`")


def _ann_assign(scan: Scan, node: ast.AnnAssign) -> None:
    if node.value is not None and is_device_ish(node.target, scan.ctx):
        check_device(scan, node.value, where=f"assigned to `{dotted(node.target)}`")


def _dict(scan: Scan, node: ast.Dict) -> None:
    for key, value in zip(node.keys, node.values):
        # A claimed key is an environment variable name (reported by the env area first).
        key_text = str_value(key)
        if key_text is not None and id(key) not in scan.claimed and "device" in key_text.lower():
            check_device(scan, value, where=f'"{key_text}" entry')


def _compare(scan: Scan, node: ast.Compare) -> None:
    operands = [node.left, *node.comparators]
    if any(is_device_ish(o, scan.ctx) for o in operands):
        for operand in operands:
            check_device(scan, operand, where="comparison")


def _if_exp(scan: Scan, node: ast.IfExp) -> None:
    # `"cuda" if ... else "cpu"` chooses a device whatever it is assigned to.
    body, orelse = str_value(node.body), str_value(node.orelse)
    if (
        body is not None
        and orelse is not None
        and _ANY_DEVICE.fullmatch(body)
        and _ANY_DEVICE.fullmatch(orelse)
    ):
        check_device(scan, node, where="device choice")


def _attribute(scan: Scan, node: ast.Attribute) -> None:
    if node.attr == "is_cuda" and scan.qn(node) is None:
        scan.report(
            NW106,
            node,
            "`.is_cuda` is False on the target",
            f"use `.is_{scan.target}`",
            scan.fix("rename_attr", node, "Attribute", name=f"is_{scan.target}"),
            pos=scan.attr_pos(node),
        )


AREA = Area(
    "devices",
    (NW101, NW102, NW106),
    {
        ast.Call: _call,
        ast.FunctionDef: _function_def,
        ast.AsyncFunctionDef: _function_def,
        ast.Assign: _assign,
        ast.AnnAssign: _ann_assign,
        ast.Dict: _dict,
        ast.Compare: _compare,
        ast.IfExp: _if_exp,
        ast.Attribute: _attribute,
    },
)
