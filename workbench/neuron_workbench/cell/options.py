"""Every option of a cell, once: the table each front end is built from.

One :class:`Option` per setting gives its API name, flag, kind, choices, default, help and the front
ends that take it. From :data:`OPTIONS` come the fields of ``CompareOptions`` and ``CellOptions``
(:mod:`~neuron_workbench.cell.settings`), the ``%%neuron`` arguments and ``NeuronMagics`` traits
(``magics/neuron.py``), the ``neuron-workbench run``/``record``/``compare`` arguments and the
``%config`` lines the notebook runner writes (:mod:`~neuron_workbench.cell.option_parsing`), and the
flag spelling of every option error. Adding an option is one entry here
plus its behaviour; ``tests/cell/test_options.py`` fails when a front end lacks one.

This module imports no torch: the command line parses its arguments with it before torch loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

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
        "seed of torch, random and numpy at the start of each run (default: each run starts from "
        "the notebook's random state, and the kept run's carries on in the notebook; a script, "
        "and a cell that records or compares against a recording, are seeded with 0)",
        kind="int",
        default=None,
        metavar="N",
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
