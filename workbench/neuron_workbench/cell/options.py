"""Every option of a cell, once: the table each front end is built from.

One :class:`Option` per setting gives its API name, flag, kind, choices, default, help and the front
ends that take it. From :data:`OPTIONS` come the fields of :class:`CompareOptions` and
:class:`CellOptions`, the ``%%neuron`` arguments and ``NeuronMagics`` traits (``magics/neuron.py``),
the ``neuron-workbench run``/``record``/``compare`` arguments, the ``%config`` lines the notebook
runner writes, and the flag spelling of every option error. Adding an option is one entry here
plus its behaviour; ``tests/cell/test_options.py`` fails when a front end lacks one.

This module imports no torch: the command line parses its arguments with it before torch loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.errors import OptionError

#: Front ends: the ``%%neuron`` flags, its ``%config NeuronMagics`` traits (session defaults), and
#: the ``neuron-workbench`` subcommands.
MAGIC, TRAIT, RUN, RECORD, COMPARE = "magic", "trait", "run", "record", "compare"
#: An option of every cell: a flag, a trait, and ``neuron-workbench run`` (notebooks and scripts).
CELL = frozenset({MAGIC, TRAIT, RUN})

#: Where an option's value goes: :class:`CompareOptions` (how two runs are made and compared),
#: :class:`CellOptions` (what is done around them), or nowhere (a front end's own setting).
COMPARE_GROUP, CELL_GROUP, FRONT_GROUP = "compare", "cell", "front"


@dataclass(frozen=True)
class Option:
    """One setting, as every front end spells and parses it.

    Attributes
    ----------
    name : str
        API name: the field of :class:`CompareOptions` or :class:`CellOptions`, the trait's name.
    help : str
        One sentence for ``%%neuron?``, ``--help`` and the trait.
    kind : str
        ``bool`` (a switch), ``int``, ``float``, ``str``, ``choice`` (one of ``choices``) or
        ``list`` (a repeatable flag; a list trait).
    default : object
        The value when no front end sets it.
    choices : tuple of str
        Allowed values of a ``choice`` option.
    flag : str
        The command-line spelling; ``--`` and the name with ``-`` for ``_`` unless given.
    metavar : str or None
        What the flag's value is called in help.
    fronts : frozenset of str
        The front ends that take it (:data:`CELL` unless given).
    group : str
        :data:`COMPARE_GROUP`, :data:`CELL_GROUP` or :data:`FRONT_GROUP`.
    env : tuple of str
        Environment variables that give the trait's default, first set one first.
    """

    name: str
    help: str
    kind: str = "str"
    default: Any = None
    choices: tuple[str, ...] = ()
    flag: str = ""
    metavar: str | None = None
    fronts: frozenset[str] = CELL
    group: str = COMPARE_GROUP
    env: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    def env_default(self) -> Any:
        """The default, or the first environment variable of :attr:`env` that is set (and valid)."""
        for name in self.env:
            value = os.environ.get(name, "").strip()
            if value and (not self.choices or value.lower() in self.choices):
                return value.lower() if self.choices else value
        return self.default


_TARGET_HELP = (
    "target backend (default: neuron, or $NEURON_WORKBENCH_TARGET, else the device "
    "$NEURON_WORKBENCH_EMULATE names); several, comma-separated (neuron,tpu), are each compared "
    "against one reference run"
)

#: Every option, in the order ``--help`` lists them.
OPTIONS: tuple[Option, ...] = (
    Option(
        "ref",
        "reference backend (default: cuda if usable, else cpu)",
        metavar="BACKEND",
        default="",
    ),
    Option(
        "target",
        _TARGET_HELP,
        metavar="BACKEND",
        default="neuron",
        env=("NEURON_WORKBENCH_TARGET", "NEURON_WORKBENCH_EMULATE"),
    ),
    Option(
        "rtol",
        "relative tolerance for every output; give atol too",
        kind="float",
        metavar="R",
        fronts=CELL | {COMPARE},
    ),
    Option(
        "atol",
        "absolute tolerance for every output; give rtol too",
        kind="float",
        metavar="A",
        fronts=CELL | {COMPARE},
    ),
    Option(
        "preset",
        "tolerance preset: default (torch.testing.assert_close's per-dtype tolerances), strict "
        "(bitwise), fp32-accelerator (float32 within rtol 1e-4, atol 1e-5, as TorchNeuron's own "
        "tests), bf16-autocast (every float output at bfloat16 precision)",
        kind="choice",
        choices=("default", "strict", "fp32-accelerator", "bf16-autocast"),
        default="default",
        fronts=CELL | {COMPARE},
    ),
    Option(
        "per_output",
        "tolerance for one output, a prefix (model) or a glob (model.*.grad); repeatable",
        kind="list",
        flag="--tol",
        metavar="PATH=RTOL,ATOL",
        fronts=CELL | {COMPARE},
    ),
    Option(
        "judge",
        "tolerance (default): fixed rtol/atol, and a failing float output shows its error ratio "
        "R against a float64 oracle; budget: a float output passes when R is within the "
        "reference's precision budget (R <= 2)",
        kind="choice",
        choices=("tolerance", "budget"),
        default="tolerance",
    ),
    Option(
        "seed",
        "seed of torch, random and numpy at the start of each run",
        kind="int",
        default=0,
        fronts=CELL | {RECORD},
    ),
    Option(
        "keep",
        "whose results stay in the namespace afterwards",
        kind="choice",
        choices=("ref", "target"),
        default="ref",
    ),
    Option(
        "layers",
        "record per-module statistics and name the first module where outputs diverge",
        kind="bool",
        default=False,
    ),
    Option(
        "layers_full",
        "keep the full outputs of these modules (name or glob) for an element-wise look; "
        "repeatable (implies layers)",
        kind="list",
        metavar="NAME",
    ),
    Option(
        "steps",
        "run the cell N times per backend as consecutive training steps; compare per step "
        "(profiles separate the first call from the rest)",
        kind="int",
        default=1,
        metavar="N",
    ),
    Option(
        "max_steps",
        "stop both runs after N scalars (loss.item(), ...) from the first call site that makes "
        "one: compare the first N steps of a long training loop",
        kind="int",
        metavar="N",
    ),
    Option(
        "rng",
        "where random numbers are drawn: device (each device's generator) or cpu (draw on the "
        "CPU and move, so both runs see the same ones)",
        kind="choice",
        choices=("device", "cpu"),
        default="device",
    ),
    Option(
        "what_if",
        "bf16-matmul: round float32 matmul/conv inputs to bfloat16 on the emulated target",
        kind="choice",
        choices=("bf16-matmul",),
    ),
    Option(
        "ref_precision",
        "cuda (default): a cpu reference computes as a CUDA GPU would, TF32 matmuls when the "
        "cell enables them; fp32: full float32 matmuls",
        kind="choice",
        choices=("cuda", "fp32"),
        default="cuda",
    ),
    Option(
        "compile_check",
        "run the cell once more with torch.compile off on both sides and report both verdicts, "
        "so a difference the compiler makes shows as one",
        kind="bool",
        default=False,
    ),
    Option(
        "list_fallbacks",
        "tpu target: run with the CPU fallback on and list every missing op in one run "
        "(TorchTPU stops at the first by default)",
        kind="bool",
        default=False,
    ),
    Option(
        "track_per_op",
        "real neuron target: attribute every CPU fallback to its call and line (a synchronize "
        "per op)",
        kind="bool",
        default=False,
    ),
    Option(
        "profile",
        "record an op-level profile (time, calls, memory) of both runs; emulated timings are "
        "host CPU time, and the runs take turns",
        kind="bool",
        default=False,
        group=CELL_GROUP,
    ),
    Option(
        "strict",
        "fail (a usage error; exit 3 from the command line) if any op fell back to CPU",
        kind="bool",
        default=False,
        group=CELL_GROUP,
        fronts=CELL | {COMPARE},
    ),
    Option(
        "allow_fallback",
        "ops that may fall back under strict (aten::sort or sort), comma-separated; repeatable",
        kind="list",
        metavar="OPS",
        group=CELL_GROUP,
        fronts=CELL | {COMPARE},
    ),
    Option(
        "strict_graph_breaks",
        "fail (exit 4 from the command line) if torch.compile broke a graph on the target "
        "(each break is listed in the report with its reason and line)",
        kind="bool",
        default=False,
        group=CELL_GROUP,
    ),
    Option(
        "scan",
        "skip the migration scan of the cell source",
        kind="bool",
        default=True,
        flag="--no-scan",
        group=CELL_GROUP,
    ),
    Option(
        "executor",
        "where the target runs: worker (a child process per target that owns the device; a "
        "crash or hang there never touches the kernel), inprocess (this process), or auto "
        "(default, or $NEURON_WORKBENCH_EXECUTOR): worker for neuron and tpu unless this process "
        "already holds that device, inprocess for cpu and cuda",
        kind="choice",
        choices=("auto", "inprocess", "worker"),
        default="auto",
        env=("NEURON_WORKBENCH_EXECUTOR",),
        group=CELL_GROUP,
    ),
    Option(
        "cluster",
        "run the target in a Ray actor on a node that has its device: ray://HOST:PORT, ray (the "
        "cluster this kernel connected to with ray.init), or local; the reference stays here",
        flag="--on",
        metavar="CLUSTER",
        default="",
        group=CELL_GROUP,
    ),
    Option(
        "timeout",
        "seconds a worker target run may take before it is ended and reported (neuron-workbench "
        "run has its own --timeout: the limit of each cell)",
        kind="float",
        metavar="S",
        group=CELL_GROUP,
        fronts=frozenset({MAGIC, TRAIT}),
    ),
)

OPTION: dict[str, Option] = {option.name: option for option in OPTIONS}

#: API option names whose flag is not ``--`` plus the name with ``-`` for ``_``.
FLAGS = {o.name: o.flag for o in OPTIONS if o.flag != "--" + o.name.replace("_", "-")}


def flag(name: str) -> str:
    """The command-line flag of an API option name: ``ref_precision`` -> ``--ref-precision``."""
    option = OPTION.get(name)
    return option.flag if option is not None else "--" + name.replace("_", "-")


def options_for(front: str) -> tuple[Option, ...]:
    """The options ``front`` (:data:`MAGIC`, :data:`TRAIT`, :data:`RUN`, ...) takes, in order."""
    return tuple(option for option in OPTIONS if front in option.fronts)


# ---- argparse --------------------------------------------------------------------------------------

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


def given(option: Option, value: Any) -> bool:
    """Whether a parsed ``value`` sets ``option`` (False: the session default applies)."""
    if option.kind == "bool":
        return bool(value)
    if option.kind == "list":
        return bool(value)
    return value is not None


def parsed_value(option: Option, value: Any) -> Any:
    """A parsed flag's value as the option holds it (``--no-scan`` given means ``scan=False``)."""
    if option.name == "scan":
        return not value
    return list(value) if option.kind == "list" else value


def given_values(args: argparse.Namespace, front: str) -> dict[str, Any]:
    """The options ``front`` takes that ``args`` sets, by API name."""
    values = {}
    for option in options_for(front):
        raw = getattr(args, option.name, None)
        if given(option, raw):
            values[option.name] = parsed_value(option, raw)
    return values


def config_lines(values: Mapping[str, Any], section: str = "NeuronMagics") -> list[str]:
    """``%config``-style lines that make ``values`` the session defaults of a notebook's cells."""
    lines = []
    for name, value in values.items():
        option = OPTION[name]
        if TRAIT not in option.fronts:
            raise ValueError(f"{name} is not a session setting")
        lines.append(f"get_ipython().config.{section}.{name} = {value!r}")
    return lines


# ---- the options as data ---------------------------------------------------------------------------


def _with_table_fields(group: str) -> Callable[[type], type]:
    """Give a class one dataclass field per option of ``group``, from the table, then freeze it.

    The class's own annotations (settings no flag sets) come after the table's fields.
    """

    def decorate(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        annotations: dict[str, Any] = {}
        for option in OPTIONS:
            if option.group != group:
                continue
            annotations[option.name] = "Any"
            default = option.default
            if option.kind == "list":
                default = ()
            setattr(cls, option.name, field(default=default))
        annotations.update(own)
        cls.__annotations__ = annotations
        doc = [cls.__doc__ or "", "", "    Attributes (from the option table)", "    " + "-" * 34]
        for option in OPTIONS:
            if option.group == group:
                doc += [f"    {option.name}", f"        {option.help} ({option.flag})."]
        cls.__doc__ = "\n".join(doc)
        return dataclasses.dataclass(frozen=True)(cls)

    return decorate


def table_values(values: Mapping[str, Any], group: str) -> dict[str, Any]:
    """The entries of ``values`` that are fields of ``group``'s options, lists as tuples."""
    out = {}
    for name, value in values.items():
        option = OPTION.get(name)
        if option is not None and option.group == group:
            out[name] = tuple(value) if option.kind == "list" else value
    return out


@_with_table_fields(COMPARE_GROUP)
class CompareOptions:
    """How the two runs of a cell are made and compared (also recorded in the report).

    ``per_output`` holds ``PATH=RTOL,ATOL`` texts as flags give them; ``target`` is one backend
    (further ones are :attr:`CellOptions.extra_targets`).
    """

    def __post_init__(self) -> None:
        if not self.ref:  # type: ignore[attr-defined]
            from neuron_workbench.backends import default_reference

            object.__setattr__(self, "ref", default_reference())
        if self.layers_full and not self.layers:  # type: ignore[attr-defined]
            object.__setattr__(self, "layers", True)

    def backend(self, name: str) -> Any:
        """The adapter for ``name`` with the options these settings give it (tpu, neuron)."""
        from neuron_workbench.backends import get_backend

        backend = get_backend(name)
        options = {}
        if self.list_fallbacks and backend.name == "tpu":  # type: ignore[attr-defined]
            options["list_fallbacks"] = True
        if self.track_per_op and backend.name == "neuron":  # type: ignore[attr-defined]
            options["track_per_op"] = True
        return get_backend(backend.name, **options) if options else backend

    def policy(self) -> Any:
        """The :class:`~neuron_workbench.compare.tolerances.TolerancePolicy` these describe."""
        from neuron_workbench.compare.tolerances import TolerancePolicy, parse_override

        per_output = tuple(
            parse_override(each) if isinstance(each, str) else each
            for each in self.per_output  # type: ignore[attr-defined]
        )
        return TolerancePolicy(self.preset, self.rtol, self.atol, per_output)  # type: ignore[attr-defined]

    def validate(self) -> None:
        """Raise :class:`~neuron_workbench.errors.OptionError` for anything a run could not honour.

        The error names options by API name; each front end spells them as its flags.
        """
        from neuron_workbench.backends import get_backend

        get_backend(self.ref)  # type: ignore[attr-defined]
        get_backend(self.target)  # type: ignore[attr-defined]
        self.policy()
        for option in OPTIONS:
            if option.group == COMPARE_GROUP and option.kind == "choice":
                value = getattr(self, option.name)
                if value not in option.choices and not (value is None and option.default is None):
                    raise OptionError(
                        "{0} must be one of {choices}",
                        option.name,
                        choices=", ".join(option.choices),
                    )
        if self.steps < 1:  # type: ignore[attr-defined]
            raise OptionError("{0} must be at least 1", "steps")
        if self.max_steps is not None and self.max_steps < 1:  # type: ignore[attr-defined]
            raise OptionError("{0} must be at least 1", "max_steps")

    def check_target_flags(self, targets: Iterable[str]) -> None:
        """Raise :class:`~neuron_workbench.errors.OptionError` for a target option no target takes."""
        from neuron_workbench.backends import get_backend

        names = {get_backend(name).name for name in targets}
        if self.list_fallbacks and "tpu" not in names:  # type: ignore[attr-defined]
            raise OptionError("{0} applies to a tpu target", "list_fallbacks")
        if self.track_per_op and "neuron" not in names:  # type: ignore[attr-defined]
            raise OptionError("{0} applies to a neuron target", "track_per_op")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], **values: Any) -> CompareOptions:
        """The options a report recorded (:meth:`to_dict`'s form), with ``values`` over them.

        Settings a report of an older version lacks take their defaults.
        """
        tolerance = data.get("tolerance") or {}
        recorded: dict[str, Any] = {
            name: data[name]
            for name in (o.name for o in OPTIONS if o.group == COMPARE_GROUP)
            if name in data and name != "per_output"
        }
        recorded["layers_full"] = tuple(data.get("layers_full") or ())
        recorded.update(
            preset=tolerance.get("preset", "default"),
            rtol=tolerance.get("rtol"),
            atol=tolerance.get("atol"),
            per_output=tuple(
                f"{path}={pair[0]},{pair[1]}"
                for path, pair in (tolerance.get("per_output") or {}).items()
            ),
        )
        if "rtol" in values or "atol" in values:  # a pair given replaces the recorded pair
            recorded["rtol"], recorded["atol"] = values.get("rtol"), values.get("atol")
        return cls(**{**recorded, **table_values(values, COMPARE_GROUP)})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the report's ``options``).

        Settings older reports lacked are left out while at their default.
        """
        data: dict[str, Any] = {
            "ref": self.ref,  # type: ignore[attr-defined]
            "target": self.target,  # type: ignore[attr-defined]
            "seed": self.seed,  # type: ignore[attr-defined]
            "keep": self.keep,  # type: ignore[attr-defined]
            "tolerance": self.policy().to_dict(),
            "layers": self.layers,  # type: ignore[attr-defined]
            "layers_full": list(self.layers_full),  # type: ignore[attr-defined]
            "steps": self.steps,  # type: ignore[attr-defined]
            "rng": self.rng,  # type: ignore[attr-defined]
            "what_if": self.what_if,  # type: ignore[attr-defined]
            "ref_precision": self.ref_precision,  # type: ignore[attr-defined]
        }
        for name in ("list_fallbacks", "track_per_op", "compile_check"):
            if getattr(self, name):
                data[name] = True
        if self.judge != "tolerance":  # type: ignore[attr-defined]
            data["judge"] = self.judge  # type: ignore[attr-defined]
        if self.max_steps is not None:  # type: ignore[attr-defined]
            data["max_steps"] = self.max_steps  # type: ignore[attr-defined]
        return data


@_with_table_fields(CELL_GROUP)
class CellOptions:
    """Everything one cell can be asked to do, as data: its runs' options and what surrounds them.

    The settings no flag sets: ``compare``; ``record`` and ``against`` (an artifact path, which
    ``%%neuron --record/--against`` give per cell and ``neuron-workbench run`` per input);
    ``extra_targets`` (``target=neuron,tpu``: compared against the same reference run);
    ``source_first_line`` (the line number the user sees for the source's first line, 2 in a
    ``%%neuron`` cell); ``cluster_options`` (how Ray actors are placed, a ``RayOptions``).
    """

    compare: CompareOptions = field(default_factory=CompareOptions)  # type: ignore[call-arg]
    record: str | None = None
    against: str | None = None
    extra_targets: tuple[str, ...] = ()
    source_first_line: int = 1
    cluster_options: Any = None

    def __post_init__(self) -> None:
        # "sort,topk" and repeated flags alike: one op per entry
        ops = tuple(
            op.strip()
            for each in self.allow_fallback  # type: ignore[attr-defined]
            for op in str(each).split(",")
            if op.strip()
        )
        object.__setattr__(self, "allow_fallback", ops)

    @property
    def targets(self) -> tuple[str, ...]:
        """Every target, first one first."""
        return (self.compare.target, *self.extra_targets)  # type: ignore[attr-defined]

    @property
    def resolved_executor(self) -> str:
        """``inprocess``, ``worker`` (``auto`` decided for these targets), or ``ray`` (``cluster``)."""
        from neuron_workbench.backends.registry import resolve_executor

        if self.cluster:  # type: ignore[attr-defined]
            return "ray"
        return resolve_executor(self.executor, self.targets)  # type: ignore[attr-defined]

    def validate(self) -> None:
        """Raise :class:`~neuron_workbench.errors.OptionError` for settings no run could honour."""
        from neuron_workbench.backends import get_backend
        from neuron_workbench.emulator.profiles import DEVICES

        self.compare.validate()  # type: ignore[attr-defined]
        executor = OPTION["executor"]
        if self.executor not in executor.choices:  # type: ignore[attr-defined]
            raise OptionError(
                "{0} must be one of {choices}", "executor", choices=", ".join(executor.choices)
            )
        self.compare.check_target_flags(self.targets)  # type: ignore[attr-defined]
        cluster = self.cluster  # type: ignore[attr-defined]
        if cluster:
            # only here is the Ray executor's module imported (it imports Ray itself only on use)
            from neuron_workbench.run.ray_cluster import parse_cluster

            if parse_cluster(cluster) != cluster:
                raise OptionError("{0} {value!r} names no Ray cluster", "cluster", value=cluster)
            if self.executor == "inprocess":  # type: ignore[attr-defined]
                raise OptionError(
                    "{0} runs the target in a Ray actor; {1} inprocess would run it here",
                    "cluster",
                    "executor",
                )
            if self.cluster_options is not None:
                self.cluster_options.validate()
        timeout = self.timeout  # type: ignore[attr-defined]
        if timeout is not None and timeout <= 0:
            raise OptionError("{0} must be a positive number of seconds", "timeout")
        if timeout is not None and self.resolved_executor not in ("worker", "ray"):
            raise OptionError("{0} needs {1} worker (a worker can be ended)", "timeout", "executor")
        targets = self.targets
        for name in self.extra_targets:
            get_backend(name)
        if len(set(targets)) != len(targets):
            raise OptionError(
                "{0} names a backend twice: {names}", "target", names=",".join(targets)
            )
        accelerators = [name for name in targets if name in DEVICES]
        if len(accelerators) > 1 and self.resolved_executor not in ("worker", "ray"):
            raise OptionError(
                "{0} {names} needs {1} worker: one process holds one accelerator backend",
                "target",
                "executor",
                names=",".join(targets),
            )


def cell_options(values: Mapping[str, Any], **settings: Any) -> CellOptions:
    """The :class:`CellOptions` of option ``values`` by API name (as front ends parse them).

    A value left out takes its environment default (``target``, ``executor``) or the table's;
    ``target`` may name several backends, comma-separated. ``settings`` are the fields no flag
    sets (``record``, ``against``, ``source_first_line``, ``cluster_options``).

    Raises
    ------
    OptionError
        For a ``target`` naming no backend.
    """
    values = dict(values)
    for name in ("target", "executor"):
        if values.get(name) in (None, ""):
            values[name] = OPTION[name].env_default()
    targets = [t.strip() for t in str(values["target"]).split(",") if t.strip()]
    if not targets:
        raise OptionError("{0} needs a backend name", "target")
    values["target"] = targets[0]
    compare = CompareOptions(**table_values(values, COMPARE_GROUP))  # type: ignore[call-arg]
    return CellOptions(  # type: ignore[call-arg]
        compare=compare,
        extra_targets=tuple(targets[1:]),
        **table_values(values, CELL_GROUP),
        **settings,
    )
