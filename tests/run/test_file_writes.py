import builtins
import errno
import glob
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch

from neuron_workbench.run import file_writes
from neuron_workbench.run.file_writes import (
    CellStartFiles,
    kept_apart_note,
    originals_folder,
    originals_kept,
    tempfile_names,
    tempfile_names_drawn,
    writes_kept_apart,
)


@pytest.fixture(params=["project", "under the temporary folder"])
def folder(request):
    # A notebook's folder, or one kept under /tmp (not scratch: tempfile names its own "tmp...").
    root = pathlib.Path.cwd() if request.param == "project" else pathlib.Path(tempfile.gettempdir())
    here = root / f"file-writes-test-{os.getpid()}"
    here.mkdir()
    yield here
    shutil.rmtree(here)


def test_writes_stay_apart_and_read_back_inside(folder):
    ckpt, log = folder / "ckpt.pt", folder / "log.txt"
    ckpt.write_text("the notebook's")
    log.write_text("line0\n")
    with writes_kept_apart() as writes:
        torch.save({"w": torch.arange(3.0)}, ckpt)  # torch's C++ zip writer, given a path
        assert torch.load(ckpt)["w"].tolist() == [0.0, 1.0, 2.0]
        assert torch.load(ckpt, mmap=True)["w"].tolist() == [0.0, 1.0, 2.0]  # maps the path
        with open(log, "a") as handle:  # appends build on the file as it was
            handle.write("line1\n")
        assert log.read_text().split() == ["line0", "line1"]
        np.save(folder / "new.npy", np.arange(4))
        assert os.path.exists(folder / "new.npy") and np.load(folder / "new.npy").sum() == 6
        with open(folder / "part.tmp", "w") as handle:  # an atomic save: write, then rename
            handle.write("done")
        os.replace(folder / "part.tmp", folder / "final.txt")
        assert (folder / "final.txt").read_text() == "done"
        assert not os.path.exists(folder / "part.tmp")
        os.remove(folder / "new.npy")
        assert not os.path.exists(folder / "new.npy")
        with pytest.raises(FileExistsError):
            open(ckpt, "x")
        assert writes.written == [str(ckpt), str(log), str(folder / "final.txt")]
    # nothing reached the real files, and the run's copies are gone
    assert ckpt.read_text() == "the notebook's" and log.read_text() == "line0\n"
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt.pt", "log.txt"]
    assert not os.path.exists(writes.folder)


def test_safetensors_files_stay_apart_and_read_back_inside(folder):
    # safetensors opens its files in Rust, below open(): its writer and reader take the run's paths
    safetensors_torch = pytest.importorskip("safetensors.torch")
    saved = folder / "model.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(2)}, saved)
    with writes_kept_apart() as writes:
        safetensors_torch.save_file({"w": torch.arange(3.0)}, saved)
        assert safetensors_torch.load_file(saved)["w"].tolist() == [0.0, 1.0, 2.0]
        safetensors_torch.save_model(torch.nn.Linear(2, 1), folder / "linear.safetensors")
        with safetensors_torch.safe_open(folder / "linear.safetensors", framework="pt") as handle:
            assert sorted(handle.keys()) == ["bias", "weight"]
        assert writes.written == [str(saved), str(folder / "linear.safetensors")]
    assert safetensors_torch.load_file(saved)["w"].tolist() == [0.0, 0.0]
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_archives_stay_apart_and_read_back_inside(folder, originals):
    # TorchScript's C++ writes and reads a path below open(): the run not kept wrote the notebook's
    # archive (its tensors on the target's device, which the kernel then failed to load)
    archive = folder / "model.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 1)), archive)
    with originals_kept(originals):  # the kept run, changing it (its original kept first)
        torch.jit.script(torch.nn.Linear(2, 3)).save(archive)
    assert torch.jit.load(archive).weight.shape == (3, 2)
    with writes_kept_apart(originals=originals) as writes:  # the run not kept
        assert torch.jit.load(archive).weight.shape == (1, 2)  # as the cell found it
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 4)), archive)
        torch.jit.script(torch.nn.Linear(2, 5)).save(str(folder / "other.pt"))
        assert torch.jit.load(str(archive)).weight.shape == (4, 2)
        assert torch.jit.load(folder / "other.pt", map_location="cpu").weight.shape == (5, 2)
        assert writes.written == [str(archive), str(folder / "other.pt")]
    assert torch.jit.load(archive).weight.shape == (3, 2)
    assert sorted(p.name for p in folder.iterdir()) == ["model.pt"]


@pytest.fixture
def originals():
    # the cell's folder of originals, as the kernel names it and removes it after the cell
    folder = originals_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("file_system", ["the same", "another"])
def test_the_run_not_kept_finds_the_files_as_the_cell_did(
    folder, originals, file_system, monkeypatch
):
    # A cell resuming from its own checkpoint: the kept run saved it first, and the other run
    # resumed from the kept run's (a FAIL, "3 vs 6"). It finds the files as the cell started.
    if file_system == "another":  # than the temporary folder's: no hard links, copies

        def cross_device(src, dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src)

        monkeypatch.setattr(file_writes, "_LINK", cross_device)
    ckpt, log, old, gone = (folder / name for name in ("ckpt.pt", "log.txt", "old.txt", "gone"))
    torch.save({"step": 0}, ckpt)
    os.chmod(ckpt, 0o640)
    log.write_text("line0\n")
    old.write_text("old")
    gone.write_text("gone")
    with originals_kept(originals):  # the kept run
        assert torch.load(ckpt) == {"step": 0}
        torch.save({"step": 1}, ckpt)
        with open(log, "a") as handle:
            handle.write("line1\n")
        torch.save({"step": 1}, folder / "new.pt")
        os.replace(old, folder / "renamed.txt")
        with open(folder / "renamed.txt", "a") as handle:  # the original, changed in place
            handle.write("+")
        os.remove(gone)
    # the kept run's files are as a plain run leaves them
    assert torch.load(ckpt) == {"step": 1} and ckpt.stat().st_mode & 0o777 == 0o640
    assert log.read_text() == "line0\nline1\n" and (folder / "renamed.txt").read_text() == "old+"
    real_names = ["ckpt.pt", "log.txt", "new.pt", "renamed.txt"]
    assert sorted(os.listdir(folder)) == sorted(real_names)
    with writes_kept_apart(originals=originals):  # the run not kept
        assert torch.load(ckpt) == {"step": 0}
        assert log.read_text() == "line0\n" and old.read_text() == "old"
        assert gone.read_text() == "gone" and os.path.exists(gone)
        assert not os.path.exists(folder / "new.pt") and not (folder / "renamed.txt").exists()
        with pytest.raises(FileNotFoundError):
            open(folder / "new.pt", "rb")
        started = ["ckpt.pt", "gone", "log.txt", "old.txt"]
        assert sorted(os.listdir(folder)) == started
        assert sorted(p.name for p in folder.iterdir()) == started
        assert sorted(os.path.basename(p) for p in glob.glob(str(folder / "*"))) == started
        # its own writes are its own, built on the originals
        torch.save({"step": 5}, ckpt)
        with open(log, "a") as handle:
            handle.write("other\n")
        assert torch.load(ckpt) == {"step": 5} and log.read_text() == "line0\nother\n"
    assert torch.load(ckpt) == {"step": 1} and sorted(os.listdir(folder)) == sorted(real_names)


def test_files_the_kept_run_removed_with_their_folder_read_as_they_were(folder, originals):
    # `shutil.rmtree("ckpts"); os.makedirs("ckpts")` before saving: the other run still resumes
    (folder / "ckpts").mkdir()
    (folder / "ckpts" / "last.pt").write_text("last")
    with originals_kept(originals):
        shutil.rmtree(folder / "ckpts")
        os.makedirs(folder / "ckpts")
    assert os.listdir(folder / "ckpts") == []
    with writes_kept_apart(originals=originals):
        assert (folder / "ckpts" / "last.pt").read_text() == "last"
        assert os.listdir(folder / "ckpts") == ["last.pt"]


def test_a_file_the_kept_run_overwrites_stays_the_file_every_holder_has(folder, originals):
    # it was swapped for a new file at the name: a holder in another process (a subprocess
    # writing the log, `tail -f`) went on with a file no name led to, its owner and attributes
    # were the kernel's, and an open that then failed (a read-only file) left it empty
    log = folder / "train.log"
    log.write_text("epoch 0\n")
    inode = log.stat().st_ino
    with originals_kept(originals):
        with open(log, "w") as kept:
            kept.write("header\n")
    assert log.read_text() == "header\n" and log.stat().st_ino == inode
    # its original was kept, for the run not kept
    kept_original = CellStartFiles(str(originals)).where(str(log))
    assert kept_original != str(log) and open(kept_original).read() == "epoch 0\n"
    with pytest.raises(ValueError), originals_kept(str(originals) + "-2"):
        open(log, "rw")  # refused before anything opens: the file is as it was
    assert log.read_text() == "header\n"
    shutil.rmtree(str(originals) + "-2", ignore_errors=True)


def test_the_first_temporary_folder_lookup_of_a_process_in_a_kept_run_does_not_hang(
    folder, originals
):
    # A worker whose process had not looked up the temporary folder yet (run --against: the
    # kept target's first file write) hung for good: tempfile's lookup opens a probe file through
    # the patched os.open, which looked the folder up again under tempfile's lock; its
    # parent-watch thread then waited on the same lock, so it outlived its parent too
    code = (
        "import os, tempfile\n"
        "from neuron_workbench.run.file_writes import originals_kept\n"
        "tempfile.tempdir = None\n"  # as in a process that has not looked it up yet
        f"with originals_kept({originals!r}):\n"
        "    open('where.txt', 'a').write('b\\n')\n"
        "    tempfile.gettempdir()\n"
        "print(open('where.txt').read(), end='')\n"
    )
    (folder / "where.txt").write_text("a\n")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "a\nb\n", done.stderr


def test_a_kept_run_that_changes_no_file_makes_no_folder_of_originals(folder, originals):
    (folder / "data.txt").write_text("data")
    with originals_kept(originals):
        assert (folder / "data.txt").read_text() == "data" and os.listdir(folder) == ["data.txt"]
        torch.save({"a": 1}, os.path.join(tempfile.gettempdir(), f"tmp-scratch-{os.getpid()}"))
    os.remove(os.path.join(tempfile.gettempdir(), f"tmp-scratch-{os.getpid()}"))
    assert not os.path.exists(originals)


def test_a_child_the_kept_run_forked_makes_no_folder_of_originals(folder, originals):
    # a DataLoader's persistent worker, forked in the kept run, holds its patches after the cell:
    # it made the folder again (empty) once the kernel had removed it, one more each cell
    with originals_kept(originals):
        child = os.fork()
        if child == 0:
            (folder / "child.txt").write_text("child")
            os._exit(0)
        os.waitpid(child, 0)
    assert (folder / "child.txt").read_text() == "child" and not os.path.exists(originals)


def test_a_run_that_writes_no_file_makes_no_private_folder(folder):
    # Every run made and removed its private folder: removing a folder took 4 ms of each cell's
    # critical path on an ext4 disk mounted with discard, though most cells write nothing
    data = folder / "data.csv"
    data.write_text("a,b\n")
    with writes_kept_apart() as writes:
        assert data.read_text() == "a,b\n" and sorted(os.listdir(folder)) == ["data.csv"]
        assert not os.path.exists(writes.folder)
    assert not writes.folder_made and not os.path.exists(writes.folder)
    with writes_kept_apart() as writes:
        (folder / "out.txt").write_text("x")  # the first copy makes it
        assert os.path.isdir(writes.folder) and os.stat(writes.folder).st_mode & 0o777 == 0o700
    assert not os.path.exists(writes.folder) and not os.path.exists(folder / "out.txt")


def test_files_it_did_not_write_read_as_they_are_and_everything_is_put_back(folder):
    data = folder / "data.csv"
    data.write_text("a,b\n1,2\n")
    originals = (builtins.open, io.open, os.replace, os.rename, os.remove, os.unlink, os.stat)
    folders = (shutil.rmtree, os.rmdir, os.mkdir, os.listdir, os.scandir)
    zip_writer, load = torch.serialization._open_zipfile_writer, torch.load
    with writes_kept_apart() as writes:
        assert data.read_text() == "a,b\n1,2\n"
        with open(data, "rb") as handle:
            assert handle.read(3) == b"a,b"
        assert writes.written == []
    assert (
        builtins.open,
        io.open,
        os.replace,
        os.rename,
        os.remove,
        os.unlink,
        os.stat,
    ) == originals
    assert (shutil.rmtree, os.rmdir, os.mkdir, os.listdir, os.scandir) == folders
    assert torch.serialization._open_zipfile_writer is zip_writer
    assert torch.load is torch.serialization.load is load


def test_scratch_files_are_written_for_real():
    # tempfile's files and folders made during the run, and torch.compile's cache (whenever it was
    # made): compilers and other processes read them
    scratch = None
    cache = os.path.join(tempfile.gettempdir(), f"torchinductor_test{os.getpid()}")
    os.makedirs(cache)
    try:
        with writes_kept_apart() as writes:
            scratch = tempfile.mkdtemp()
            with open(os.path.join(scratch, "kernel.cpp"), "w") as handle:
                handle.write("int main() {}")
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as named:
                named.write("x = 1")
            with open(os.path.join(cache, "graph.py"), "w") as handle:
                handle.write("y = 2")
            assert writes.written == []
        assert os.path.getsize(os.path.join(scratch, "kernel.cpp"))
        assert os.path.getsize(named.name) and os.path.getsize(os.path.join(cache, "graph.py"))
        os.unlink(named.name)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch)
        shutil.rmtree(cache)


def test_tempfile_folders_made_before_the_run_are_the_notebooks():
    # A plain cell's tempfile.mkdtemp() holding checkpoints: both runs of a %%neuron cell save and
    # load there at the same time, so the run that is not kept must write its own copies.
    folder = pathlib.Path(tempfile.mkdtemp())
    named = tempfile.NamedTemporaryFile(suffix=".pt", delete=False)  # noqa: SIM115
    named.close()
    ckpt = folder / "ckpt.pt"
    try:
        with writes_kept_apart() as writes:
            torch.save({"w": torch.arange(3.0)}, ckpt)
            assert torch.load(ckpt)["w"].tolist() == [0.0, 1.0, 2.0]
            torch.save(torch.ones(2), named.name)
            assert torch.load(named.name).tolist() == [1.0, 1.0]
            assert writes.written == [str(ckpt), named.name]
        assert not ckpt.exists() and os.path.getsize(named.name) == 0
    finally:
        shutil.rmtree(folder)
        os.unlink(named.name)


def test_the_note_names_the_files_and_the_kept_run(folder):
    paths = [str(folder / f"f{i}.pt") for i in range(5)]
    note = kept_apart_note(paths, "ref")
    assert note.startswith("its writes to 5 files were kept apart")
    assert "hold the reference run's" in note and "and 2 more" in note
    assert "target run's" in kept_apart_note(paths[:1], "target")


def test_real_files_removed_or_renamed_in_the_run_are_only_hidden_from_it(folder):
    # A rerun (the precision oracle, --compile-check) comes after the kept run wrote its files:
    # rotating a checkpoint there must not move or delete the kept run's.
    ckpt, old = folder / "ckpt.pt", folder / "ckpt.prev.pt"
    ckpt.write_text("the kept run's")
    (folder / "gone.txt").write_text("stays")
    keep = folder / "keep.txt"
    keep.write_text("mode stays")
    mode = keep.stat().st_mode
    with writes_kept_apart() as writes:
        os.replace(ckpt, old)
        assert not ckpt.exists() and old.read_text() == "the kept run's"
        with pytest.raises(FileNotFoundError):
            open(ckpt)
        ckpt.write_text("this run's")
        os.remove(folder / "gone.txt")
        assert not os.path.exists(folder / "gone.txt")
        with pytest.raises(FileNotFoundError):
            os.remove(folder / "gone.txt")
        # an atomic save: a scratch file written, then renamed into place
        handle, scratch = tempfile.mkstemp()
        with open(handle, "w") as out:
            out.write("atomic")
        os.replace(scratch, folder / "result.txt")
        assert (folder / "result.txt").read_text() == "atomic" and not os.path.exists(scratch)
        # shutil.copy sets the copy's mode: on the run's copy, not on a real file
        shutil.copy(folder / "result.txt", folder / "copy.txt")
        assert (folder / "copy.txt").read_text() == "atomic"
        os.chmod(keep, 0o600)  # a real file the run did not write: left alone
        assert sorted(os.path.basename(p) for p in writes.written) == [
            "ckpt.prev.pt", "ckpt.pt", "copy.txt", "result.txt",
        ]  # fmt: skip
    assert ckpt.read_text() == "the kept run's" and (folder / "gone.txt").read_text() == "stays"
    assert keep.stat().st_mode == mode
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt.pt", "gone.txt", "keep.txt"]


def test_a_folder_removed_in_the_run_is_only_hidden_from_it(folder):
    # "Clear the output folder, then save": the run not kept removed the kept run's checkpoint,
    # saved there a moment before, for real, and saved its own where it was thrown away.
    out = folder / "out"
    (out / "sub").mkdir(parents=True)
    (out / "ckpt.pt").write_text("the kept run's")
    (out / "sub" / "log.txt").write_text("kept")
    with writes_kept_apart() as writes:
        (out / "mine.txt").write_text("a copy of the run's")
        shutil.rmtree(out)
        assert not out.exists() and not (out / "ckpt.pt").exists()
        with pytest.raises(FileNotFoundError):
            shutil.rmtree(out)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out / "sub", exist_ok=True)  # there again, empty
        assert out.is_dir() and not (out / "sub" / "log.txt").exists()
        torch.save({"w": torch.arange(2.0)}, out / "ckpt.pt")
        assert torch.load(out / "ckpt.pt")["w"].tolist() == [0.0, 1.0]
        os.remove(out / "ckpt.pt")  # its own copy gone: the real file does not show again
        assert not (out / "ckpt.pt").exists()
        with pytest.raises(OSError):
            os.rmdir(folder / "out")  # not empty: "sub" is there again
        os.rmdir(out / "sub")
        os.rmdir(out)
        assert not out.exists()
        assert writes.written == []
    # the disk is as the kept run left it
    assert (out / "ckpt.pt").read_text() == "the kept run's"
    assert (out / "sub" / "log.txt").read_text() == "kept"
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "sub"]


def test_a_notebooks_temporary_directory_cleaned_up_in_the_run_stays():
    notebook = tempfile.TemporaryDirectory()
    try:
        with open(os.path.join(notebook.name, "ckpt.pt"), "w") as handle:
            handle.write("the kept run's")
        with writes_kept_apart():
            scratch = tempfile.TemporaryDirectory()  # the run's own: removed for real
            scratch.cleanup()
            assert not os.path.exists(scratch.name)
            notebook.cleanup()  # the same object in both runs: only the kept run removes it
            assert not os.path.exists(notebook.name)
        assert os.path.exists(os.path.join(notebook.name, "ckpt.pt"))
    finally:
        shutil.rmtree(notebook.name, ignore_errors=True)


def test_the_tempfile_names_given_decide_what_is_the_notebooks():
    # The kernel lists the temporary folder once, before either run: a tmp... folder the cell
    # itself made was the notebook's or scratch by which run made it first.
    made = pathlib.Path(tempfile.mkdtemp())
    try:
        before = tempfile_names()
        assert made.name in before
        with writes_kept_apart(notebook_temp=before - {made.name}) as writes:
            (made / "a.txt").write_text("scratch: written for real")
            assert writes.written == []
        with writes_kept_apart(notebook_temp=before) as writes:
            (made / "b.txt").write_text("the notebook's: kept apart")
            assert writes.written == [str(made / "b.txt")]
        assert sorted(p.name for p in made.iterdir()) == ["a.txt"]
    finally:
        shutil.rmtree(made)


def test_the_tempfile_listing_kept_between_cells_follows_the_folder(tmp_path, monkeypatch):
    # The listing is kept while the folder's modification time stays; a folder made or removed
    # after it (by a plain cell, another program) is in the next listing.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = pathlib.Path(tempfile.mkdtemp())
    settled = time.time() - 10
    os.utime(tmp_path, (settled, settled))
    assert tempfile_names() == {first.name}
    assert tempfile_names() == {first.name}  # the kept listing
    second = pathlib.Path(tempfile.mkdtemp())
    assert tempfile_names() == {first.name, second.name}
    os.utime(tmp_path, (settled + 1, settled + 1))
    assert tempfile_names() == {first.name, second.name}
    first.rmdir()
    assert tempfile_names() == {second.name}


def test_os_open_writes_are_kept_apart_too(folder):
    # An atomic save through mkstemp(dir=folder) wrote the run's checkpoint into the folder for real
    # (os.open), and the rename into place left it there, the target's storages, never removed.
    (folder / "old.txt").write_text("the notebook's")
    with writes_kept_apart() as writes:
        handle, part = tempfile.mkstemp(dir=folder, suffix=".part")
        with os.fdopen(handle, "wb") as out:
            torch.save({"w": torch.ones(2)}, out)
        os.replace(part, folder / "ckpt.pt")
        assert torch.load(folder / "ckpt.pt")["w"].tolist() == [1.0, 1.0]
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".log") as named:
            named.write("gone on close")  # tempfile's own unlink, bound before any run
        handle, stray = tempfile.mkstemp(dir=folder)
        os.close(handle)
        os.remove(stray)  # the run's own file: removed for real
        (folder / "touched").touch()
        fd = os.open(folder / "old.txt", os.O_WRONLY)  # overwrites in place, no truncation
        os.write(fd, b"THE")
        os.close(fd)
        assert (folder / "old.txt").read_text() == "THE notebook's"
        assert sorted(os.path.basename(p) for p in writes.written) == [
            "ckpt.pt", "old.txt", "touched",
        ]  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["old.txt"]
    assert (folder / "old.txt").read_text() == "the notebook's"


def test_os_open_of_the_temporary_folder_and_of_a_file_to_truncate(folder):
    # TemporaryFile opens the temporary folder itself (O_TMPFILE): it was taken for a notebook's
    # file, hidden from the run, and tempfile turned O_TMPFILE off for the whole process.
    (folder / "old.txt").write_text("the notebook's")
    with writes_kept_apart() as writes:
        with tempfile.TemporaryFile() as unnamed:
            unnamed.write(b"x")
        assert os.path.isdir(tempfile.gettempdir())
        fd = os.open(folder / "old.txt", os.O_WRONLY | os.O_TRUNC)  # no O_CREAT: it exists
        os.write(fd, b"new")
        os.close(fd)
        assert (folder / "old.txt").read_text() == "new"
        assert writes.written == [str(folder / "old.txt")]
    assert (folder / "old.txt").read_text() == "the notebook's"
    assert getattr(tempfile, "_O_TMPFILE_WORKS", True)


def test_what_the_run_made_and_removed_leaves_nothing_behind(folder):
    # Folders and files the run made for itself: only hidden when it removed them, they stayed
    # behind after every cell (an empty tmp... folder per TemporaryDirectory(dir=...)).
    with writes_kept_apart() as writes:
        with tempfile.TemporaryDirectory(dir=folder) as own:
            torch.save(torch.ones(1), os.path.join(own, "x.pt"))
        os.makedirs(folder / "out" / "sub")
        (folder / "out" / "sub" / "log.txt").write_text("mine")
        shutil.rmtree(folder / "out")
        os.makedirs(folder / "e1")
        os.rmdir(folder / "e1")
        scratch = tempfile.TemporaryDirectory(prefix="ckpt_")  # in /tmp, not a tmp... name
        scratch.cleanup()
        assert not os.path.exists(scratch.name)
        # an atomic save by path: mkstemp's file closed, then saved to and renamed into place
        handle, part = tempfile.mkstemp(dir=folder, suffix=".part")
        os.close(handle)
        torch.save({"w": torch.ones(2)}, part)
        os.replace(part, folder / "ckpt.pt")
        kept = tempfile.NamedTemporaryFile(dir=folder, delete=False)  # noqa: SIM115
        kept.write(b"the run's")
        kept.close()
        assert os.path.exists(kept.name)
        assert sorted(os.path.basename(p) for p in writes.written) == ["ckpt.pt"]
    assert list(folder.iterdir()) == []


def test_folder_listings_show_the_runs_own_files_and_hide_what_it_removed(folder):
    # save_pretrained wrote config.json through open() (kept apart) and the weights below Python
    # (for real): the run's os.listdir missed the config it had just written, and compare FAILed.
    (folder / "old.txt").write_text("the notebook's")
    (folder / "gone.txt").write_text("stays")
    (folder / "sub").mkdir()
    (folder / "sub" / "deep.txt").write_text("the notebook's")
    with writes_kept_apart():
        torch.save({"a": 1}, folder / "w.pt")
        (folder / "notes.txt").write_text("x")
        (folder / "old.txt").write_text("the run's")  # over a real file: listed once, its copy
        os.remove(folder / "gone.txt")
        (folder / "sub" / "mine.txt").write_text("mine")
        os.makedirs(folder / "made")
        seen = ["made", "notes.txt", "old.txt", "sub", "w.pt"]
        assert sorted(os.listdir(folder)) == sorted(os.listdir(str(folder))) == seen
        assert sorted(p.name for p in folder.iterdir()) == seen
        rel = os.path.relpath(folder)
        with os.scandir(rel) as it:
            entries = {e.name: e for e in it}
        assert sorted(entries) == seen
        notes = entries["notes.txt"]
        assert notes.is_file() and not notes.is_dir() and not notes.is_symlink()
        assert notes.path == os.fspath(notes) == os.path.join(rel, "notes.txt")
        assert notes.stat().st_size == 1 and notes.inode() == notes.stat().st_ino
        assert entries["old.txt"].stat().st_size == len("the run's")
        assert entries["sub"].is_dir() and entries["made"].is_dir()
        texts = glob.glob(os.path.join(folder, "*.txt"))
        assert sorted(os.path.basename(p) for p in texts) == ["notes.txt", "old.txt"]
        assert [p.name for p in folder.glob("*.pt")] == ["w.pt"]
        assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.txt")) == [
            "notes.txt", "old.txt", "sub/deep.txt", "sub/mine.txt",
        ]  # fmt: skip
        walked = {
            os.path.relpath(root, folder): sorted(files) for root, _, files in os.walk(folder)
        }
        assert walked == {
            ".": ["notes.txt", "old.txt", "w.pt"], "made": [], "sub": ["deep.txt", "mine.txt"],
        }  # fmt: skip
        shutil.rmtree(folder / "sub")
        assert sorted(os.listdir(folder)) == ["made", "notes.txt", "old.txt", "w.pt"]
        with pytest.raises(FileNotFoundError):
            os.listdir(folder / "sub")
        with pytest.raises(FileNotFoundError):
            os.scandir(folder / "sub")
        os.makedirs(folder / "sub")  # there again, empty
        assert os.listdir(folder / "sub") == [] and list(os.scandir(folder / "sub")) == []
        # bytes paths and fds: the real folder, as it is
        assert sorted(os.listdir(os.fsencode(folder))) == [b"gone.txt", b"made", b"old.txt", b"sub"]
        fd = os.open(folder, os.O_RDONLY)
        try:
            assert sorted(os.listdir(fd)) == ["gone.txt", "made", "old.txt", "sub"]
        finally:
            os.close(fd)
    # outside the run: the disk, which the run did not write to (a folder it made stays)
    assert sorted(os.listdir(folder)) == ["gone.txt", "made", "old.txt", "sub"]
    assert sorted(e.name for e in os.scandir(folder / "sub")) == ["deep.txt"]


def test_the_names_tempfile_draws_in_a_run_are_noted_in_order():
    with tempfile_names_drawn() as drawn:
        first = tempfile.mkdtemp()
        with tempfile.TemporaryDirectory(prefix="ckpt-") as second:
            pass
        fd, third = tempfile.mkstemp(suffix=".pt")
    os.close(fd)
    os.remove(third)
    os.rmdir(first)
    assert len(drawn) == 3
    assert os.path.basename(first) == f"tmp{drawn[0]}"
    assert os.path.basename(second) == f"ckpt-{drawn[1]}"
    assert os.path.basename(third) == f"tmp{drawn[2]}.pt"
    assert tempfile._get_candidate_names() is tempfile._name_sequence  # put back
    with tempfile_names_drawn(limit=1) as kept:
        for _ in range(3):
            os.rmdir(tempfile.mkdtemp())
    assert len(kept) == 1
