"""The first pass, and the ``ast`` helpers every check shares.

:func:`collect_context` resolves import aliases (``import torch as T``,
``from torch.cuda.amp import autocast``) and the names used as devices; the checks in
:mod:`.checks` then read the :class:`Context` to turn a dotted name into the qualified name it
stands for (:func:`qualname`) and to tell device positions from prose (:func:`is_device_ish`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

#: Calls whose first argument is a device (or device type); the devices check reads them too.
DEVICE_ARG0_CALLS = frozenset(
    {
        "torch.device",
        "torch.set_default_device",
        "torch.get_device_module",
        "torch.distributed.device_mesh.init_device_mesh",
        "torch.distributed.init_device_mesh",
    }
)


@dataclass
class Context:
    """What the first pass learns about a module (or, for notebooks, all of its cells)."""

    imports: dict[str, str] = field(default_factory=dict)
    torch_aliases: set[str] = field(default_factory=set)
    device_names: set[str] = field(default_factory=set)

    def merge(self, other: Context) -> None:
        """Add another cell's context (notebook cells share one namespace)."""
        self.imports.update(other.imports)
        self.torch_aliases |= other.torch_aliases
        self.device_names |= other.device_names

    @property
    def torch_alias(self) -> str | None:
        """A name bound to the torch module by an import, preferring ``torch``."""
        if "torch" in self.torch_aliases:
            return "torch"
        return min(self.torch_aliases) if self.torch_aliases else None


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def qualname(node: ast.AST, imports: dict[str, str]) -> str | None:
    """The qualified name a Name/Attribute chain stands for, through the imports, else None.

    ``torch`` resolves even without an import: a cell may use torch imported by an earlier cell
    or by the kernel.
    """
    text = dotted(node)
    if text is None:
        return None
    head, _, rest = text.partition(".")
    if head in imports:
        base = imports[head]
    elif head == "torch":
        base = "torch"
    else:
        return None
    return f"{base}.{rest}" if rest else base


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    """The value of keyword argument ``name``, else None."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def arg(call: ast.Call, index: int, name: str | None = None) -> ast.expr | None:
    """Argument ``name`` if given by keyword, else positional ``index`` (not after a ``*args``)."""
    if name is not None:
        found = kwarg(call, name)
        if found is not None:
            return found
    if len(call.args) > index and not any(
        isinstance(a, ast.Starred) for a in call.args[: index + 1]
    ):
        return call.args[index]
    return None


def str_value(node: ast.AST | None) -> str | None:
    """The text of a string literal, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def is_true(node: ast.AST | None) -> bool:
    """Whether ``node`` is the literal ``True``."""
    return isinstance(node, ast.Constant) and node.value is True


def is_device_ish(node: ast.AST, ctx: Context) -> bool:
    """Whether a name holds a device: used as one, or named ``*device*`` / ``*.device.type``."""
    name = dotted(node)
    if name is None:
        return False
    if name in ctx.device_names:
        return True
    last = name.rsplit(".", 1)[-1].lower()
    if last == "type" and "." in name:
        # x.device.type, device.type
        return "device" in name.rsplit(".", 1)[0].rsplit(".", 1)[-1].lower()
    return "device" in last


def collect_context(tree: ast.AST) -> Context:
    """First pass: import aliases and the names that are used as devices.

    Parameters
    ----------
    tree : ast.AST
        A parsed module.

    Returns
    -------
    Context
        Imports (local name to qualified name), names bound to ``torch``, and dotted names passed
        where a device is expected (``.to(dev)``, ``device=dev``, ``torch.device(dev)``).
    """
    ctx = Context()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    ctx.imports[alias.asname] = alias.name
                    if alias.name == "torch":
                        ctx.torch_aliases.add(alias.asname)
                else:
                    root = alias.name.split(".", 1)[0]
                    ctx.imports[root] = root
                    if root == "torch":
                        ctx.torch_aliases.add("torch")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    ctx.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        candidates: list[ast.expr | None] = [kwarg(node, "device"), kwarg(node, "map_location")]
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "to" and node.args:
            candidates.append(node.args[0])
        if qualname(func, ctx.imports) in DEVICE_ARG0_CALLS:
            candidates.append(arg(node, 0, "type"))
        for cand in candidates:
            name = dotted(cand) if cand is not None else None
            if name:
                ctx.device_names.add(name)
    return ctx
