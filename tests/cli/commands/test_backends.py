import json

from neuron_workbench.cli.main import main


def test_backends_text(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["cpu", "cuda", "neuron", "tpu"]


def test_backends_json(capsys):
    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {"name": "cpu", "available": True, "emulated": False, "reason": ""}


def test_unknown_subcommand_is_exit_2(capsys):
    try:
        main(["frobnicate"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "invalid choice" in capsys.readouterr().err
