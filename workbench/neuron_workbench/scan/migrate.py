"""Apply the scanner's mechanical fixes with libcst, preserving formatting and comments.

The checks (:mod:`.checks`) decide what is safe; this module only rewrites the nodes it was given,
matched by node type and character span. Everything else in the file is left byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from neuron_workbench.scan.checks.amp import CUDA_AUTOCAST_POSITIONAL
from neuron_workbench.scan.checks.base import Fix

_Key = tuple[str, tuple[int, int], tuple[int, int]]


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


def _plain_args(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    # Let libcst lay out commas again: the argument list changed shape.
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]


class _Transformer(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, fixes: Sequence[Fix]) -> None:
        super().__init__()
        self.fixes: dict[_Key, Fix] = {fix.key: fix for fix in fixes}
        self.applied: set[_Key] = set()

    def _lookup(self, original: cst.CSTNode) -> Fix | None:
        pos = self.get_metadata(PositionProvider, original)
        key = (
            type(original).__name__,
            (pos.start.line, pos.start.column),
            (pos.end.line, pos.end.column),
        )
        fix = self.fixes.get(key)
        if fix is not None:
            self.applied.add(key)
        return fix

    def leave_SimpleString(
        self, original: cst.SimpleString, updated: cst.SimpleString
    ) -> cst.BaseExpression:
        fix = self._lookup(original)
        if fix is None or fix.kind != "string":
            return updated
        return updated.with_changes(
            value=f"{updated.prefix}{updated.quote}{fix.get('new')}{updated.quote}"
        )

    def leave_FormattedString(
        self, original: cst.FormattedString, updated: cst.FormattedString
    ) -> cst.BaseExpression:
        fix = self._lookup(original)
        if fix is None or fix.kind != "fstring" or not updated.parts:
            return updated
        head = updated.parts[0]
        if not isinstance(head, cst.FormattedStringText) or not head.value.startswith("cuda"):
            return updated
        new_head = head.with_changes(value=fix.get("new") + head.value[len("cuda") :])
        return updated.with_changes(parts=[new_head, *updated.parts[1:]])

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        fix = self._lookup(original)
        if fix is None:
            return updated
        if fix.kind == "rename_attr":
            return updated.with_changes(attr=cst.Name(fix.get("name")))
        if fix.kind == "torch_module" and isinstance(updated.value, cst.Attribute):
            # <torch>.cuda.<name> -> <torch>.<module>.<new name>
            inner = updated.value.with_changes(attr=cst.Name(fix.get("module")))
            return updated.with_changes(value=inner, attr=cst.Name(fix.get("name")))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        fix = self._lookup(original)
        if fix is None:
            return updated
        if fix.kind == "cuda_method" and isinstance(updated.func, cst.Attribute):
            kept = [
                a for a in updated.args if a.keyword is not None and a.keyword.value != "device"
            ]
            args = [cst.Arg(_string(fix.get("new"))), *_plain_args(kept)]
            changes = {}
            if not updated.args:  # `.cuda( )` becomes `.to("neuron")`, not `.to( "neuron")`
                changes["whitespace_before_args"] = cst.SimpleWhitespace("")
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")), args=args, **changes
            )
        if fix.kind == "autocast_call":
            # torch.cuda.amp.autocast(enabled, dtype, cache_enabled): name positional arguments,
            # because torch.autocast's second positional parameter is dtype.
            args = []
            for i, arg in enumerate(updated.args):
                if arg.keyword is None and arg.star == "":
                    arg = arg.with_changes(
                        keyword=cst.Name(CUDA_AUTOCAST_POSITIONAL[i]),
                        equal=cst.AssignEqual(
                            whitespace_before=cst.SimpleWhitespace(""),
                            whitespace_after=cst.SimpleWhitespace(""),
                        ),
                    )
                args.append(arg)
            return updated.with_changes(
                func=cst.parse_expression(fix.get("func")),
                args=[cst.Arg(_string(fix.get("device"))), *_plain_args(args)],
            )
        if fix.kind == "gradscaler_call":
            return updated.with_changes(
                func=cst.parse_expression(fix.get("func")),
                args=[cst.Arg(_string(fix.get("device"))), *_plain_args(updated.args)],
            )
        if fix.kind == "insert_device":
            return updated.with_changes(
                args=[cst.Arg(_string(fix.get("device"))), *_plain_args(updated.args)],
            )
        return updated


def apply_fixes(source: str, fixes: Sequence[Fix]) -> tuple[str, set[_Key]]:
    """Rewrite the nodes named by ``fixes``.

    Parameters
    ----------
    source : str
        Python source that parses with libcst.
    fixes : sequence of Fix
        Rewrites from :func:`neuron_workbench.scan.analyzer.analyze`.

    Returns
    -------
    tuple of (str, set)
        The new source and the keys of the fixes that were applied.
    """
    if not fixes:
        return source, set()
    module = cst.parse_module(source)
    transformer = _Transformer(fixes)
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(transformer)
    return new_module.code, transformer.applied
