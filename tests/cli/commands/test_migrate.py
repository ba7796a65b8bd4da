"""`neuron-workbench migrate`: diff, --write, --check, idempotence."""

from neuron_workbench.cli.main import main

SOURCE = "import torch\n# set up\nm = Net().cuda()  # move\ntorch.cuda.synchronize()\n"


def test_prints_diff_without_writing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    assert main(["migrate", str(path)]) == 0
    out = capsys.readouterr().out
    assert '+m = Net().to("neuron")  # move' in out and "+torch.neuron.synchronize()" in out
    assert "2 rewritten, 1 file(s) would change" in out
    assert path.read_text() == SOURCE


def test_write_then_no_changes(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    assert main(["migrate", str(path), "--write"]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    assert path.read_text() == SOURCE.replace(".cuda()", '.to("neuron")').replace(
        "torch.cuda.", "torch.neuron."
    )
    assert main(["migrate", str(path), "--write"]) == 0
    assert f"{path}: no changes" in capsys.readouterr().out


def test_check_mode_for_ci(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    assert main(["migrate", str(path), "--check"]) == 1
    assert path.read_text() == SOURCE
    main(["migrate", str(path), "--write"])
    assert main(["migrate", str(path), "--check"]) == 0


def test_directory_and_tpu_target(tmp_path, capsys):
    (tmp_path / "a.py").write_text("x = t.cuda()\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    assert main(["migrate", str(tmp_path), "--target", "tpu"]) == 0
    out = capsys.readouterr().out
    assert '+x = t.to("tpu")' in out and "b.py: no changes" in out


def test_missing_file_is_exit_2(tmp_path, capsys):
    assert main(["migrate", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_write_keeps_the_files_own_encoding(tmp_path, capsys):
    # migrate --write wrote UTF-8 whatever the file declared: under its latin-1 coding line the
    # 'é' then read as 'Ã©'; and a file saved with a byte order mark was not read at all
    latin = tmp_path / "latin.py"
    latin.write_bytes(
        ("# -*- coding: latin-1 -*-\nname = 'caf\u00e9'\n" + SOURCE).encode("latin-1")
    )
    bom = tmp_path / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + SOURCE.encode())
    assert main(["migrate", str(latin), str(bom), "--write"]) == 0
    assert capsys.readouterr().err == ""
    migrated = SOURCE.replace(".cuda()", '.to("neuron")').replace("torch.cuda.", "torch.neuron.")
    assert latin.read_bytes() == (
        "# -*- coding: latin-1 -*-\nname = 'caf\u00e9'\n" + migrated
    ).encode("latin-1")
    assert bom.read_bytes() == b"\xef\xbb\xbf" + migrated.encode()
