"""The notebook's open files and progress bars in runs that are not kept: stand-ins."""

import csv
import io
import logging
import pickle

import pytest

from neuron_workbench.run import notebook_handles
from neuron_workbench.run.namespace import isolate
from neuron_workbench.run.notebook_handles import (
    drain_made,
    is_notebook_file,
    kept_apart,
    write_back,
)


@pytest.fixture(autouse=True)
def _no_stand_ins_left():
    drain_made()
    yield
    drain_made()


def test_which_files_are_the_notebooks(tmp_path):
    (tmp_path / "in.txt").write_text("x")
    with (
        open(tmp_path / "a.log", "w") as text,
        open(tmp_path / "b.bin", "ab") as binary,
        open(tmp_path / "c.raw", "wb", buffering=0) as raw,
        open(tmp_path / "in.txt") as reading,
        open(tmp_path / "d.log", "w+") as both,
    ):
        assert [is_notebook_file(f) for f in (text, binary, raw)] == [True, True, True]
        assert not is_notebook_file(reading) and not is_notebook_file(both)
        assert not is_notebook_file(io.StringIO()) and not is_notebook_file("a.log")
    assert not is_notebook_file(text)
    assert is_notebook_file(text, open_only=False)
    assert not is_notebook_file(reading, open_only=False)


def test_a_stand_in_takes_writes_as_the_file_would_and_writes_nothing(tmp_path):
    path = tmp_path / "train.log"
    with open(path, "w") as log:
        apart = kept_apart(log)
        print("step 1", file=apart)
        csv.writer(apart).writerow([1, 2.5])
        handler = logging.StreamHandler(apart)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.emit(logging.makeLogRecord({"msg": "logged"}))
        apart.writelines(["a", "b\n"])
        with pytest.raises(TypeError, match="must be str"):
            apart.write(b"bytes")
        with pytest.raises(io.UnsupportedOperation):
            apart.fileno()
        assert (apart.name, apart.mode, apart.encoding) == (str(path), "w", log.encoding)
        with apart:
            pass
        assert apart.closed and not log.closed
        with pytest.raises(ValueError, match="closed file"):
            apart.write("late")
    assert path.read_text() == ""
    (made,) = drain_made().uses
    assert made[0] == "file" and made[2:] == (str(path), "step 1\n1,2.5\r\nlogged\nab\n", True)
    assert drain_made().uses == []


def test_a_kept_runs_writes_go_to_the_notebooks_file_once(tmp_path):
    path = tmp_path / "metrics.bin"
    with open(path, "ab") as out:
        out.write(b"before|")
        apart = kept_apart(out)
        assert apart.mode == "ab"
        apart.write(b"run|")
        apart.write(memoryview(b"view"))
        write_back(drain_made().uses)
        assert not out.closed
    assert path.read_bytes() == b"before|run|view"


def test_a_stand_in_comes_back_to_the_process_that_sent_its_file(tmp_path):
    with open(tmp_path / "a.log", "w") as log:
        apart = kept_apart(log)
        assert pickle.loads(pickle.dumps(apart)) is log
        # elsewhere (the token names another process's file) it arrives as a stand-in again
        token = f"0:{id(log)}"
        elsewhere = notebook_handles._returned(token, log.name, "w", "utf-8", "strict")
        assert type(elsewhere) is notebook_handles.NotebookFileApart and not elsewhere.closed


def test_isolate_gives_the_kept_run_the_file_and_the_other_a_stand_in(tmp_path):
    class Logger:
        def __init__(self, path):
            self.f = open(path, "w")  # noqa: SIM115

    logger = Logger(tmp_path / "x.log")
    namespace = {"logger": logger, "log": logger.f}
    kept, shared = isolate(namespace, ["logger", "log"])
    assert shared == [] and kept["log"] is logger.f and kept["logger"].f is logger.f
    kept["log"].close()  # the kept run ran first and closed it ...
    apart, shared = isolate(namespace, ["logger", "log"], files_apart=True)
    # ... the other run still finds it open, as the cell did, the same stand-in under both names
    assert shared == [] and type(apart["log"]) is notebook_handles.NotebookFileApart
    assert apart["logger"].f is apart["log"] and not apart["log"].closed
    # in a later cell, the file closed before it is what it was for every run: a closed file
    _, shared = isolate(namespace, ["log"])
    assert shared == ["log"]
    _, shared = isolate(namespace, ["log"], files_apart=True)
    assert shared == ["log"]


def test_a_progress_bar_stand_in_counts_and_the_kept_runs_moves_reach_the_bar():
    tqdm = pytest.importorskip("tqdm")
    with tqdm.tqdm(total=10, file=io.StringIO()) as bar:
        bar.update(2)
        apart = notebook_handles.bar_kept_apart(bar)
        assert (apart.n, apart.total) == (2, 10)
        for _ in range(3):
            apart.update()
        apart.set_description("epoch 1")
        apart.set_postfix(loss=0.123456, step=5)
        assert apart.n == 5 and bar.n == 2  # the notebook's bar did not move
        assert pickle.loads(pickle.dumps(apart)) is bar  # back where it came from: the bar
        write_back(drain_made().uses)  # the kept run's moves, done to the bar
        assert bar.n == 5 and bar.desc == "epoch 1: " and bar.postfix == "loss=0.123, step=5"
        untouched = notebook_handles.bar_kept_apart(bar)
        assert drain_made().uses == [] and untouched.n == 5


def test_isolate_gives_the_kept_run_the_bar_and_the_other_a_stand_in():
    tqdm = pytest.importorskip("tqdm")
    with tqdm.tqdm(total=4, file=io.StringIO()) as bar:
        namespace = {"bar": bar, "state": {"bar": bar}}
        kept, shared = isolate(namespace, ["bar", "state"])
        assert shared == [] and kept["bar"] is bar and kept["state"]["bar"] is bar
        apart, shared = isolate(namespace, ["bar", "state"], files_apart=True)
        assert shared == [] and type(apart["bar"]) is notebook_handles.ProgressBarApart
        assert apart["state"]["bar"] is apart["bar"]
