"""The option table's front ends: argparse arguments, parsed values, ``%config`` lines.

``%%neuron`` (through IPython's ``magic_arguments``, itself argparse) and the ``neuron-workbench``
subcommands add the table's options with :func:`add_arguments` or :func:`argument_spec`, and read
back what a user gave with :func:`given_values`; the notebook runner makes values a notebook's
session defaults with :func:`config_lines`. Imports no torch (the command line parses first).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from neuron_workbench.cell.options import OPTION, TRAIT, Option, options_for
from neuron_workbench.errors import OptionError

_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def argument_spec(option: Option) -> tuple[tuple[str, ...], dict[str, Any]]:
    """``add_argument``'s positional and keyword arguments for ``option``.

    Every value defaults to None (a switch to False, a list to empty), so a front end can tell an
    option given from one left to the session defaults.
    """
    kwargs: dict[str, Any] = {"dest": option.name, "help": option.help}
    if option.kind == "bool":
        kwargs["action"] = "store_true"
        kwargs["default"] = False
    elif option.kind == "list":
        kwargs.update(action="append", default=[], metavar=option.metavar)
    elif option.kind == "choice":
        kwargs.update(choices=option.choices, default=None)
    else:
        kwargs.update(type=_TYPES[option.kind], default=None, metavar=option.metavar)
    return (option.flag,), kwargs


def add_arguments(parser: argparse.ArgumentParser, front: str) -> None:
    """Add every option ``front`` takes to an argparse ``parser``."""
    for option in options_for(front):
        flags, kwargs = argument_spec(option)
        parser.add_argument(*flags, **kwargs)


def _given(option: Option, value: Any) -> bool:
    """Whether a parsed ``value`` sets ``option`` (False: the session default applies)."""
    return bool(value) if option.kind in ("bool", "list") else value is not None


def _parsed_value(option: Option, value: Any) -> Any:
    """A given flag's value as the option holds it.

    A switch given sets the value its default is not: ``--layers`` turns ``layers`` on,
    ``--no-scan`` turns ``scan`` (on by default) off.
    """
    if option.kind == "bool":
        return not option.default
    return list(value) if option.kind == "list" else value


def given_values(args: argparse.Namespace, front: str) -> dict[str, Any]:
    """The options ``front`` takes that ``args`` sets, by API name.

    Raises
    ------
    OptionError
        A tolerance preset given with ``rtol``/``atol``: the pair is every output's tolerance, so
        the preset would be silently ignored.
    """
    values = {}
    for option in options_for(front):
        raw = getattr(args, option.name, None)
        if _given(option, raw):
            values[option.name] = _parsed_value(option, raw)
    if "preset" in values and ("rtol" in values or "atol" in values):
        raise OptionError(
            "{0} and {1} set every output's tolerance, which replaces {2}: give one or the other",
            "rtol",
            "atol",
            "preset",
        )
    return values


def config_lines(
    values: Mapping[str, Any],
    own: Mapping[str, Any] | None = None,
    section: str = "NeuronMagics",
) -> list[str]:
    """``%config``-style lines that make ``values`` the session defaults of a notebook's cells.

    ``values`` are table options (each must be a session setting); ``own`` are the magic's own
    settings outside the table (``record_dir``, ``against_dir``), written as they are.
    """
    for name in values:
        if TRAIT not in OPTION[name].fronts:
            raise ValueError(f"{name} is not a session setting")
    settings = {**values, **(own or {})}
    return [
        f"get_ipython().config.{section}.{name} = {value!r}" for name, value in settings.items()
    ]
