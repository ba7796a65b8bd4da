"""Operators a notebook defines with ``torch.library.custom_op``, defined again in a target's process.

An op lives in the dispatcher of the process that defined it: a cell calling a notebook's op
(``scale_add(x, y)`` or ``torch.ops.nbops.scale_add(x, y)``) could not be sent to the target's
worker, or found no such op there. With :func:`remember_custom_op_definitions` (``%load_ext``; a
target process does it when it starts), every op a notebook defines keeps the calls that made it:
its definition, then ``register_kernel``, ``register_fake``, ``register_autograd``,
``register_autocast``, ``register_vmap`` and ``register_torch_dispatch``, in order. Such an op
travels as those calls (:func:`reduce_custom_op`): a target process defines it again, through
``torch.library.custom_op`` itself, once per version of it; the kernel gets its own op back.

Ops made with the lower-level ``torch.library.Library`` API are not followed, nor ops a notebook
defined before ``%load_ext``; an op a module defines travels by name and that module is imported
where it arrives.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle
import uuid
from collections.abc import Callable
from typing import Any

import torch

#: What an op a notebook defined keeps: the calls that made it, and a token naming their version.
_CALLS_ATTR = "_workbench_calls"
_TOKEN_ATTR = "_workbench_token"

#: The methods whose calls are kept.
_RECORDED = (
    "register_kernel",
    "register_fake",
    "register_autograd",
    "register_autocast",
    "register_vmap",
    "register_torch_dispatch",
)
#: Those with a decorator form: the count of positional arguments of their whole form and the
#: keyword of their function (fewer, and no function by keyword: the function comes later).
_DECORATOR_FORMS = {
    "register_kernel": (2, "fn"),
    "register_vmap": (1, "func"),
    "register_torch_dispatch": (2, "fn"),
}

#: Part of the message when a notebook's op defined before ``%load_ext`` cannot travel.
CUSTOM_OP_BEFORE_LOAD = "defined with torch.library.custom_op before %load_ext neuron_workbench"

#: Whether this process defines again the ops it receives (a target process's, set when it
#: starts); the kernel keeps its own definition of an op it receives back.
_defines_received = False


def custom_op_class() -> type | None:
    """``torch.library``'s ``CustomOpDef`` (None in a torch without it)."""
    try:
        from torch._library.custom_ops import CustomOpDef
    except ImportError:
        return None
    return CustomOpDef


def _definitions() -> Any:
    from torch._library.custom_ops import OPDEFS

    return OPDEFS


def remember_custom_op_definitions(*, defines_received: bool = False) -> None:
    """Make every op a notebook defines from now on keep the calls that made it (once per process).

    Parameters
    ----------
    defines_received : bool
        True in a target process: an op it receives is defined here again (a new version of it
        too); the kernel (False) keeps its own op when a run's answer brings one back.
    """
    global _defines_received
    _defines_received = _defines_received or defines_received
    cls = custom_op_class()
    if cls is None or getattr(cls, "_workbench_remembers", False):
        return
    init = cls.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - it is __init__
        init(self, *args, **kwargs)
        # by name (namespace, name, schema, fn, tags), however torch passed them
        given = dict(signature.bind(self, *args, **kwargs).arguments)
        given.pop("self", None)
        if getattr(given.get("fn"), "__module__", None) == "__main__":  # a notebook's op
            setattr(self, _CALLS_ATTR, [("define", (), given)])
            setattr(self, _TOKEN_ATTR, uuid.uuid4().hex)

    cls.__init__ = __init__
    for name in _RECORDED:
        method = getattr(cls, name, None)
        if method is not None:
            setattr(cls, name, _recording(name, method))
    cls._workbench_remembers = True


def _recording(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    whole, keyword = _DECORATOR_FORMS.get(name, (0, None))

    @functools.wraps(method)
    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if not hasattr(self, _CALLS_ATTR):
            return result
        if keyword is not None and len(args) < whole and kwargs.get(keyword) is None:
            # the decorator form (@op.register_kernel("cpu")): kept once it gets its function
            decorate = result

            def decorator(fn: Any) -> Any:
                decorated = decorate(fn)
                _keep(self, name, (*args, fn), kwargs)
                return decorated

            return decorator
        _keep(self, name, args, kwargs)
        return result

    return record


def _keep(op: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    getattr(op, _CALLS_ATTR).append((name, args, kwargs))
    setattr(op, _TOKEN_ATTR, uuid.uuid4().hex)  # a new version: a process defines it again


def defining_module(qualified: str) -> str | None:
    """The module of the function the op ``qualified`` was made from (None: not known here)."""
    if custom_op_class() is None:
        return None
    return _init_module(_definitions().get(qualified))


def _init_module(op: Any) -> str | None:
    module = getattr(getattr(op, "_init_fn", None), "__module__", None)
    return module if isinstance(module, str) else None


def defined_by_notebook(qualified: str) -> bool:
    """Whether the op ``qualified`` kept the calls that made it here (a notebook's, after load)."""
    if custom_op_class() is None:
        return False
    return hasattr(_definitions().get(qualified), _CALLS_ATTR)


def notebook_custom_ops() -> list[Any]:
    """The ops this process's notebook defined (after ``%load_ext``) that still exist and can travel.

    An op whose functions cannot be pickled (one closes over a lock) is left out, rather than every
    cell failing to reach the worker: a cell that calls it finds no such op there, as before.
    """
    if custom_op_class() is None:
        return []
    return [
        op
        for op in list(_definitions().values())
        if hasattr(op, _CALLS_ATTR)
        and _can_travel(getattr(op, _TOKEN_ATTR), getattr(op, _CALLS_ATTR))
    ]


#: Whether each version of an op (by token) could be pickled: tried once per version.
_TRAVELS: dict[str, bool] = {}


def _can_travel(token: str, calls: list[Any]) -> bool:
    known = _TRAVELS.get(token)
    if known is None:
        import cloudpickle

        try:
            cloudpickle.dumps(calls)
            known = True
        except Exception:  # noqa: BLE001 - whatever stops pickling stops the op from travelling
            known = False
        _TRAVELS[token] = known
    return known


def reduce_custom_op(op: Any) -> tuple[Any, ...]:
    """How ``op`` travels: the calls that made it, or (a module's op) its name and module.

    Raises
    ------
    pickle.PicklingError
        For a notebook's op defined before ``%load_ext`` (its calls were not kept).
    """
    qualified = f"{op._namespace}::{op._name}"
    calls = getattr(op, _CALLS_ATTR, None)
    if calls is not None:
        return _custom_op_from, (qualified, getattr(op, _TOKEN_ATTR), calls)
    module = _init_module(op)
    if module is None or module == "__main__":
        raise pickle.PicklingError(f"{qualified} was {CUSTOM_OP_BEFORE_LOAD}")
    return _custom_op_named, (qualified, module)


def _custom_op_named(qualified: str, module: str) -> Any:
    """The op ``qualified`` a module defines, that module imported here first."""
    importlib.import_module(module)
    return _definitions()[qualified]


def _custom_op_from(qualified: str, token: str, calls: list[tuple[str, Any, Any]]) -> Any:
    """The op ``qualified`` as ``calls`` made it: this process's own, or defined again here."""
    existing = _definitions().get(qualified)
    if existing is not None and (
        getattr(existing, _TOKEN_ATTR, None) == token or not _defines_received
    ):
        return existing
    (_, _, defined), *rest = calls
    schema, fn, tags = defined["schema"], defined["fn"], defined.get("tags")
    device_types = None
    if rest and rest[0][0] == "register_kernel" and rest[0][1][1:2] == (fn,):
        # custom_op's own registration of the function it was given, for its device types
        device_types = rest[0][1][0]
        rest = rest[1:]
    written = torch._C.parse_schema(f"{qualified}{schema}").arguments
    mutates = {
        arg.name for arg in written if arg.alias_info is not None and arg.alias_info.is_write
    }
    op = torch.library.custom_op(
        qualified, fn, mutates_args=mutates, device_types=device_types, schema=schema, tags=tags
    )
    for method, args, kwargs in rest:
        getattr(op, method)(*args, **kwargs)
    # what it is made of, under the sender's token: sent back, the sender finds its own op
    setattr(op, _CALLS_ATTR, list(calls))
    setattr(op, _TOKEN_ATTR, token)
    return op
