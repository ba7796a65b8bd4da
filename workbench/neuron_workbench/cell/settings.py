"""The options of a cell as data: :class:`CompareOptions`, :class:`CellOptions`, built from values.

Their fields come from the option table (:mod:`neuron_workbench.cell.options`): one per option of
its group, with the table's default. Imports no torch at module level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from typing import Any

from neuron_workbench.cell.options import (
    CELL_GROUP,
    COMPARE_GROUP,
    OPTION,
    OPTIONS,
)
from neuron_workbench.errors import OptionError


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


def _check_choices(options: Any, group: str) -> None:
    """Raise the :class:`OptionError` of a ``choice`` option of ``group`` set to no choice."""
    for option in OPTIONS:
        if option.group == group and option.kind == "choice":
            value = getattr(options, option.name)
            if value not in option.choices and not (value is None and option.default is None):
                raise OptionError(
                    "{0} must be one of {choices}", option.name, choices=", ".join(option.choices)
                )


def split_ops(entries: Iterable[str]) -> tuple[str, ...]:
    """One op per entry of ``allow_fallback``: ``"sort,topk"`` and repeated flags alike."""
    return tuple(op.strip() for each in entries for op in str(each).split(",") if op.strip())


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
        _check_choices(self, COMPARE_GROUP)
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
        if self.what_if and "neuron" not in names:  # type: ignore[attr-defined]
            raise OptionError(
                "{0} {value} applies to a neuron target (tpu computes float32 matmuls in 1-pass "
                "bfloat16 already)",
                "what_if",
                value=self.what_if,  # type: ignore[attr-defined]
            )

    def what_if_on(self, backend: str) -> str | None:
        """The what-if policy of a run on ``backend``: ``bf16-matmul`` is neuron's alone.

        With several targets (``--target neuron,tpu``) it applies to neuron, as
        ``list_fallbacks`` applies to tpu.
        """
        return self.what_if if backend == "neuron" else None  # type: ignore[attr-defined]

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

        The settings every report has carried are always there; any other option of the table
        only when it is not at its default, so reports of cells that do not use it stay as they
        were (and a new option needs no line here).
        """
        data: dict[str, Any] = {
            name: getattr(self, name) for name in ("ref", "target", "seed", "keep")
        }
        data["tolerance"] = self.policy().to_dict()
        always = ("layers", "layers_full", "steps", "rng", "what_if", "ref_precision")
        data.update({name: getattr(self, name) for name in always})
        data["layers_full"] = list(data["layers_full"])
        for option in OPTIONS:
            if option.group != COMPARE_GROUP or option.name in data:
                continue
            if option.name in ("preset", "rtol", "atol", "per_output"):
                continue  # in "tolerance"
            value = getattr(self, option.name)
            if value != option.default:
                data[option.name] = list(value) if isinstance(value, tuple) else value
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
        ops = split_ops(self.allow_fallback)  # type: ignore[attr-defined]
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
        _check_choices(self, CELL_GROUP)
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
    for option in OPTIONS:
        if option.env and values.get(option.name) in (None, ""):
            values[option.name] = option.env_default()
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
