"""The notebook's ``logging`` set-up, mirrored into a target process for its run.

``logging.basicConfig(level=logging.INFO)`` in a plain cell configures the kernel's ``logging``; a
target in another process (a worker, a Ray actor) has its own, at Python's defaults (WARNING, no
handler). A message a ``%%neuron`` cell logs (``log.info("loss %.4f", loss)``) was then formatted
by the reference alone: its value was recorded on one side only and the scalar comparison FAILed
with "... vs none". Each run request carries the kernel's set-up as plain data (:func:`current`)
and the target process takes it before the run (:func:`apply`):

- every logger's level, ``propagate`` and ``disabled`` flags, and ``logging.disable``;
- a handler writing to ``sys.stdout`` or ``sys.stderr`` writes to the run's (captured, as a
  ``print`` is), with its level and format;
- any other handler (a file, a socket, a queue) formats each record it takes, as the kernel's
  does, and writes it nowhere: the target's run leaves no second copy of the kernel's log file.

A handler a run makes on ``print``'s streams (``logging.basicConfig`` in a ``%%neuron`` cell) is
made on the run's capture of them; :func:`streams_restored` points it at the process's own when
the run ends, or the kernel would write every later message into that capture, unseen. The
kernel's own handlers on those streams write to a run's capture while it runs
(:func:`streams_captured`), as its prints do: a run that is not shown shows no log line either.

The ``torch`` and ``ray`` loggers are left as each process has them: torch sets them up itself
(``TORCH_LOGS``), and the workbench's own compile instrument attaches to them during a run; so are
the handlers a target process had before its first request (a device SDK's own).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

#: Loggers each process keeps as its own (see the module's docstring): torch's, and Ray's (an
#: actor's process forwards its output to the driver through them).
_OWN_LOGGERS = ("torch", "ray")


def current() -> dict[str, Any] | None:
    """The logging set-up of this process, as :func:`apply` takes it (plain data: it is pickled).

    None when it cannot be read (a library's logger object of its own kind): the target process
    keeps its logging as it is, rather than the cell failing.
    """
    try:
        return _current()
    except Exception:
        return None


def _current() -> dict[str, Any]:
    manager = logging.Logger.manager
    loggers = {"": _logger_state(logging.getLogger())}
    for name, logger in list(manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or _own(name):
            continue  # a placeholder (a parent only named by its children), or the process's own
        if logger.level or logger.handlers or not logger.propagate or logger.disabled:
            loggers[name] = _logger_state(logger)
    return {"disable": manager.disable, "loggers": loggers}


def apply(setup: dict[str, Any] | None) -> None:
    """Take the set-up :func:`current` read in another process (None: leave logging as it is).

    The loggers the set-up names end up as the kernel's. Every other one is as this process had it
    before its first request (a device SDK's own handlers stay), or at the defaults: an earlier
    run's ``basicConfig`` here is gone, as the kernel has its handler once (a message formatted
    twice here would record its value twice).
    """
    if setup is None:
        return
    global _before_requests
    if _before_requests is None:
        _before_requests = _own_state()
    named = setup["loggers"]
    present = {
        name: logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and not _own(name)
    }
    present[""] = logging.getLogger()
    for name in named.keys() - present.keys():
        present[name] = logging.getLogger(name)
    for name, logger in present.items():
        state = named.get(name)
        handlers: list[logging.Handler]
        if state is not None:
            handlers = [_mirrored(handler) for handler in state["handlers"]]
        else:
            state = _before_requests.get(name) or (_DEFAULT_ROOT if name == "" else _DEFAULT)
            handlers = state["handlers"]
            if logger.handlers == handlers and (
                (logger.level, logger.propagate, logger.disabled)
                == (state["level"], state["propagate"], state["disabled"])
            ):
                continue  # as it was, as most are
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        # set directly: Logger.setLevel clears every logger's cache, once per logger here (a
        # process with transformers has hundreds); the root's setLevel below clears it once
        logger.level = state["level"]
        logger.propagate = state["propagate"]
        logger.disabled = state["disabled"]
        for handler in handlers:
            logger.addHandler(handler)
    root = logging.getLogger()
    root.setLevel(root.level)
    logging.disable(setup["disable"])


_DEFAULT: dict[str, Any] = {
    "level": logging.NOTSET,
    "propagate": True,
    "disabled": False,
    "handlers": [],
}
_DEFAULT_ROOT = {**_DEFAULT, "level": logging.WARNING}
#: This process's loggers as they were before its first request (its handlers themselves).
_before_requests: dict[str, dict[str, Any]] | None = None


def _own_state() -> dict[str, dict[str, Any]]:
    loggers = [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
    return {
        name: {
            "level": logger.level,
            "propagate": logger.propagate,
            "disabled": logger.disabled,
            "handlers": list(logger.handlers),
        }
        for name, logger in loggers
        if isinstance(logger, logging.Logger) and not _own(name)
    }


def _own(name: str) -> bool:
    return name in _OWN_LOGGERS or name.startswith(_OWN_PREFIXES)


_OWN_PREFIXES = tuple(f"{name}." for name in _OWN_LOGGERS)


def _logger_state(logger: logging.Logger) -> dict[str, Any]:
    return {
        "level": logger.level,
        "propagate": logger.propagate,
        "disabled": logger.disabled,
        "handlers": [_handler_state(handler) for handler in logger.handlers],
    }


def _handler_state(handler: logging.Handler) -> dict[str, Any]:
    formatter = handler.formatter
    # A formatter is anything with format(record): logging's own are read, another formats as
    # the default one here (its private fields may not exist)
    kind = type(getattr(formatter, "_style", None))
    style = next((key for key, styles in logging._STYLES.items() if kind is styles[0]), "%")
    fmt, datefmt = getattr(formatter, "_fmt", None), getattr(formatter, "datefmt", None)
    return {
        "level": handler.level if isinstance(handler.level, int) else logging.NOTSET,
        "stream": _standard_stream(getattr(handler, "stream", None)),
        "format": fmt if isinstance(fmt, str) else None,
        "datefmt": datefmt if isinstance(datefmt, str) else None,
        "style": style,
    }


def _standard_stream(stream: Any) -> str | None:
    """``"stdout"`` or ``"stderr"`` when ``stream`` is one of this process's, else None."""
    for name in ("stdout", "stderr"):
        if stream is not None and stream in (getattr(sys, name), getattr(sys, f"__{name}__")):
            return name
    return None


class _Nowhere:
    """The stream of a kernel handler writing elsewhere (a file): its records go nowhere here.

    The handler is logging's own ``StreamHandler``, so each record is formatted in logging's frames,
    as in the kernel (a value formatted in the workbench's frames is not recorded as the cell's).
    """

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _mirrored(state: dict[str, Any]) -> logging.Handler:
    stream = state["stream"]
    # a kernel handler of sys.stdout/sys.stderr writes to the run's, whatever it is at the time
    handler = logging.StreamHandler(_CurrentStream(stream) if stream is not None else _Nowhere())
    handler.setLevel(state["level"])
    if state["format"] is not None or state["datefmt"] is not None:
        handler.setFormatter(logging.Formatter(state["format"], state["datefmt"], state["style"]))
    return handler


def streams_captured(streams: tuple[Any, ...], captures: tuple[Any, ...]) -> None:
    """Handlers writing to one of ``streams`` write to ``captures`` (a run's stdout and stderr).

    ``streams`` are what ``sys.stdout`` and ``sys.stderr`` were before the run, in that order. A
    handler the notebook made in a plain cell holds the stream it was made on, not the run's
    capture: a run not shown (the reference, with ``--keep target``) showed its log lines anyway,
    next to the kept run's. :func:`streams_restored` points them back when the run ends.
    """
    for handler in _handlers():
        if not isinstance(handler, logging.StreamHandler):
            continue
        for stream, capture in zip(streams, captures, strict=True):
            if handler.stream is stream and capture is not stream:
                handler.setStream(capture)  # type: ignore[attr-defined]
                break


def _handlers() -> list[logging.Handler]:
    """Every handler of this process's loggers."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    # (in one comprehension: most of the hundreds of loggers have no handler, a placeholder none)
    return [h for logger in loggers if getattr(logger, "handlers", None) for h in logger.handlers]


def streams_restored(captures: tuple[Any, ...], streams: tuple[Any, ...]) -> None:
    """Handlers writing to one of ``captures`` (a run's stdout and stderr) write to ``streams``.

    ``streams`` are what ``sys.stdout`` and ``sys.stderr`` were before the run, in that order.
    """
    captured = {id(capture) for capture in captures}
    for handler in _handlers():
        if not isinstance(handler, logging.StreamHandler) or id(handler.stream) not in captured:
            continue  # (nearly every one)
        stream = handler.stream
        for capture, stream_before in zip(captures, streams, strict=True):
            if stream is capture and capture is not stream_before:
                handler.setStream(stream_before)  # type: ignore[attr-defined]


@contextlib.contextmanager
def records_go_nowhere() -> Iterator[None]:
    """Meanwhile this process's handlers format each record they take and write it nowhere.

    For a rerun of the cell in the kernel after its reference (the float64 oracle's, the eager
    runs of ``--compile-check``): its prints are discarded, and so must be what it logs. The
    kernel's handlers had written every message of a cell that failed a second time, to the
    notebook (a handler holds the stream it was made on, not the run's capture) and into the log
    file. Each record is still formatted, in logging's frames, so a value it formats is observed
    as in the reference run. The ``torch`` and ``ray`` loggers are left as they are.
    """
    loggers = [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and not _own(name)
    ]
    handlers = {id(h): h for lg in (logging.getLogger(), *loggers) for h in lg.handlers}
    silenced = []
    for handler in handlers.values():
        own = vars(handler).get("emit", _NO_EMIT)  # an emit set on the object itself (rare)
        handler.emit = handler.format  # type: ignore[method-assign]
        silenced.append((handler, own))
    try:
        yield
    finally:
        for handler, own in silenced:
            if own is _NO_EMIT:
                vars(handler).pop("emit", None)
            else:
                handler.emit = own  # type: ignore[method-assign]


_NO_EMIT = object()


def own_streams_follow_runs() -> None:
    """In a target process: torch's own log handlers write to ``sys.stderr`` as it is then.

    Torch made them at import on the process's stderr, which a worker shares with its kernel: a
    run's log line (Dynamo's graph-break warning) showed in the notebook once from each run. Now a
    run's lines are its captured output, shown as the kept run's prints are.
    """
    loggers = [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and _own(name) and name.startswith("torch")
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and handler.stream in (
                sys.stderr,
                sys.__stderr__,
            ):
                handler.stream = _CurrentStream("stderr")


class _CurrentStream:
    """``sys.stdout`` or ``sys.stderr`` as it is at each write (a run's capture, during a run)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        return getattr(sys, self._name).write(text)

    def flush(self) -> None:
        getattr(sys, self._name).flush()
