"""Plain records of one run: its error, its fallbacks, its outcome."""

from __future__ import annotations

import cmath
import dataclasses
import linecache
import os
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.backends.base import BackendInfo, MemoryStats
from neuron_workbench.sites import function_at, is_user_file, relabel_site


@dataclass(frozen=True)
class RunError:
    """An exception a run raised, reduced to what a report shows.

    Attributes
    ----------
    type : str
        Exception class name, e.g. ``RuntimeError``.
    message : str
        ``str(exception)``, first line first.
    lineno : int or None
        Line in the cell where the failing statement is (the last cell frame of the traceback).
    line : str
        The source text of that line.
    site : dict or None
        Where in the user's code below the cell it was raised (``file``, ``line``, ``function``):
        the innermost frame of a notebook's earlier cell, a script or a project module (not
        torch's, an installed package's or the standard library's); None when that is the cell's
        own line.
    """

    type: str
    message: str
    lineno: int | None = None
    line: str = ""
    site: dict[str, Any] | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, cell_filename: str) -> RunError:
        """Build from an exception raised while executing the cell compiled as ``cell_filename``."""
        lineno = None
        innermost = None
        for frame, frame_lineno in traceback.walk_tb(exc.__traceback__):
            code = frame.f_code
            if code.co_filename == cell_filename:
                lineno = frame_lineno
            if is_user_file(code.co_filename):
                innermost = (code, frame_lineno)
        line = linecache.getline(cell_filename, lineno).strip() if lineno else ""
        site = None
        if innermost is not None and innermost[0].co_filename != cell_filename:
            code, frame_lineno = innermost
            function = getattr(code, "co_qualname", code.co_name)
            site = {"file": code.co_filename, "line": frame_lineno, "function": function}
        try:
            message = str(exc)
        except Exception:  # its __str__ failed: said as Python's own traceback says it
            message = "<exception str() failed>"
        return cls(type(exc).__name__, message, lineno, line, site)

    @property
    def raised_in(self) -> str:
        """``in Net.forward at cell [1], line 9`` (the :attr:`site`), or ``""`` without one."""
        return f"in {function_at(self.site)}" if self.site else ""

    @property
    def summary(self) -> str:
        """``RuntimeError: message`` on one line (first line of the message).

        A compiler's wrapper whose first line only says who raised (``BackendCompilerFailed:
        backend='tpu' raised:``) is joined with the next line, the real cause. An error torch
        re-raised from a DataLoader worker (``Caught ValueError in DataLoader worker process 0.``
        and the worker's traceback) shows the worker's own error and where it was caught, as does
        one ``torch.multiprocessing.spawn`` re-raised from a process it started.
        """
        lines = [line.strip() for line in self.message.strip().splitlines() if line.strip()]
        first = lines[0] if lines else ""
        if first.endswith("raised:") and len(lines) > 1:
            first = f"{first} {lines[1]}"
        caught = _caught_elsewhere(self.type, lines)
        if caught is None:
            caught = _raised_in_spawned_process(self.type, self.message)
        if caught is not None:
            return caught
        return f"{self.type}: {first}" if first else self.type

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        data: dict[str, Any] = {
            "type": self.type,
            "message": self.message,
            "lineno": self.lineno,
            "line": self.line,
        }
        if self.site:
            data["site"] = dict(self.site)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunError:
        """Inverse of :meth:`to_dict`."""
        lineno = data.get("lineno")
        site = data.get("site")
        return cls(
            str(data["type"]),
            str(data["message"]),
            int(lineno) if lineno else None,
            str(data.get("line", "")),
            dict(site) if isinstance(site, Mapping) else None,
        )


#: The first line of an error torch re-raised from another thread or process
#: (``torch._utils.ExceptionWrapper``): ``Caught ValueError in DataLoader worker process 0.``
_CAUGHT_LINE = re.compile(r"^Caught (?P<name>[\w.]+) (?P<where>in .+)\.$")


def _caught_elsewhere(raised: str, lines: Sequence[str]) -> str | None:
    """``ValueError: bad sample 5 (in DataLoader worker process 0)`` for a re-raised worker error.

    torch re-raises an error of a DataLoader worker (or its pin-memory thread) in the main process
    as the same class (``raised``; ``RuntimeError`` when that class cannot be built from one
    message) with the worker's formatted traceback as its message, so the first line only says
    where it was caught; the cause is the traceback's last line for the caught class
    (``ValueError: bad sample 5``, or ``mod.MyError: ...`` for a class outside builtins). None
    for any other error.
    """
    caught = _CAUGHT_LINE.match(lines[0]) if lines else None
    if caught is None or len(lines) < 2 or not lines[1].startswith("Original Traceback"):
        return None
    name = caught["name"]
    header = re.compile(rf"^(?:[\w.]+\.)?{re.escape(name)}(?::\s*(?P<message>.*))?$")
    for line in reversed(lines[2:]):
        found = header.match(line)
        if found is not None:
            cause = f"{name}: {found['message']}" if found["message"] else name
            if name != raised:
                cause = f"{raised}: {cause}"
            return f"{cause} ({caught['where']})"
    return None


#: The first line of the error ``torch.multiprocessing.spawn`` re-raises from a process it started
#: (``ProcessRaisedException``, the process's formatted traceback after it).
_SPAWNED_LINE = re.compile(r"^-- Process (?P<rank>\d+) terminated with the following error:$")


def _raised_in_spawned_process(raised: str, message: str) -> str | None:
    """``ProcessRaisedException: ValueError: bad rank (in spawned process 0)``, else None.

    ``mp.spawn(worker, nprocs=N)`` (a DDP training script's entry point) re-raises an error of a
    process it started as ``ProcessRaisedException`` whose message is that process's traceback:
    its first line (``-- Process 0 terminated with the following error:``) says nothing of the
    cause, which is the exception line that ends the last traceback in it.
    """
    lines = message.strip().splitlines()
    spawned = _SPAWNED_LINE.match(lines[0].strip()) if lines else None
    if spawned is None:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")]
    if not starts:
        return None
    # the frames below the header are indented; the exception's own line is not
    cause = next((line for line in lines[starts[-1] + 1 :] if line and not line[0].isspace()), "")
    if not cause:
        return None
    return f"{raised}: {cause.strip()} (in spawned process {spawned['rank']})"


@dataclass(frozen=True)
class NotCompared:
    """Stands for an output that could not be compared, and says why.

    A result that could not come back from the target's process (the target's device module, a
    device-bound object the kernel cannot rebuild) is reported as not compared instead of failing
    the cell; the verdict covers the other outputs.

    Attributes
    ----------
    reason : str
        One line, e.g. ``could not be sent back from the neuron worker process (TypeError: ...)``.
    """

    reason: str


def recorded(value: Any) -> Any:
    """What an instrument recorded: a recorder's ``result()`` or ``trace``, else ``value`` itself.

    A run turns each instrument's recorder into its record when it ends (in this process and in a
    worker alike), so ``Run.extras`` holds records; runs loaded from an artifact hold their dicts.
    """
    if callable(getattr(value, "result", None)):
        value = value.result()
    if not hasattr(value, "to_dict") and hasattr(getattr(value, "trace", None), "to_dict"):
        value = value.trace
    return value


@dataclass
class RunFacts:
    """What a run did that can explain numeric differences (noticed while remapping CUDA).

    Attributes
    ----------
    random_ops : dict of str to int
        Random draws by function (``torch.randn``, ``Tensor.normal_``, dropout in training...).
    dropout_in_training : int
        Dropout calls with ``training=True`` and ``p > 0``.
    nondeterministic_ops : dict of str to int
        Accumulating scatters (``index_add_``, ``scatter_add_``, ``index_put_(accumulate=True)``),
        whose result order, and so rounding, varies on GPUs and accelerators.
    autocast_dtypes : list of str
        Lower-precision dtypes of the autocast regions the cell entered.
    cpu_autocast : bool
        Whether the cell entered CPU autocast (``torch.autocast("cpu")``, or a device type read
        from a tensor, ``torch.autocast(device_type=x.device.type)``) on the host standing in for
        cuda: it casts the cell's cuda tensors there, with the CPU's op lists.
    rng_on_cpu : bool
        Whether random numbers were drawn from the CPU generator (``--rng cpu``).
    random_draws : list of tuple
        In order, each device draw's function and a fingerprint of its first numbers (for dropout,
        where its zeros are), so two runs can tell whether they saw the same random numbers; the
        first :data:`MAX_DRAWS` draws are kept.
    convolutions, attention_calls, rnn_calls : int
        Convolution, ``scaled_dot_product_attention`` and recurrent-layer (``torch.lstm``, ``gru``,
        ``rnn_*``) calls: their kernels differ by device.
    tf32_matmuls : bool
        Whether float32 matmuls rounded their inputs to TF32 (a cpu reference standing in for a
        CUDA GPU, with TF32 enabled by the cell).
    notes : list of str
        How the reference stood in for another device (``cpu`` as ``cuda``), and what stays
        different from that device.
    rule_ops : dict of str to int
        Emulated targets: ops each numeric rule touched in the run (``"tpu-matmul"``: float32
        matmuls/convolutions computed with bf16 passes; ``"tpu-matmul-1pass"``: those computed
        with one pass; ``"fp64"``: float64 ops computed as
        float32; ``"int64"``: int64 ops computed as int32; ``"int64-wrapped"``: those of them in
        which int32 changed a value, beyond its range; ``"fp64-rounded"``: the float64 ops in
        which float32 changed a value). Empty where no emulator ran.
    shared_host : bool
        Whether the run ran at the same time as the other run of its cell (a target in its
        worker while the reference ran in the kernel): its wall time shares the host's cores.
    temp_names : list of str
        The random names ``tempfile`` drew in the run, in order (the first 256): a path built on
        one (``tempfile.TemporaryDirectory().name``) differs between runs of the same code.
    measured_texts : dict of str to (str, str)
        The texts the run made of its measurements (``f"{ms:.1f}"``, ``str(dt)``, a profile's
        table), each with its measurement's kind and source (the first 256): a log line the cell
        builds from a timing differs between runs of the same code.
    measured_values : dict of float to (str, str)
        The float values of the run's measurements, each with its kind and source (the first
        4096): a plain ``float(np.median(times))`` or a pandas column of timings holds them.
    """

    random_ops: dict[str, int] = field(default_factory=dict)
    dropout_in_training: int = 0
    nondeterministic_ops: dict[str, int] = field(default_factory=dict)
    autocast_dtypes: list[str] = field(default_factory=list)
    cpu_autocast: bool = False
    rng_on_cpu: bool = False
    random_draws: list[tuple[Any, ...]] = field(default_factory=list)
    convolutions: int = 0
    attention_calls: int = 0
    rnn_calls: int = 0
    tf32_matmuls: bool = False
    notes: list[str] = field(default_factory=list)
    rule_ops: dict[str, int] = field(default_factory=dict)
    shared_host: bool = False
    temp_names: list[str] = field(default_factory=list)
    measured_texts: dict[str, tuple[str, str]] = field(default_factory=dict)
    measured_values: dict[float, tuple[str, str]] = field(default_factory=dict)

    def note_draw(self, name: str, fingerprint: tuple[Any, ...]) -> None:
        """Remember one device draw (bounded: the first :data:`MAX_DRAWS`)."""
        if len(self.random_draws) < MAX_DRAWS:
            self.random_draws.append((name, *fingerprint))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "random_ops": dict(self.random_ops),
            "dropout_in_training": self.dropout_in_training,
            "nondeterministic_ops": dict(self.nondeterministic_ops),
            "autocast_dtypes": list(self.autocast_dtypes),
            "cpu_autocast": self.cpu_autocast,
            "rng_on_cpu": self.rng_on_cpu,
            "random_draws": [list(_plain_draw(draw)) for draw in self.random_draws],
            "convolutions": self.convolutions,
            "attention_calls": self.attention_calls,
            "rnn_calls": self.rnn_calls,
            "tf32_matmuls": self.tf32_matmuls,
            "notes": list(self.notes),
            "rule_ops": dict(self.rule_ops),
            "shared_host": self.shared_host,
            "temp_names": list(self.temp_names),
            "measured_texts": [[text, *kept] for text, kept in self.measured_texts.items()],
            # grouped by source: a timing loop measures thousands of values from one or two
            "measured_values": [
                [*kept, [value for value, each in self.measured_values.items() if each == kept]]
                for kept in dict.fromkeys(self.measured_values.values())
            ],
        }


#: Device random draws whose fingerprints a run keeps.
MAX_DRAWS = 256


#: The suffix of a random function counted in ``random_ops`` inside a compiled graph: the compiler
#: draws its numbers with its own generator, where no fingerprint is taken.
COMPILED_DRAW = " (compiled)"


def compiled_draws(*runs: RunFacts) -> list[str]:
    """The random functions the runs called inside compiled graphs (:data:`COMPILED_DRAW`)."""
    return sorted({op for facts in runs for op in facts.random_ops if op.endswith(COMPILED_DRAW)})


def same_random_numbers(a: RunFacts, b: RunFacts) -> bool | None:
    """Whether two runs drew the same random numbers: True, False, or None when unknown.

    Unknown when either run recorded no fingerprints although it drew (a real CUDA run, whose draws
    are not intercepted, or a run loaded from an artifact), or drew inside a compiled graph
    (:data:`COMPILED_DRAW`): the fingerprints of its other draws say nothing of those.
    """
    drew_a, drew_b = bool(a.random_ops), bool(b.random_ops)
    if not drew_a and not drew_b:
        return True
    if (drew_a and not a.random_draws) or (drew_b and not b.random_draws):
        return None
    if compiled_draws(a, b):
        return None
    draws_a, draws_b = a.random_draws, b.random_draws
    return len(draws_a) == len(draws_b) and all(
        _same_draw(_plain_draw(x), _plain_draw(y)) for x, y in zip(draws_a, draws_b, strict=True)
    )


#: How close two fingerprints' numbers are when both runs drew the same numbers: a target that
#: computes float64 as float32 (TorchNeuron) draws a float64 tensor's numbers at float32 precision
#: (6e-8 apart, relatively). Numbers of different draws differ in their leading digits, however
#: small they are (no absolute tolerance: draws of 1e-7 are told apart).
_DRAW_RTOL, _DRAW_ATOL = 1e-6, 0.0


def _same_draw(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two fingerprints (op name, shape, leading numbers) are of the same numbers."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, tuple) or isinstance(y, tuple):
            if not (isinstance(x, tuple) and isinstance(y, tuple) and _same_draw(x, y)):
                return False
        elif type(x) in (float, complex) or type(y) in (float, complex):
            numbers = (int, float, complex)
            if not (
                isinstance(x, numbers)
                and isinstance(y, numbers)
                and cmath.isclose(x, y, rel_tol=_DRAW_RTOL, abs_tol=_DRAW_ATOL)
            ):
                return False
        elif x != y:
            return False
    return True


def _plain_draw(draw: Any) -> tuple[Any, ...]:
    """A draw's fingerprint as nested tuples (a recorded one comes back from JSON as lists)."""
    return tuple(_plain_draw(item) if isinstance(item, list | tuple) else item for item in draw)


@dataclass
class Run:
    """The outcome of executing a cell once on one backend.

    ``outputs`` holds live objects (tensors, modules) keyed by the name the cell bound, with the
    trailing expression under ``Out``; it is never printed in reprs. ``wall_time_s`` is host wall
    time of the cell body (host CPU time for emulated devices), kept out of every ``text/plain``.
    """

    backend: BackendInfo
    error: RunError | None = None
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)
    last_value: Any = field(default=None, repr=False)
    stdout: str = ""
    stderr: str = ""
    #: The order ``stdout`` and ``stderr`` came in, as ``(stream, characters)`` pieces of each in
    #: turn (``[("stdout", 6), ("stderr", 30), ("stdout", 6)]``: a warning between two prints);
    #: empty where the capture did not keep it.
    printed_order: list[tuple[str, int]] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    memory: MemoryStats = field(default_factory=MemoryStats)
    wall_time_s: float | None = None
    shared_names: list[str] = field(default_factory=list)
    # What committing this run into the user's namespace means: names to (re)bind, names to delete.
    bindings: dict[str, Any] = field(default_factory=dict, repr=False)
    deleted: list[str] = field(default_factory=list)
    #: Names the run bound whose values could not come back from its process (a generator, a
    #: lock): left out of ``bindings``; a kept target's are the reference's values then.
    left_behind: list[str] = field(default_factory=list)
    #: Whether the cell set (or unset) torch's default device, and to what, as the cell means it
    #: (``"cuda"`` for the run's own device, None for unset): committing the run sets it.
    sets_default_device: bool = False
    default_device: str | None = None
    rng_state: Any = field(default=None, repr=False)
    facts: RunFacts = field(default_factory=RunFacts)
    #: With ``steps > 1``: the scalars the cell bound after each repetition (a loss curve).
    steps: list[dict[str, float]] = field(default_factory=list)
    #: What each instrument of the run recorded, by instrument name (see ``RunSpec.instruments``).
    extras: dict[str, Any] = field(default_factory=dict, repr=False)
    #: What the run did to stand-ins of the notebook's open files and progress bars: committing
    #: the run does it to them (see :mod:`~neuron_workbench.run.notebook_handles`).
    notebook_handle_uses: list[tuple[Any, ...]] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        """True when the cell ran to the end."""
        return self.error is None

    def fallback_ops(self) -> list[str]:
        """Sorted unique names of the ops that ran on CPU instead of the device."""
        return sorted({str(event["op"]) for event in self.fallbacks})

    def relabel_sites(
        self, cells: Mapping[str, int | tuple[int, int]], folders: Sequence[str] = ()
    ) -> None:
        """Relabel, in place, every site the run carries (:func:`~neuron_workbench.sites.relabel_site`).

        Fallback events, op-profile rows, the graphs and graph breaks of its torch.compile record,
        and the files its captured warnings name (``stderr``).
        """
        if self.error is not None and self.error.site:
            # where below the cell it was raised: a notebook cell as `cell [N]`
            self.error = dataclasses.replace(
                self.error, site=relabel_site(self.error.site, cells, folders)
            )
        for index, event in enumerate(self.fallbacks):
            if isinstance(event, dict) and isinstance(event.get("site"), Mapping):
                self.fallbacks[index] = {
                    **event,
                    "site": relabel_site(event["site"], cells, folders),
                }
        if isinstance(self.stderr, str):
            # warnings name the file they come from: library files read relative to their root
            for folder in sorted((f for f in folders if f), key=len, reverse=True):
                self.stderr = self.stderr.replace(folder.rstrip(os.sep) + os.sep, "")
        compiled = recorded(self.extras.get("compile")) if isinstance(self.extras, dict) else None
        for key in ("graphs", "graph_breaks"):
            entries = (
                compiled.get(key) if isinstance(compiled, dict) else getattr(compiled, key, None)
            )
            for index, entry in enumerate(entries or []):
                if isinstance(entry, dict) and entry.get("file") not in (None, "", "cell"):
                    entries[index] = relabel_site(entry, cells, folders)
        profile = self.extras.get("profile") if isinstance(self.extras, dict) else None
        if profile is None:
            return
        profile = recorded(profile)
        if isinstance(profile, dict):
            tables = [profile.get(k) or [] for k in ("rows", "first_call", "steady")]
            for rows in tables:
                for row in rows:
                    if isinstance(row, dict) and isinstance(row.get("site"), Mapping):
                        row["site"] = relabel_site(row["site"], cells, folders)
            return
        for rows in (profile.rows, profile.first_call or [], profile.steady or []):
            for row in rows:
                if isinstance(row.site, Mapping):
                    row.site = relabel_site(row.site, cells, folders)
