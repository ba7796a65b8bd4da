"""Execute a compiled cell once on one backend, isolated from the notebook's state.

The run happens inside the user's real namespace dict (so functions defined in earlier cells, whose
globals *are* that dict, see the run's copies), and the namespace is put back exactly as it was before
returning, whatever happened. Committing a run's results is a separate, explicit step.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import importlib
import io
import itertools
import os
import random
import re
import sys
import time
import types
from collections.abc import Callable, Collection, Iterator, Mapping, MutableMapping
from typing import Any, Protocol

import torch

from neuron_workbench.backends.base import Backend, BackendInfo
from neuron_workbench.errors import note_interrupted
from neuron_workbench.run import logging_setup
from neuron_workbench.run.cell import CellProgram, referenced_names
from neuron_workbench.run.compile_on_host import inductor_on_the_host
from neuron_workbench.run.compiled_frames import compiled_global
from neuron_workbench.run.cuda_module import cuda_names_in
from neuron_workbench.run.cuda_on_host import CudaOnHost, may_enable_tf32
from neuron_workbench.run.file_writes import (
    kept_apart_note,
    originals_kept,
    tempfile_names_drawn,
    writes_kept_apart,
)
from neuron_workbench.run.grad_scalers import scales_made_again
from neuron_workbench.run.measurements import (
    reads_memory_statistics,
    timers_named_in,
    untagged,
)
from neuron_workbench.run.namespace import (
    INPUT_HISTORY,
    ResidentObjects,
    StorageMoves,
    class_attributes_kept,
    devices_on_the_device,
    devices_replaced,
    function_like,
    isolate,
    mark_attribute_tensors,
    mark_mixed_items,
    move_to_device,
    needs_copy,
    notebook_function,
    on_accelerator,
    tensors_in,
    unusable_device,
    version_signature,
    with_names_sharing_state,
)
from neuron_workbench.run.notebook_handles import drain_made, write_back
from neuron_workbench.run.patching import patched_attributes
from neuron_workbench.run.printed_below import FdFile, fds_to_files
from neuron_workbench.run.random_ids import entropy_drawn_from, new_entropy
from neuron_workbench.run.random_state import (
    RandomState,
    current_random_state,
    restore_random_state,
)
from neuron_workbench.run.records import Run, RunError, RunFacts, recorded
from neuron_workbench.run.remap import cuda_remapped_to
from neuron_workbench.run.scalars import StopRun
from neuron_workbench.run.unversioned_writes import UnversionedWrites

#: Output key of the cell's trailing expression.
LAST_EXPRESSION = "Out"


class Captured(Protocol):
    """What a capture context yields: the run's printed text, and a way to replay it."""

    stdout: str
    stderr: str

    def show(self) -> None:
        """Re-emit the captured output to the current display."""


class CapturedStream(io.TextIOWrapper):
    """A run's captured ``sys.stdout`` or ``sys.stderr`` that behaves as the real stream does.

    A ``StringIO`` has no ``buffer``, ``reconfigure`` or ``fileno`` and its ``encoding`` is None,
    so a script calling ``faulthandler.enable()``, ``sys.stdout.reconfigure(line_buffering=True)``
    or ``sys.stdout.buffer.write(...)`` raised in both runs where ``python SCRIPT`` runs it. Text and
    bytes written here are kept in order (UTF-8, every code point, as a ``StringIO`` kept them);
    ``fileno()`` is the replaced stream's, where ``faulthandler`` writes a crash's stack.

    Parameters
    ----------
    real : str
        ``"stdout"`` or ``"stderr"``: which of the process's streams it stands for.
    shown : text stream, optional
        Where the text written is also shown as it comes (a live run: the stream it replaced).
    below : FdFile, optional
        The file the process's fd of the same stream points at meanwhile (a target process's run):
        what the run writes below Python (``os.system``, a subprocess, C code) joins this record
        where it came.
    turns : _Turns, optional
        Shared with the other stream's capture: the order the two were written in.
    """

    def __init__(
        self,
        real: str,
        shown: Any = None,
        below: FdFile | None = None,
        turns: _Turns | None = None,
    ) -> None:
        if shown is None:
            kept = _KeptBytes(below, real, turns)
        else:
            kept = _ShownBytes(shown, below, real, turns)
        super().__init__(
            kept, encoding="utf-8", errors="surrogatepass", newline="", write_through=True
        )
        self._real = real
        #: The stream this one replaces in the run (``sys.stdout`` as the capture began), whose
        #: descriptor :meth:`fileno` gives.
        self.replaced: Any = None
        # the bytes, also after the script closed or detached the stream (a TextIOWrapper of its
        # own over sys.stdout.buffer, freed when the run ends, closes the buffer under it)
        self._kept = kept
        #: Whether the process's fd of the same stream points at the run's file meanwhile.
        self.below = below is not None

    def getvalue(self) -> str:
        """Everything written so far, as text."""
        with contextlib.suppress(ValueError):  # closed or detached: everything is in the bytes
            self.flush()
        data = self._kept.merged()
        try:
            encoding, errors = self.encoding, self.errors or "strict"
        except ValueError:  # detached
            encoding, errors = "utf-8", "surrogatepass"
        return _decoded(data, encoding, errors)

    def pieces(self, cuts: list[int]) -> list[str]:
        """:meth:`getvalue`'s text cut at ``cuts``, offsets in its bytes (``len(cuts) + 1`` pieces)."""
        with contextlib.suppress(ValueError):  # closed or detached: everything is in the bytes
            self.flush()
        data = self._kept.merged()
        cuts = [0, *cuts, len(data)]
        try:
            encoding, errors = self.encoding, self.errors or "strict"
        except ValueError:  # detached
            encoding, errors = "utf-8", "surrogatepass"
        return [
            _decoded(data[start:end], encoding, errors) for start, end in itertools.pairwise(cuts)
        ]

    def fileno(self) -> int:
        """The descriptor of the stream this one replaced, as plain code has it.

        What writes there directly (``subprocess.run(cmd, stdout=sys.stdout)``, the stack
        ``faulthandler.enable()`` dumps) goes where it goes outside a run: in a kernel where the
        notebook's own stream's goes (ipykernel's: the terminal Jupyter runs in, as in a plain
        cell), on the command line to the terminal, in a target's worker to the file its run's
        output is recorded from. The process's own stream's where the replaced one has none (a
        test's capture), as before; ``io.UnsupportedOperation`` where neither has one.
        """
        with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
            if self.replaced is not None and self.replaced is not self:
                return int(self.replaced.fileno())
        stream = getattr(sys, f"__{self._real}__", None)
        if stream is None:
            raise io.UnsupportedOperation("fileno")
        return int(stream.fileno())

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # A value holding the stream (a tqdm bar, a logging handler) is sent back from a worker
        # and copied between runs: as a StringIO of the same text, as the capture was before
        return (text_copy, (self.getvalue(),))


def _decoded(data: bytes, encoding: str, errors: str) -> str:
    """``data`` as text, as written (a script may ``reconfigure()`` the encoding)."""
    try:
        return data.decode(encoding, errors=errors)
    except UnicodeDecodeError:  # bytes of another encoding through .buffer: shown, escaped
        return data.decode(encoding, errors="backslashreplace")


def _streams_to_fds_in_forked_child() -> None:
    """In a child forked during a target process's run, ``sys.stdout``/``sys.stderr`` write to the fds.

    The run's captured streams keep their text in this process's memory: a forked child (a
    DataLoader worker printing in ``__getitem__``) wrote into its own copy of them, which it never
    gave back, and the run's output lost every line. The fds point at the run's files (opened for
    appending), which join the run's record where each line came, as a subprocess's output does.
    """
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if isinstance(stream, CapturedStream) and stream.below:
            raw = io.FileIO(fd, "w", closefd=False)
            text = io.TextIOWrapper(
                raw, encoding="utf-8", errors="surrogatepass", write_through=True
            )
            setattr(sys, name, text)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_streams_to_fds_in_forked_child)


def text_copy(text: str) -> io.StringIO:
    """A ``StringIO`` holding ``text``, positioned at its end (a pickled capture stream)."""
    stream = io.StringIO(text)
    stream.seek(0, io.SEEK_END)
    return stream


class _Turns:
    """The order a run's two captured streams were written in, for its output to show in it.

    Attributes
    ----------
    names : list of str
        The stream of each piece, in order: a piece is what one stream got until the other was
        written to.
    cuts : dict
        For each stream, where its pieces end in its record's bytes (what reached its fd until
        then included); its last piece ends with the record.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.cuts: dict[str, list[int]] = {"stdout": [], "stderr": []}
        self._last: _KeptBytes | None = None

    def wrote(self, kept: _KeptBytes) -> None:
        """``kept``'s stream is about to be written to."""
        if kept is self._last:
            return
        if self._last is not None:
            self.cuts[self._last.name].append(self._last.merged_end())
        self.names.append(kept.name)
        self._last = kept


class _KeptBytes(io.BytesIO):
    """A captured stream's bytes, which closing the stream over them does not lose."""

    def __init__(
        self,
        below: FdFile | None = None,
        name: str = "",
        turns: _Turns | None = None,
    ) -> None:
        super().__init__()
        self._below = below
        #: Which stream these are the bytes of (``"stdout"``, ``"stderr"``).
        self.name = name
        self._turns = turns

    def write(self, data: Any) -> int:
        if self._turns is not None:
            self._turns.wrote(self)
        if self._below is not None:  # what reached the fd before these bytes comes before them
            self._below.mark(self.tell())
        return super().write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:  # each through write(), which notes what reached the fd before it
            self.write(line)

    def merged(self) -> bytes:
        """The bytes written here, with what reached the fd below them where it came."""
        data = self.getvalue()
        return data if self._below is None else self._below.merged(data)

    def merged_end(self) -> int:
        """Where :meth:`merged`'s bytes so far end: what reached the fd until now included."""
        if self._below is None:
            return self.tell()
        return self._below.marked_end(self.tell())

    def close(self) -> None:
        """Nothing: the run's record reads the bytes after the run."""


class _ShownBytes(_KeptBytes):
    """A captured stream's bytes, also written as they come to ``shown`` (a text stream)."""

    def __init__(
        self,
        shown: Any,
        below: FdFile | None = None,
        name: str = "",
        turns: _Turns | None = None,
    ) -> None:
        super().__init__(below, name, turns)
        self._shown = shown
        # a character's bytes split over two writes (through .buffer) show once it is whole
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: Any) -> int:
        written = super().write(data)
        text = self._decoder.decode(bytes(data))
        if text:
            self._shown.write(text)
        return written

    def flush(self) -> None:
        """Flush the stream shown (when the run flushes its own: ``print(..., flush=True)``)."""
        super().flush()
        self._shown.flush()


class _StringCapture:
    def __init__(self, live: bool = False, below: tuple[FdFile, FdFile] | None = None) -> None:
        #: Whether the run's output was shown as it came (:meth:`show` shows nothing then).
        self.live = live
        out_below, err_below = below if below is not None else (None, None)
        self._turns = _Turns()
        self._out = CapturedStream("stdout", sys.stdout if live else None, out_below, self._turns)
        self._err = CapturedStream("stderr", sys.stderr if live else None, err_below, self._turns)
        self._out.replaced, self._err.replaced = sys.stdout, sys.stderr

    @property
    def stdout(self) -> str:
        return self._out.getvalue()

    @property
    def stderr(self) -> str:
        return self._err.getvalue()

    @property
    def order(self) -> list[tuple[str, int]]:
        """:attr:`stdout` and :attr:`stderr` as ``(stream, characters)`` pieces, as they came.

        What reached a stream's fd while the other stream was written to shows at the start of
        its next piece; what only reached its fd (``os.system``'s output, no ``print``) comes last.
        """
        streams = {"stdout": self._out, "stderr": self._err}
        pieces = {
            name: iter(stream.pieces(self._turns.cuts[name])) for name, stream in streams.items()
        }
        order = [(name, len(next(pieces[name]))) for name in self._turns.names]
        order += [(name, len(rest)) for name in streams for rest in pieces[name]]
        return [(name, count) for name, count in order if count]

    def show(self) -> None:
        if not self.live:
            sys.stdout.write(self.stdout)
            sys.stderr.write(self.stderr)


@contextlib.contextmanager
def capture_text(live: bool = False, below: str | None = None) -> Iterator[Captured]:
    """Capture ``print`` output of a run (the magic layer uses IPython's richer capture).

    With ``live`` the output is also written to this process's streams as it comes (a script's
    progress on the command line), and :meth:`Captured.show` shows nothing more. With ``below`` (a
    target process's folder) the process's fds 1 and 2 point at files there meanwhile, and what the
    run writes to them (``os.system``, a subprocess, C code) is part of its output, where it came:
    the process's own fds are the kernel's or the terminal's, which show the reference run's.
    """
    with contextlib.ExitStack() as stack:
        files = stack.enter_context(fds_to_files(below)) if below is not None else None
        captured = _StringCapture(live, files)
        stack.enter_context(contextlib.redirect_stdout(captured._out))
        stack.enter_context(contextlib.redirect_stderr(captured._err))
        yield captured


def seed_everything(seed: int) -> None:
    """Seed torch (all devices), Python's ``random`` and NumPy's global generator."""
    _manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def _absent_runtimes() -> tuple[Any, ...]:
    """Lazily seeded device modules (``torch.xpu``, ``torch.mtia``) this torch build lacks."""
    absent = []
    for name in ("xpu", "mtia"):
        module = getattr(torch, name, None)
        is_compiled = getattr(module, "_is_compiled", None)
        if callable(is_compiled) and callable(getattr(module, "manual_seed_all", None)):
            try:
                if not is_compiled():
                    absent.append(module)
            except Exception:  # a build that cannot tell: seed it as torch does
                pass
    return tuple(absent)


_ABSENT_RUNTIMES: tuple[Any, ...] | None = None


def _manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``, minus what cannot matter: seeds for runtimes not built in.

    For a device runtime that is not initialised, ``torch.manual_seed`` queues the seed together
    with a formatted stack trace (most of its cost inside a notebook's deep stack); for ``xpu`` and
    ``mtia`` in a build without them the queue never runs. Everything else (the host generator,
    ``torch.cuda`` as the run remaps it, mps, a PrivateUse1 device) is seeded by torch itself.
    """
    global _ABSENT_RUNTIMES
    if _ABSENT_RUNTIMES is None:
        _ABSENT_RUNTIMES = _absent_runtimes()
    saved = [(module, module.__dict__.get("manual_seed_all")) for module in _ABSENT_RUNTIMES]
    try:
        for module, _ in saved:
            module.manual_seed_all = _no_seed
        torch.manual_seed(seed)
    finally:
        for module, original in saved:
            if original is None:
                del module.manual_seed_all
            else:
                module.manual_seed_all = original


def _no_seed(seed: int) -> None:
    """A runtime torch was built without has nothing to seed."""


#: An instrument observes one run: called with the run's backend, it returns a context manager that
#: is entered around the cell (inside the CUDA remapping) and whose ``as`` value is stored, after the
#: context has exited, in ``Run.extras`` under the instrument's name.
Instrument = Callable[[Backend], contextlib.AbstractContextManager[Any]]


class RunSpec:
    """What every run of one cell shares: the program, the namespace, the seed and the settings."""

    def __init__(
        self,
        program: CellProgram,
        namespace: MutableMapping[str, Any],
        *,
        seed: int | None = 0,
        random_state: RandomState | None = None,
        hidden: frozenset[str] = frozenset(),
        resident: ResidentObjects | None = None,
        capture: Callable[..., contextlib.AbstractContextManager[Captured]] = capture_text,
        instruments: dict[str, Instrument] | None = None,
        rng_on_cpu: bool = False,
        steps: int = 1,
        isolate_inputs: bool = True,
        ref_precision: str = "cuda",
        kept_run: str | None = None,
        default_device: torch.device | None = None,
        torch_settings: dict[str, Any] | None = None,
        module_values: dict[str, dict[str, Any]] | None = None,
        inputs: Collection[str] | None = None,
        notebook_temp: frozenset[str] | None = None,
        originals: str | None = None,
        restore_namespace: bool = True,
        live_run: str | None = None,
        classes_run: str | None = None,
        entropy: bytes | None = None,
    ) -> None:
        if steps < 1:
            raise ValueError("steps must be at least 1")
        self.program = program
        self.ref_precision = ref_precision
        self.steps = steps
        self.rng_on_cpu = rng_on_cpu
        self.instruments = dict(instruments or {})
        self.namespace = namespace
        #: Every run is seeded with it; None: every run starts from :attr:`random_state`.
        self.seed = seed
        #: The notebook's random state as it is when the spec is made (before any run of the
        #: cell), unless given: every run starts from it where there is no seed, and a cell that
        #: commits nothing leaves it so, seeded or not.
        self.random_state = random_state if random_state is not None else current_random_state()
        self.hidden = hidden
        self.resident = resident if resident is not None else ResidentObjects()
        self.capture = capture
        self.captured: dict[str, Captured] = {}
        #: The run (``"ref"``) whose output the notebook shows while it runs, as a plain cell's: its
        #: capture is asked for with ``live=True``. Every other run's output is only captured.
        self.live_run = live_run
        #: False when the namespace is already a private copy (a worker's): no deep copies.
        self.isolate_inputs = isolate_inputs
        #: The run whose file writes reach the disk (``"ref"``, ``"target"``); every other run of
        #: the cell keeps its writes apart (:mod:`~neuron_workbench.run.file_writes`). None: a
        #: single run, which writes as any code does.
        self.kept_run = kept_run
        #: The run whose changes to the notebook's classes stay (``C.count += 1``: a class is no
        #: copy, each run in this process changes the notebook's own); every other run's are put
        #: back when it ends. None: :attr:`kept_run`'s. The reference's where the kept target
        #: runs in another process, whose classes never come back.
        self.classes_run = classes_run if classes_run is not None else kept_run
        #: What ``torch.set_default_device`` set in the notebook before the cell (None: unset). A
        #: ``cuda`` default is each run's device for the run (the kernel itself keeps none meanwhile:
        #: see :func:`notebook_default_device_suspended`).
        self.default_device = default_device
        #: This process's torch settings before any run of the cell changed them
        #: (:func:`~neuron_workbench.run.torch_settings.current`): what a target process takes,
        #: whenever its run starts. None: as they are when the request is sent.
        self.torch_settings = torch_settings
        #: The values of the attributes the notebook's cells assigned on its own modules, before
        #: any run of the cell changed them
        #: (:func:`~neuron_workbench.run.module_versions.assigned_values`): what a target process
        #: sets on its copies of the modules. None: as they are when the request is sent.
        self.module_values = module_values
        #: The names the runs take as the cell's inputs, when the caller found them already (a
        #: target process: what the kernel sent, the names sharing state with the cell's among
        #: them). None: :meth:`inputs` finds them.
        self.given_inputs = None if inputs is None else frozenset(inputs)
        #: The ``tmp...`` names in the temporary folder before any run of the cell
        #: (:func:`~neuron_workbench.run.file_writes.tempfile_names`): the notebook's, where a run
        #: keeps its writes apart. None: as they are when such a run starts.
        self.notebook_temp = notebook_temp
        #: The cell's folder where its kept run keeps the original of each file it changes
        #: (:func:`~neuron_workbench.run.file_writes.originals_folder`), which every other run reads
        #: in place of the real one: each finds the files as the cell did. None: the real files.
        self.originals = originals
        #: False: the namespace is left as the run ended, not put back (a target process's, which
        #: it drops after the answer): a thread the cell started goes on reading what the cell bound
        #: there, as in plain Python.
        self.restore_namespace = restore_namespace
        #: The seed of the random identifiers every run of the cell draws (``uuid.uuid4()``, see
        #: :mod:`~neuron_workbench.run.random_ids`): fresh for each cell unless given.
        self.entropy = entropy if entropy is not None else new_entropy()
        self._inputs: tuple[frozenset[str], frozenset[str]] | None = None

    def inputs(self) -> tuple[frozenset[str], frozenset[str]]:
        """The names the cell reads, and those with every name sharing state with them.

        Found once for all the runs of the cell: each starts from the namespace as it was before
        the cell (every run restores it, and none is committed before all of them ended).
        """
        if self._inputs is None:
            if self.given_inputs is not None:
                # what the kernel found and sent: its walk of the cell's reads is not done again
                # (on a model of thousands of modules, the walk for hooks alone takes milliseconds)
                self._inputs = self.given_inputs, self.given_inputs
            else:
                read = frozenset(referenced_names(self.program, self.namespace))
                shared = frozenset(with_names_sharing_state(read, self.namespace, self.hidden))
                self._inputs = read, shared
        return self._inputs

    def keeps_writes_apart(self, run_id: str | None) -> bool:
        """Whether the run ``run_id`` of this cell must keep the files it writes apart."""
        return self.kept_run is not None and run_id != self.kept_run

    def keeps_classes_apart(self, run_id: str | None) -> bool:
        """Whether the changes run ``run_id`` makes to the notebook's classes are put back."""
        return self.classes_run is not None and run_id != self.classes_run


#: IPython's input history, which a target process is sent only where the cell names it.
_INPUT_HISTORY = re.compile(INPUT_HISTORY)


def _is_output_name(name: str, hidden: frozenset[str]) -> bool:
    # (`__` names are Python's and torch.compile's: `__name__`, `__builtins_dict___0`)
    return not (name in hidden or name.startswith("__") or _INPUT_HISTORY.fullmatch(name))


@contextlib.contextmanager
def what_if_policy(backend: Backend, what_if: str | None) -> Iterator[None]:
    """Switch an emulated target's what-if numerics policy (``bf16-matmul``) on for one run."""
    if what_if is None:
        yield
        return
    from neuron_workbench.errors import OptionError

    if not backend.availability().emulated:
        raise OptionError(
            "{0} {value} needs an emulated target; {name} is real",
            "what_if",
            value=what_if,
            name=backend.name,
        )
    from neuron_workbench import emulator

    with backend.activated():
        status = emulator.status()
        before = bool(status.numerics.get("bf16_matmul")) if status else False
        emulator.configure(bf16_matmul=True)
        try:
            yield
        finally:
            emulator.configure(bf16_matmul=before)


class Executor(Protocol):
    """Where a run happens: in this process, or in a worker process that owns the device."""

    name: str

    def availability(self, backend: Backend) -> Any:
        """Whether ``backend`` can run on this executor (an ``Availability``)."""

    def run(
        self, spec: RunSpec, backend: Backend, *, run_id: str, what_if: str | None = None
    ) -> Run:
        """Execute ``spec`` once on ``backend``."""


class InProcessExecutor:
    """Runs in this process (the kernel): today's behaviour, and the only one for cpu/cuda."""

    name = "inprocess"

    def availability(self, backend: Backend) -> Any:
        """Whether ``backend`` can run in this process."""
        return backend.availability()

    def run(
        self, spec: RunSpec, backend: Backend, *, run_id: str, what_if: str | None = None
    ) -> Run:
        """Execute ``spec`` on ``backend`` here."""
        with what_if_policy(backend, what_if):
            return execute(spec, backend, run_id=run_id)


def execute(spec: RunSpec, backend: Backend, *, run_id: str | None = None) -> Run:
    """Run ``spec.program`` once on ``backend`` and return its :class:`Run`.

    The namespace is unchanged afterwards (unless ``spec.restore_namespace`` is False).
    ``KeyboardInterrupt`` restores it and propagates.
    """
    with backend.activated():  # the device must exist (emulator installed) before copies move to it
        return _execute_in_session(spec, backend, run_id)


def _run_named(run_id: str | None) -> str:
    """How a message names the run ``run_id``: ``the reference run``, ``the oracle's rerun``."""
    if run_id == "ref":
        return "the reference run"
    if run_id == "oracle":
        return "the float64 oracle's rerun of the cell"
    if run_id is not None and run_id.startswith("eager:"):
        return "the --compile-check rerun without torch.compile"
    return "the target run"


def _execute_in_session(spec: RunSpec, backend: Backend, run_id: str | None) -> Run:
    ns = spec.namespace
    saved = dict(ns)
    # a run that is not kept: its file writes and the notebook's open files and bars are kept
    # apart from the notebook's (and its changes to the notebook's classes, see classes_run)
    apart = spec.keeps_writes_apart(run_id)
    default_device = _default_device_setting()
    run_default = _run_default_device(spec.default_device, backend)
    if run_default != default_device:
        torch.set_default_device(run_default)
    info: BackendInfo = backend.info()
    run: Run
    captured: Captured | None = None
    recording = None
    writes = None
    facts: RunFacts | None = None
    shared: list[str] = []
    observed: dict[str, Any] = {}
    default_devices_set: list[Any] = []
    try:
        read, inputs = spec.inputs()
        if spec.isolate_inputs:
            copies, shared = isolate(ns, inputs, files_apart=apart)
            # a name that only shares state with the cell's and cannot be copied (a DataLoader
            # iterator over a dataset the cell reads) stays as it is, as had it shared nothing
            shared = [name for name in shared if name in read]
        else:
            copies = {n: ns[n] for n in sorted(inputs) if n in ns and needs_copy(ns[n])}
        storages: StorageMoves = {}  # views of one storage stay views of one

        # what the cell had put on the device first: a name viewing its memory then moves with it
        # (`sd = model.state_dict()` in a plain cell), as it is on the device on a GPU; optimizers
        # after the models, their state following the parameters moved
        def move_order(name: str) -> tuple[bool, bool]:
            value = copies[name]
            return saved[name] not in spec.resident, isinstance(value, torch.optim.Optimizer)

        for name in sorted(copies, key=move_order):
            copies[name] = move_to_device(
                copies[name], backend.device, force=saved[name] in spec.resident, memo=storages
            )
        storages.clear()  # the host storages it held (what moved) go now, not after the cell
        # A device object an earlier cell built as "cuda" (kept as the reference's cpu device)
        # means this run's device.
        cuda_devices = {
            name: ns[name]
            for name in inputs
            if type(ns.get(name)) is torch.device and ns[name] in spec.resident
        }
        if backend.device_type != "cpu":
            copies.update({name: backend.device for name in cuda_devices})
        ns.update(copies)
        before_run = dict(ns)
        unversioned = UnversionedWrites()  # writes the tensors' version counters miss
        unversioned.watch(tensor for value in copies.values() for tensor in tensors_in(value))
        versions = {name: version_signature(value) for name, value in copies.items()}
        host = None
        if backend.device_type == "cpu":
            # The host stands in for cuda: tensors earlier cells put on "cuda" count as being there.
            resident = [
                tensor
                for name, value in copies.items()
                if saved[name] in spec.resident
                for tensor in tensors_in(value)
            ]
            host = CudaOnHost(
                resident,
                precision=spec.ref_precision,
                account_memory=reads_memory_statistics(spec.program, ns),
            )
            # ... and so does one a container or an object holds (cfg["device"], trainer.device)
            for device in (*cuda_devices.values(), *spec.resident.devices()):
                host.remember_cuda_device(device)
        if "compile" in spec.program.source and "torch._dynamo" not in sys.modules:
            # Dynamo maps torch's functions by identity when first imported: importing it inside
            # the remapped run would map the run's wrappers and leave torch.rand* unknown to it.
            importlib.import_module("torch._dynamo")
        with contextlib.ExitStack() as stack:
            writes = (
                stack.enter_context(writes_kept_apart(ns, spec.notebook_temp, spec.originals))
                if apart
                else None
            )
            if spec.originals is not None and run_id == spec.kept_run:
                # what it changes of the notebook's files, the other runs read as it was
                stack.enter_context(originals_kept(spec.originals, ns, spec.notebook_temp))
            if spec.keeps_classes_apart(run_id):
                stack.enter_context(class_attributes_kept(ns))
            temp_names = stack.enter_context(tempfile_names_drawn())
            recording = stack.enter_context(backend.fallback_recording())
            stack.enter_context(unversioned.recording())
            stack.enter_context(scales_made_again())
            default_devices_set = stack.enter_context(_default_devices_set())
            outside = (sys.stdout, sys.stderr)
            live = run_id is not None and run_id == spec.live_run
            captured = stack.enter_context(spec.capture(live=True) if live else spec.capture())
            # the notebook's handlers on print's streams log into the run's output, as it prints
            logging_setup.streams_captured(outside, (sys.stdout, sys.stderr))
            # ... and they, and a handler the cell makes there (logging.basicConfig), write to
            # this process's own once the run ends: the capture's would swallow every later message
            stack.callback(logging_setup.streams_restored, (sys.stdout, sys.stderr), outside)
            facts = stack.enter_context(
                cuda_remapped_to(
                    backend,
                    rng_on_cpu=spec.rng_on_cpu,
                    host=host,
                    may_enable_tf32=host is not None and may_enable_tf32(spec.program.source),
                    writes=unversioned,
                )
            )
            stack.enter_context(timers_named_in(ns))  # `from timeit import default_timer`
            stack.enter_context(entropy_drawn_from(spec.entropy, ns))  # uuid.uuid4(), torch.seed()
            stack.enter_context(cuda_names_in(ns))  # `from torch.cuda import synchronize`
            if host is not None:
                stack.enter_context(inductor_on_the_host())
            observed = {
                name: stack.enter_context(instrument(backend))
                for name, instrument in spec.instruments.items()
            }
            if spec.seed is None:
                restore_random_state(spec.random_state)
            else:
                seed_everything(spec.seed)
            backend.reset_peak_memory()
            start = time.perf_counter()
            step_scalars: list[dict[str, float]] = []
            for step in range(spec.steps):
                if step:
                    for recorder in observed.values():
                        getattr(recorder, "next_step", lambda: None)()
                last_value = None
                try:
                    exec(spec.program.body, ns)
                    if spec.program.last_expr is not None:
                        last_value = eval(spec.program.last_expr, ns)
                except StopRun:  # max_steps reached: the run ends here, as if the program ended
                    break
                except SystemExit as exc:
                    if exc.code not in (0, None):
                        raise  # the program's own failure (argparse's usage error): its error
                    # `sys.exit(main())` at a script's end: this repetition's normal end, as a
                    # script that just ends (--steps runs it again; it ended all of them)
                if spec.steps > 1:
                    step_scalars.append(_step_scalars(ns, before_run, last_value, spec.hidden))
            backend.synchronize()
            wall = time.perf_counter() - start
            memory = backend.memory_stats()
        run = _collect(spec, ns, before_run, versions, copies, info, last_value, unversioned)
        if default_devices_set:  # torch.set_default_device in the cell: the last one holds
            run.sets_default_device = True
            run.default_device = _as_the_cell_means(default_devices_set[-1], backend, host)
        run.fallbacks = recording.events
        # every run ends as plain data, here as in a worker: readers never meet a live recorder
        run.extras = {name: recorded(value) for name, value in observed.items()}
        run.steps = step_scalars
        run.facts = facts
        facts.rule_ops = dict(recording.rule_ops)
        facts.temp_names = temp_names
        # what it did to the notebook's open files and bars, given to it as stand-ins: kept apart
        # in a run that is not kept, done to them by the kernel when it is (a worker's target)
        to_handles = drain_made()
        run.notebook_handle_uses = to_handles.uses
        written = [*(writes.written if writes is not None else []), *to_handles.paths]
        if written and apart:
            facts.notes.append(kept_apart_note(list(dict.fromkeys(written)), spec.kept_run))
        run.memory = memory
        run.wall_time_s = wall
        run.rng_state = current_random_state()
    except KeyboardInterrupt as interrupt:
        note_interrupted(interrupt, f"during {_run_named(run_id)} ({info.label})")
        raise
    except (Exception, SystemExit) as exc:  # the cell's own error: reported, never raised
        run = Run(backend=info, error=RunError.from_exception(exc, spec.program.filename))
        if recording is not None:
            run.fallbacks = recording.events
        if facts is not None:  # what the run did before the error (autocast entered, draws)
            run.facts = facts
            facts.rule_ops = dict(recording.rule_ops)
        # Records that stay true of a run that raised: what compiled before the error (a failed
        # compile among it), a script's command line (its report names the script's lines) and
        # the scalars it logged before it (a script's progress: it did its work, which its exit
        # code alone does not say when it logged to stderr).
        run.extras = {
            name: recorded(observed[name])
            for name in ("compile", "script", "scalars")
            if name in observed
        }
    finally:
        drain_made()  # a run that raised is never kept: what it wrote to stand-ins goes
        if _default_device_setting() != default_device:
            torch.set_default_device(default_device)
        if spec.restore_namespace:
            for name in [n for n in ns if n not in saved and not compiled_global(n)]:
                del ns[name]
            ns.update(saved)
    run.shared_names = shared
    if captured is not None:
        run.stdout, run.stderr = captured.stdout, captured.stderr
        # (IPython's capture, the magic's, shows its run's output itself: it keeps no order)
        run.printed_order = getattr(captured, "order", [])
        spec.captured[run_id or backend.name] = captured
    return run


def _run_default_device(notebook: torch.device | None, backend: Backend) -> torch.device | None:
    """The default device a run works with, given the notebook's: its ``cuda`` is the run's device.

    On the host standing in for cuda the default is left unset (its factories make CPU tensors).
    """
    if notebook is None or notebook.type != "cuda":
        return notebook
    return None if backend.device_type == "cpu" else torch.device(backend.device)


@contextlib.contextmanager
def _default_devices_set() -> Iterator[list[Any]]:
    """Note what the run passes to ``torch.set_default_device``, in order, as the cell passed it.

    The run's own setting ends with the run; the notebook gets the last one when the run is kept
    (a state left behind cannot tell "unset" from the host's unset standing for cuda).
    """
    calls: list[Any] = []
    original = torch.set_default_device

    def set_default_device(device: Any) -> None:
        original(device)
        calls.append(device)  # once torch took it (it refuses a device that does not exist)

    with patched_attributes(torch, {"set_default_device": set_default_device}):
        yield calls


def _as_the_cell_means(device: Any, backend: Backend, host: CudaOnHost | None) -> str | None:
    """A device the cell set as the default, as the notebook would hold it: the run's own is cuda.

    ``"cuda"`` as the cell wrote it stays; a device object the run made from it (the run's device,
    or on the host one it remembers as cuda) is cuda again.
    """
    if device is None:
        return None
    if type(device) is int:  # an accelerator index: the cell's is cuda
        return f"cuda:{device}"
    if type(device) is torch.device:
        if host is not None and host.names_cuda(device):
            return "cuda"
        if backend.device_type != "cpu" and device.type == backend.device_type:
            return "cuda" if device.index is None else f"cuda:{device.index}"
    return str(device)


@contextlib.contextmanager
def notebook_default_device_suspended() -> Iterator[torch.device | None]:
    """Unset the notebook's default device while a cell is handled; yield what it was.

    ``torch.set_default_device("cuda")`` in a notebook cell (a model card's first lines) succeeds
    in a kernel without CUDA, and then every tensor made without a device (rebuilding a target's
    answer, comparing) would be made on cuda. Each run works with its own device instead
    (:attr:`RunSpec.default_device`); the notebook's setting is back afterwards.
    """
    notebook = _default_device_setting()
    if notebook is None:
        yield None
        return
    torch.set_default_device(None)
    try:
        yield notebook
    finally:
        torch.set_default_device(notebook)


def _default_device_setting() -> torch.device | None:
    """What ``torch.set_default_device`` last set (None when unset).

    Not ``torch.get_default_device()``: restoring "cpu" through ``set_default_device`` would install
    a global device mode that sends every later torch call through Python.
    """
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return None if context is None else context.device


def _rebound(
    ns: MutableMapping[str, Any],
    before_run: dict[str, Any],
    hidden: frozenset[str],
    stored: frozenset[str] = frozenset(),
) -> list[str]:
    """User-visible names the cell bound or rebound (identity changed since the run began).

    A ``stored`` name (one the cell's top level binds) bound again to a value Python shares
    (``step = 0``, ``mode = "train"``, ``None``: small ints, interned strings, singletons) keeps its
    identity, yet the cell bound it: it counts too, so a cell's outputs do not depend on what the
    notebook held before it.
    """
    missing = object()
    return [
        name
        for name, value in ns.items()
        if (
            before_run.get(name, missing) is not value
            or (name in stored and type(value) in _SHARED_VALUE_TYPES)
        )
        and _is_output_name(name, hidden)
    ]


#: Types whose equal values Python may share between bindings (small ints, interned strings).
_SHARED_VALUE_TYPES = frozenset({bool, int, float, complex, str, bytes, type(None)})


def _step_scalars(
    ns: MutableMapping[str, Any],
    before_run: dict[str, Any],
    last_value: Any,
    hidden: frozenset[str],
) -> dict[str, float]:
    """The scalar values (a loss, an accuracy) the cell bound, after one repetition.

    A model's output holding its loss (a transformers ``ModelOutput``, a dict of ``"loss"``) gives
    its scalar tensors too, by the paths the comparison names them (``out.loss``,
    ``out['loss']``): ``outputs = model(**batch, labels=y); outputs.loss.backward()`` binds no
    loss of its own, and its loss curve was missing.
    """
    values = {name: ns[name] for name in _rebound(ns, before_run, hidden)}
    values[LAST_EXPRESSION] = last_value
    scalars = {}
    for name, value in values.items():
        if _is_scalar_tensor(value):
            scalars[name] = float(value.detach().cpu())
        elif isinstance(value, float | int) and not isinstance(value, bool):
            scalars[name] = float(value)
        else:
            for path, item in _held_scalar_tensors(name, value):
                scalars[path] = float(item.detach().cpu())
    return scalars


def _is_scalar_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()


def _held_scalar_tensors(name: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """One-element float tensors one level inside a dataclass or a mapping of string keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # a ModelOutput is both: its fields are what the comparison names (out.loss)
        items = (
            (f"{name}.{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value)
        )
    elif isinstance(value, Mapping):
        items = ((f"{name}[{key!r}]", item) for key, item in value.items() if isinstance(key, str))
    else:
        return
    for path, item in items:
        if _is_scalar_tensor(item):
            yield path, item


def _collect(
    spec: RunSpec,
    ns: MutableMapping[str, Any],
    before_run: dict[str, Any],
    versions: dict[str, Any],
    copies: dict[str, Any],
    info: BackendInfo,
    last_value: Any,
    unversioned: UnversionedWrites,
) -> Run:
    missing = object()
    hidden = spec.hidden
    rebound = _rebound(ns, before_run, hidden, spec.program.stored_names)
    mutated = [
        name
        for name, value in copies.items()
        if name not in rebound
        and ns.get(name, missing) is value
        and version_signature(value, unversioned) != versions[name]
    ]
    outputs = {name: ns[name] for name in (*rebound, *mutated)}
    # A last expression of None (print(...), trainer.fit(x)) is no output, as IPython keeps no Out
    if (
        spec.program.last_expr is not None
        and spec.program.last_expr_name not in outputs
        and last_value is not None
    ):
        outputs[LAST_EXPRESSION] = last_value
    bindings = {name: ns[name] for name in rebound}
    # Every copied input is committed too: the run may have changed it in place, and rebinding all
    # copies together keeps objects that reference each other (a model and its optimizer) consistent.
    # Not IPython's own names (`_`, `Out`, `_7`): it records outputs into the objects it holds
    # itself, and a copy in their place stopped `_` from moving on (IPython took it for the user's)
    # and left later outputs out of the notebook's `Out`.
    for name, value in copies.items():
        if ns.get(name, missing) is value and name not in hidden:
            bindings.setdefault(name, value)
    deleted = [name for name in before_run if name not in ns and _is_output_name(name, hidden)]
    return Run(
        backend=info,
        outputs=outputs,
        last_value=last_value,
        bindings=bindings,
        deleted=deleted,
    )


def commit(namespace: MutableMapping[str, Any], run: Run) -> None:
    """Apply a successful run's bindings and deletions to the namespace.

    The numbers and strings the run made from tensors are committed plain (their provenance served
    the comparison): what the cell bound or changed holds a ``float`` where plain code does.
    """
    changed = run.outputs.keys()
    write_back(run.notebook_handle_uses)
    namespace.update(
        {
            name: _reading(namespace, untagged(value) if name in changed else value)
            for name, value in run.bindings.items()
        }
    )
    for name in run.deleted:
        namespace.pop(name, None)
    if run.rng_state is not None:
        restore_random_state(run.rng_state)


def _reading(namespace: MutableMapping[str, Any], value: Any) -> Any:
    """``value``, or a notebook function sent back from a target process made to read ``namespace``.

    The transport rebuilds a function of the notebook with globals of its own: committed as it
    came (``--keep target``), it would go on reading the values its globals had in the worker, and
    no name the notebook defines later.
    """
    if (
        type(value) is not types.FunctionType
        or not isinstance(namespace, dict)
        or value.__globals__ is namespace
        or not notebook_function(value, namespace.get("__name__", "__main__"))
    ):
        return value
    return function_like(value, namespace, value.__closure__)


def devices_as_the_notebook_names_them(
    kept: Run, other: Run, namespace: Mapping[str, Any], resident: ResidentObjects
) -> None:
    """Make the device objects a kept target run bound, that this process lacks, its cuda device.

    With ``--keep target`` the target's ``torch.device("neuron", 0)`` came back to a kernel without
    that device as ``privateuseone``: plain cells, and the next cell's runs, failed on it. A name
    bound to one gets what the other run holds for the cell's ``cuda``: that run's own device
    object, else the notebook's own one the cell only read. One held in a container or an object
    (``cfg["device"]``, ``trainer.device``), or with none of those, gets this process's cuda (on a
    host without a GPU, the cpu device standing in for it); those bound to a name are remembered as
    the device. A kernel that holds the target's device itself (``--executor inprocess``) keeps it.
    """

    def stand_in(device: torch.device) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", device.index)
        made = torch.device("cpu")
        resident.add(made)
        return made

    for name, value in list(kept.bindings.items()):
        if type(value) is torch.device:
            if not unusable_device(value):
                continue
            candidates = (other.bindings.get(name), namespace.get(name))
            device = next((c for c in candidates if type(c) is torch.device), None)
            kept.bindings[name] = device = device if device is not None else stand_in(value)
            if device.type == "cpu":
                resident.add(device)
        else:
            kept.bindings[name] = devices_replaced(value, stand_in)


def mark_resident(resident: ResidentObjects, kept: Run, other: Run) -> None:
    """Remember which kept objects the cell placed on its device, judged by the other run.

    When one run is on the CPU, its tensors cannot show which of them the cell meant for "cuda";
    the accelerator run's placement of the same name can.
    """
    for name, value in kept.bindings.items():
        counterpart = other.bindings.get(name)
        on_device = any(on_accelerator(t) for t in tensors_in(counterpart)) or any(
            on_accelerator(t) for t in tensors_in(value)
        )
        # a device object the cell built as "cuda" (the CPU run holds it as a cpu device)
        on_device = on_device or (
            type(counterpart) is torch.device and counterpart.type not in ("cpu", "meta")
        )
        if on_device and not mark_mixed_items(value, counterpart):
            resident.add(value)
            mark_attribute_tensors(value, counterpart)
        for device in devices_on_the_device(value, counterpart):
            resident.add(device)
    resident.prune()
