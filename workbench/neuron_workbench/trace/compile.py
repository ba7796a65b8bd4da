"""What ``torch.compile`` did during one run: graphs, graph breaks, recompiles, compile time.

A run instrument (``RunSpec.instruments``) that reads Dynamo's own records: its per-frame
compilation metrics (one per compiled frame: function, graph size, compile time, recompile
reason), its ``graph_breaks`` log (reason and user line), and the emulated backends' graph list
(``emulator/compile.py``: ops that could not be compiled). Each graph's compiled callable, as any
backend returns it to Dynamo (Inductor on the reference, the emulated ``neuron``/``tpu``), is
wrapped once to count its calls and their host seconds, to read where the graph's user code
is, and which random functions it calls. Nothing is imported from Dynamo unless the run
compiled; a run that did not compile records nothing. The record is plain data, so it travels back
from a worker as it is.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CompileRecord", "compile_instrument", "graph_break_violation", "graph_site"]

_GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
#: Random functions as Dynamo's graph code spells their calls.
_RANDOM_CALL = re.compile(
    r"\b(torch(?:\.nn\.functional)?\.(?:dropout\w*|alpha_dropout|feature_alpha_dropout|rand|randn|"
    r"randint|randperm|rand_like|randn_like|randint_like|bernoulli|normal|multinomial|poisson))\("
)
_AT = re.compile(r"in user code at (?P<file>.+):(?P<line>\d+)\s*$")
#: The run's tagged numbers and strings (``loss.item()`` during a run) as a reason names their type
#: (``print`` with argument types ['str', 'TaggedFloat']): the cell's plain types.
_TAGGED_TYPE_NAMES = re.compile(r"'Tagged(Float|Int|Str)'")
_WORKBENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _in_the_workbench(path: str) -> bool:
    return os.path.abspath(path).startswith(_WORKBENCH_DIR + os.sep)


_SIZE = re.compile(
    r"tensor '(?P<name>[^']+)' (?P<what>size|stride) mismatch at index (?P<index>\d+)\. "
    r"expected (?P<old>\S+), actual (?P<new>\S+)"
)


@dataclass
class CompileRecord:
    """What ``torch.compile`` did in one run (empty when the run compiled nothing).

    Attributes
    ----------
    graphs : list of dict
        One per graph Dynamo compiled: ``backend``, ``function`` (the user's function the graph
        is in: a compiled module's ``forward``), ``file``, ``line`` (the line of that function
        where the graph's first op is), ``ops``, ``compile_s`` (host seconds), ``calls`` and
        ``run_s`` (how often the compiled graph ran in this run and its host seconds: its forward;
        a training graph's backward runs inside autograd's backward and is not in them; host CPU
        time on an emulated device), ``recompile`` (the reason, when it compiled a frame again)
        and ``fallback_ops`` (ops the emulated device's compiler could not take).
    graph_breaks : list of dict
        ``reason`` (one line), ``file`` and ``line`` of each distinct graph break.
    recompiles : list of dict
        ``function`` and ``reason`` (``new shape for x: (4, 64) → (4, 65)``).
    warnings : list of str
        What the (emulated) ``torch.compile`` warned, e.g. an ignored ``mode``.
    errors : list of str
        Compiles that failed (one line each).
    random_ops : dict of str to int
        Random functions called inside compiled graphs the run ran (the compiler draws their
        numbers), by how many graph calls called them; a graph compiled by an earlier run counts
        too.
    compile_s : float
        Host seconds spent compiling (emulated devices: host CPU time).
    run_s : float
        Host seconds the run's compiled graphs ran (the sum of the graphs' ``run_s``).
    """

    graphs: list[dict[str, Any]] = field(default_factory=list)
    graph_breaks: list[dict[str, Any]] = field(default_factory=list)
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    compile_s: float = 0.0
    random_ops: dict[str, int] = field(default_factory=dict)
    run_s: float = 0.0

    @property
    def compiled(self) -> bool:
        """Whether the run compiled anything."""
        return bool(self.graphs or self.graph_breaks or self.errors)

    def backends(self) -> list[str]:
        """The backends that compiled graphs, in order of first use."""
        return list(dict.fromkeys(str(g.get("backend")) for g in self.graphs))

    def fallback_ops(self) -> list[str]:
        """Ops in compiled graphs that the device's compiler could not take (sorted, unique)."""
        return sorted({op for g in self.graphs for op in g.get("fallback_ops", ())})

    def summary(self) -> str:
        """``inductor: 2 graphs, 1 graph break, 1 recompile`` (counts only, deterministic)."""
        if not self.compiled:
            return "nothing compiled"

        def n(count: int, word: str) -> str:
            return f"{count} {word}{'' if count == 1 else 's'}"

        parts = [
            n(len(self.graphs), "graph"),
            n(len(self.graph_breaks), "graph break"),
            n(len(self.recompiles), "recompile"),
        ]
        if self.fallback_ops():
            parts.append(n(len(self.fallback_ops()), "op") + " not compiled")
        return f"{'/'.join(self.backends()) or 'torch.compile'}: {', '.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "graphs": [dict(g) for g in self.graphs],
            "graph_breaks": [dict(b) for b in self.graph_breaks],
            "recompiles": [dict(r) for r in self.recompiles],
            "warnings": list(self.warnings),
            "errors": list(self.errors),
            "compile_s": self.compile_s,
            "run_s": self.run_s,
            "random_ops": dict(self.random_ops),
            "summary": self.summary(),
        }


class _GraphBreaks(logging.Handler):
    """Collects Dynamo's ``graph_breaks`` log records (one per graph break it meets)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot be formatted is not a graph break we can show
            return
        lines = text.splitlines()
        match = _AT.search(lines[0]) if lines else None
        if match is None:
            return
        reason = ""
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith("Explanation:"):
                reason = stripped.removeprefix("Explanation:").strip()
                break
            if not reason and stripped and not stripped.startswith("Graph Break Reason"):
                reason = stripped
        if not reason and len(lines) > 1:
            reason = lines[1].removeprefix("Graph Break Reason:").strip()
        reason = _TAGGED_TYPE_NAMES.sub(lambda m: f"'{m[1].lower()}'", reason)
        file, line = match["file"], int(match["line"])
        if _in_the_workbench(file):
            # a break inside the run's own wrappers (the scalar record of `loss.item()`) is the
            # user's call that reached them: the innermost frame of the traceback outside them
            frames = list(_STACK_FRAME.finditer(text.partition("User code traceback:")[2]))
            for frame in reversed(frames):
                if not _in_the_workbench(frame["file"]):
                    file, line = frame["file"], int(frame["line"])
                    break
        entry = {"reason": reason, "file": file, "line": line}
        if entry not in self.found:
            self.found.append(entry)


def _random_calls(code: str) -> list[str]:
    """The random functions a graph's code calls that draw (see :func:`_draws`), each once."""
    names = set()
    for line in code.splitlines():
        text = line.strip()
        if text.startswith("#"):
            continue  # the user source a graph's code may quote, not what the graph calls
        names.update(m[1] for m in _RANDOM_CALL.finditer(text) if _draws(text, m))
    return sorted(names)


def _draws(code: str, match: re.Match[str]) -> bool:
    """Whether a random call in graph code draws: a dropout with ``p`` 0 or not training does not.

    Graph code spells the arguments as literals: ``dropout(x, 0.0, True, False)`` or
    ``dropout(x, p = 0.0, training = True)``.
    """
    if "dropout" not in match[1]:
        return True
    args = code[match.end() :].split(")", 1)[0]
    positional, keywords = [], {}
    for part in (a.strip() for a in args.split(",")):
        key, eq, value = part.partition("=")
        if eq:
            keywords[key.strip()] = value.strip()
        else:
            positional.append(part)
    p = keywords.get("p", positional[1] if len(positional) > 1 else None)
    training = keywords.get("training", keywords.get("train"))
    if training is None and len(positional) > 2:
        training = positional[2]
    try:
        no_p = p is not None and float(p) == 0.0
    except ValueError:  # p is a graph value, not a literal
        no_p = False
    return not (no_p or training == "False")


def _shapes(metric: Any) -> dict[str, Any]:
    try:
        shapes = ast.literal_eval(metric.graph_node_shapes or "{}")
    except (ValueError, SyntaxError):
        return {}
    return shapes if isinstance(shapes, dict) else {}


def _shape_text(shape: Any) -> str:
    items = list(shape) if isinstance(shape, list | tuple) else [shape]
    return "(" + ", ".join(str(s) for s in items) + ("," if len(items) == 1 else "") + ")"


def _recompile_reason(reason: str, previous: Any, current: Any) -> str:
    """``new shape for x: (4, 64) → (4, 65)`` from Dynamo's guard-failure text, when it is one."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    first = re.sub(r"^\d+/\d+:\s*", "", first)
    first = first.split("  #")[0].strip()  # Dynamo's guard text ends with its source as a comment
    match = _SIZE.search(first)
    if match is None:
        return first
    name, index = match["name"], int(match["index"])
    key = "l_" + re.sub(r"\W+", "_", name).strip("_").lower() + "_"
    old = _shapes(previous).get(key) if previous is not None else None
    new = _shapes(current).get(key)
    if match["what"] == "size" and isinstance(old, list) and isinstance(new, list):
        return f"new shape for {name}: {_shape_text(old)} → {_shape_text(new)}"
    return f"new {match['what']} for {name} at dim {index}: {match['old']} → {match['new']}"


#: Every graph compiled in this process since the first recorded run: its Dynamo compile id, where
#: its user code is, and how often its compiled callable ran (calls, host seconds).
_GRAPH_RUNS: list[dict[str, Any]] = []
_GRAPH_RUNS_LOCK = threading.Lock()
_timing_installed = False
#: The record of the run each thread is in, which the random functions its graphs call count into.
_DRAWING: dict[int, CompileRecord] = {}

_STACK_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n(?P<code>[^\n]*)'
)
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_\d+$")


def _own_frame(file: str) -> bool:
    """Torch's and the workbench's own files: never the user's code."""
    torch = sys.modules.get("torch")
    dirs = [_WORKBENCH_DIR]
    if torch is not None:
        dirs.append(os.path.dirname(os.path.abspath(torch.__file__)))
    # with the separator: torchvision's or torchaudio's files are not torch's
    return file.startswith(tuple(d + os.sep for d in dirs))


def _user_function(name: str) -> str:
    """The user's function a Dynamo frame is in (a resume function after a break is its own)."""
    match = _RESUME.match(name)
    return match["name"] if match else name


def graph_site(gm: Any) -> tuple[str, str, int] | None:
    """``(function, file, line)`` of a Dynamo graph's user code, or None when it has none.

    The function is the outermost user frame of the graph's first op (a compiled module's
    ``forward``, in the cell or a file; a decorator's frame that only passes ``*args`` on is not
    it), and the line is that function's line where the graph's first op is. The first op's line,
    not the ``def`` line: a graph break splits one function into graphs, and each then names the
    line where its own code starts (the same line on every backend, read from the graph itself).
    """
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        stack = node.meta.get("stack_trace")
        if not stack:
            continue
        frames = [m for m in _STACK_FRAME.finditer(stack) if not _own_frame(m["file"])]
        while len(frames) > 1 and "*args" in frames[0]["code"]:
            frames.pop(0)
        if frames:
            first = frames[0]
            return _user_function(first["function"]), first["file"], int(first["line"])
    return None


def _module_site(output_graph: Any) -> tuple[str, str, int] | None:
    """Where a compiled module's ``forward`` is when no frame of its graph is user code.

    A torch module (``nn.Sequential``) compiled whole: Dynamo's root frame is its wrapper around
    the module (``fn``), and the graph's ops are all in torch's files.
    """
    torch = sys.modules.get("torch")
    module = getattr(getattr(output_graph, "root_tx", None), "f_locals", {}).get("fn")
    if torch is None or not isinstance(module, torch.nn.Module):
        return None
    forward = type(module).forward
    try:
        file = inspect.getsourcefile(forward)
        _, first = inspect.getsourcelines(forward)
    except (OSError, TypeError):
        return None
    return (forward.__qualname__, file, first) if file else None


def _timed(compiled: Any, entry: dict[str, Any]) -> Any:
    """``compiled``, counting its calls and their host seconds into ``entry``."""
    lazy_module = sys.modules.get("torch.fx._lazy_graph_module")
    lazy_type = getattr(lazy_module, "_LazyGraphModule", None)
    if lazy_type is not None:
        owner = compiled if isinstance(compiled, lazy_type) else getattr(compiled, "__self__", None)
        if isinstance(owner, lazy_type):
            # What Dynamo does with a lazy graph module before it wraps the callable itself.
            lazy_type.force_recompile(owner)
            if compiled is not owner:
                compiled = owner.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return compiled(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            with _GRAPH_RUNS_LOCK:
                entry["calls"] += 1
                entry["run_s"] += elapsed
            # The run this call is part of drew the graph's random numbers, whichever run compiled
            # it: a graph compiled in an earlier cell runs from Dynamo's cache.
            record = _DRAWING.get(threading.get_ident()) if entry["draws"] else None
            if record is not None:
                for name in entry["draws"]:
                    record.random_ops[name] = record.random_ops.get(name, 0) + 1

    return run


def _install_graph_timing() -> None:
    """Wrap the callable every Dynamo backend returns (once per process, when Dynamo is there).

    At Dynamo's call of the backend, so that Inductor, ``aot_eager`` and the emulated backends
    are timed alike.
    """
    global _timing_installed
    output_graph = sys.modules.get("torch._dynamo.output_graph")
    cls = getattr(output_graph, "OutputGraph", None)
    original = getattr(cls, "call_user_compiler", None)
    if _timing_installed or original is None:
        return

    def call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
        compiled = original(self, gm, example_inputs)
        try:
            where = graph_site(gm) or _module_site(self)
        except Exception:  # a graph whose stack cannot be read: Dynamo's frame names it
            where = None
        compile_id = getattr(self, "dynamo_compile_id", None)
        try:
            draws = _random_calls(gm.code)
        except Exception:  # a graph whose code cannot be printed: nothing to read
            draws = []
        entry = {
            "compile_id": str(compile_id or ""),
            "where": where,
            "calls": 0,
            "run_s": 0.0,
            "draws": draws,
        }
        with _GRAPH_RUNS_LOCK:
            _GRAPH_RUNS.append(entry)
        return _timed(compiled, entry)

    cls.call_user_compiler = call_user_compiler
    _timing_installed = True


def _frame(metric: Any) -> str:
    return str(metric.compile_id or "").split("/")[0]


def _finish(record: CompileRecord, before: set[int], graphs_before: int, runs_before: int) -> None:
    with _GRAPH_RUNS_LOCK:
        timed: dict[str, dict[str, Any]] = {}
        for entry in _GRAPH_RUNS[runs_before:]:
            timed.setdefault(entry["compile_id"], dict(entry))
    utils = sys.modules.get("torch._dynamo.utils")
    emulated = sys.modules.get("neuron_workbench.emulator.compile")
    device_graphs = list(emulated.GRAPHS[graphs_before:]) if emulated is not None else []
    if utils is None:
        return
    metrics = [m for m in list(getattr(utils, "_compilation_metrics", ())) if id(m) not in before]
    last_by_frame: dict[str, Any] = {}
    for metric in metrics:
        frame = _frame(metric)
        previous = last_by_frame.get(frame)
        last_by_frame[frame] = metric
        seconds = float(metric.entire_frame_compile_time_s or 0.0)
        record.compile_s += seconds
        if metric.fail_type:
            reason = (metric.fail_reason or "").strip().splitlines()
            record.errors.append(f"{metric.fail_type}: {reason[0] if reason else ''}".strip())
        reason = None
        if metric.recompile_reason:
            reason = _recompile_reason(metric.recompile_reason, previous, metric)
            record.recompiles.append({"function": metric.co_name, "reason": reason})
        if not metric.graph_op_count:
            continue  # a frame compiled without a graph (only Python around a graph break)
        mine = [g for g in device_graphs if g.get("compile_id") == str(metric.compile_id)]
        backend = mine[0]["backend"] if mine else _backend_of(metric)
        run = timed.get(str(metric.compile_id))
        # A compiled module's frame is Dynamo's wrapper: the graph's own user code says where it
        # is, read alike on every backend.
        where = run["where"] if run else None
        if (not where or not where[1]) and mine and mine[0].get("file"):
            where = (mine[0]["function"], mine[0]["file"], mine[0]["line"])
        if not where or not where[1]:
            where = (_user_function(metric.co_name), metric.co_filename, metric.co_firstlineno)
        if run:
            record.run_s += run["run_s"]
        record.graphs.append(
            {
                "backend": backend,
                "function": where[0],
                "file": where[1],
                "line": where[2],
                "ops": int(metric.graph_op_count),
                "compile_s": seconds,
                "calls": run["calls"] if run else None,
                "run_s": run["run_s"] if run else None,
                "recompile": reason,
                "fallback_ops": sorted({op for g in mine for op in g.get("fallback_ops", ())}),
            }
        )


def _backend_of(metric: Any) -> str:
    inductor = (
        metric.inductor_compile_time_s,
        metric.inductor_cumulative_compile_time_us,
        metric.inductor_fx_local_cache_hit_count,
        metric.inductor_fx_local_cache_miss_count,
    )
    if any(inductor):
        return "inductor"
    return "torch.compile"


def _set_level(logger: logging.Logger, level: int) -> None:
    """``logger.setLevel(level)`` for a logger no other logger descends from.

    ``setLevel`` empties the level cache of every logger of the process (thousands once a model
    library is imported: 0.1 ms a call, four calls a run); only this logger's answer changes.
    """
    cache = getattr(logger, "_cache", None)
    if not isinstance(cache, dict):
        logger.setLevel(level)
        return
    logger.level = level
    cache.clear()


@contextlib.contextmanager
def _recording(cell_filename: str | None, backend: Any) -> Iterator[CompileRecord]:
    record = CompileRecord()
    utils = sys.modules.get("torch._dynamo.utils")
    before = {id(m) for m in getattr(utils, "_compilation_metrics", ())} if utils else set()
    emulated = sys.modules.get("neuron_workbench.emulator.compile")
    graphs_before = len(emulated.GRAPHS) if emulated is not None else 0
    warnings_before = len(emulated.WARNINGS) if emulated is not None else 0
    _install_graph_timing()
    with _GRAPH_RUNS_LOCK:
        runs_before = len(_GRAPH_RUNS)
    handler = _GraphBreaks()
    loggers = [(logging.getLogger(_GRAPH_BREAK_LOGGER), handler)]
    thread = threading.get_ident()
    outer = _DRAWING.get(thread)
    _DRAWING[thread] = record
    saved = [(logger.level, logger.propagate) for logger, _ in loggers]
    for logger, each in loggers:
        _set_level(logger, logging.DEBUG)
        logger.propagate = False  # recorded here, not printed into the cell's output
        logger.addHandler(each)
    try:
        yield record
    finally:
        if outer is None:
            _DRAWING.pop(thread, None)
        else:
            _DRAWING[thread] = outer
        for (logger, each), (level, propagate) in zip(loggers, saved):
            logger.removeHandler(each)
            _set_level(logger, level)
            logger.propagate = propagate
        try:
            _finish(record, before, graphs_before, runs_before)
        except Exception as exc:  # Dynamo's records changed shape: say so, never fail the run
            record.errors.append(f"compile record incomplete: {type(exc).__name__}: {exc}")
        emulated = sys.modules.get("neuron_workbench.emulator.compile")
        if emulated is not None:
            record.warnings.extend(emulated.WARNINGS[warnings_before:])
        record.graph_breaks = [
            {**b, "file": "cell" if b["file"] == cell_filename else b["file"]}
            for b in handler.found
        ]
        for graph in record.graphs:
            if graph["file"] == cell_filename:
                graph["file"] = "cell"


def compile_instrument(cell_filename: str) -> Any:
    """A run instrument recording a :class:`CompileRecord`; ``cell_filename`` marks cell lines.

    Graph breaks and graphs in a notebook cell itself get ``file`` ``"cell"`` and the cell's line.
    A script's program (compiled under its own path, ``train.py``) has no cell: its sites keep
    their path and read ``train.py:6``, as sites in any other file do.

    Parameters
    ----------
    cell_filename : str
        The program's compiled filename (``CellProgram.filename``).

    Returns
    -------
    callable
        The instrument: ``instrument(backend)`` is a context manager yielding the record.
    """
    from neuron_workbench.sites import is_cell_filename

    # None matches no site's file: a script's lines are not marked as a cell's
    return functools.partial(_recording, cell_filename if is_cell_filename(cell_filename) else None)


def graph_break_violation(breaks: Sequence[dict[str, Any]], backend: str) -> str | None:
    """The one-line ``--strict-graph-breaks`` failure for a run's graph breaks, or None.

    ``breaks`` as :attr:`CompileRecord.graph_breaks` holds them (also in the report's JSON).
    """
    if not breaks:
        return None
    first = breaks[0]
    where = (
        f"cell line {first['line']}"
        if first.get("file") == "cell"
        else f"{first.get('file')}:{first.get('line')}"
    )
    count = f"{len(breaks)} graph break{'s' if len(breaks) != 1 else ''}"
    return (
        f"--strict-graph-breaks: torch.compile on {backend} had {count}, the first at {where}: "
        f"{first.get('reason', '')}"
    )
