"""The notebook's logging set-up, read in one process and taken by another (a target's)."""

import json
import logging
import subprocess
import sys
import textwrap

from neuron_workbench.run import logging_setup

#: A fresh process (as a worker is) taking the set-up given on stdin, then logging.
TAKER = textwrap.dedent(
    """
    import json, logging, sys
    from neuron_workbench.run import logging_setup

    class Formatted:  # a lazily formatted argument: it says when logging formatted it
        def __str__(self):
            print("formatted", file=sys.__stdout__)
            return "value"

    # the process's own before its first request (a device SDK's): it stays
    logging.getLogger("wbtest.sdk").addHandler(logging.StreamHandler(sys.stdout))
    torch_handler = logging.StreamHandler(sys.stdout)
    logging.getLogger("torch.wbtest").addHandler(torch_handler)
    setup = json.loads(sys.stdin.read())
    logging_setup.apply(setup)
    # an earlier run's (basicConfig in a cell): gone with the next request, as the kernel has
    # no such handler
    logging.getLogger("wbtest.own").addHandler(logging.StreamHandler(sys.stdout))
    logging_setup.apply(setup)
    logging.getLogger("wbtest.sdk").warning("sdk %s", "kept")
    logging.getLogger("wbtest.train").info("train %s", "shown")
    logging.getLogger("wbtest.train").debug("train %s", "below its level")
    logging.getLogger("wbtest.quiet").warning("quiet %s", "disabled")
    logging.getLogger("wbtest.file").info("file %s", Formatted())
    logging.getLogger("wbtest.own").warning("own %s", "to the root")
    assert logging.getLogger("torch.wbtest").handlers == [torch_handler]
    """
)


def _taken(setup):
    done = subprocess.run(
        [sys.executable, "-c", TAKER],
        input=json.dumps(setup),  # plain data: JSON carries it as pickle does
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout, done.stderr


def test_a_set_up_is_taken_by_another_process_as_it_was_read(tmp_path):
    names = ("", "wbtest.train", "wbtest.quiet", "wbtest.file")
    saved = {n: logging.getLogger(n or None) for n in names}
    state = {n: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for n, lg in saved.items()}
    file_handler = logging.FileHandler(tmp_path / "kernel.log")
    try:
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("{levelname}|{name}|{message}", style="{"))
        root.addHandler(stream)
        root.setLevel(logging.WARNING)
        train = saved["wbtest.train"]
        train.setLevel(logging.INFO)
        saved["wbtest.quiet"].disabled = True
        file_logger = saved["wbtest.file"]
        file_logger.setLevel(logging.INFO)
        file_logger.propagate = False
        file_logger.addHandler(file_handler)
        setup = logging_setup.current()
    finally:
        file_handler.close()
        for name, (level, handlers, propagate, disabled) in state.items():
            logger = saved[name]
            logger.handlers[:] = handlers
            logger.level, logger.propagate, logger.disabled = level, propagate, disabled
    out, err = _taken(setup)
    # the file's handler formatted its record (once) and wrote it nowhere; the earlier run's
    # handler went, so its message reached the root's handler alone
    assert out == "sdk kept\nformatted\n"
    assert err == (
        "WARNING|wbtest.sdk|sdk kept\n"
        "INFO|wbtest.train|train shown\n"
        "WARNING|wbtest.own|own to the root\n"
    )
    assert (tmp_path / "kernel.log").read_text() == ""


def test_a_handler_a_run_made_on_its_capture_writes_to_the_stream_before_it(capsys):
    import io

    logger = logging.getLogger("wbtest.capture")
    capture, kept = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(capture)  # logging.basicConfig() inside a captured run
    other = logging.StreamHandler(kept)
    logger.addHandler(handler)
    logger.addHandler(other)
    try:
        logging_setup.streams_restored((io.StringIO(), capture), (sys.stdout, sys.stderr))
        assert handler.stream is sys.stderr and other.stream is kept
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(other)


def test_a_formatter_of_its_own_kind_is_read_as_the_default_one():
    # any object with format(record) is a formatter to logging; reading its private fields
    # failed every %%neuron cell of the notebook
    class Tagged:
        def format(self, record):
            return "X " + record.getMessage()

    logger = logging.getLogger("wbtest.tagged")
    handler = logging.StreamHandler(sys.stderr)
    handler.formatter = Tagged()
    logger.addHandler(handler)
    try:
        state = logging_setup.current()["loggers"]["wbtest.tagged"]["handlers"]
    finally:
        logger.removeHandler(handler)
    assert state == [
        {"level": 0, "stream": "stderr", "format": None, "datefmt": None, "style": "%"}
    ]
