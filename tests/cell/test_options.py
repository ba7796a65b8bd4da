"""The option table: every front end takes every option the table gives it, spelled alike."""

import dataclasses

import pytest

from neuron_workbench.cell.options import (
    CELL_GROUP,
    COMPARE,
    COMPARE_GROUP,
    MAGIC,
    OPTION,
    OPTIONS,
    RECORD,
    RUN,
    TRAIT,
)
from neuron_workbench.cell.settings import CellOptions, CompareOptions, cell_options
from neuron_workbench.cli.main import build_parser
from neuron_workbench.errors import OptionError
from neuron_workbench.magics.neuron import NeuronMagics

#: Settings of the dataclasses that no flag sets (artifact paths, placement, editor lines).
NOT_FLAGS = {
    "compare",
    "record",
    "against",
    "extra_targets",
    "source_first_line",
    "cluster_options",
}
#: A subcommand's own setting spelled as a table flag: ``run --timeout`` limits each cell.
OWN_FLAGS = {RUN: {"--timeout"}}


def _subcommand_flags(name: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices[name]._option_string_actions)


def _front_end_flags() -> dict[str, set[str]]:
    magic = set(NeuronMagics.neuron.parser._option_string_actions)
    return {
        MAGIC: magic,
        RUN: _subcommand_flags("run"),
        RECORD: _subcommand_flags("record"),
        COMPARE: _subcommand_flags("compare"),
    }


@pytest.mark.parametrize("front", [MAGIC, RUN, RECORD, COMPARE])
def test_every_front_end_has_exactly_the_options_the_table_gives_it(front):
    flags = _front_end_flags()[front] - OWN_FLAGS.get(front, set())
    for option in OPTIONS:
        assert (option.flag in flags) == (front in option.fronts), (option.name, front)


def test_every_session_setting_is_a_trait_of_the_magic():
    traits = NeuronMagics.class_traits(config=True)
    for option in OPTIONS:
        assert (option.name in traits) == (TRAIT in option.fronts), option.name


def test_the_dataclasses_have_one_field_per_table_option():
    compare = {f.name for f in dataclasses.fields(CompareOptions)}
    cell = {f.name for f in dataclasses.fields(CellOptions)}
    assert compare == {o.name for o in OPTIONS if o.group == COMPARE_GROUP}
    assert cell - NOT_FLAGS == {o.name for o in OPTIONS if o.group == CELL_GROUP}


def test_choices_are_the_ones_the_core_accepts():
    from neuron_workbench.compare.budget import JUDGES
    from neuron_workbench.compare.tolerances import PRESETS
    from neuron_workbench.run.cuda_on_host import REF_PRECISIONS

    assert OPTION["preset"].choices == tuple(PRESETS)
    assert OPTION["judge"].choices == tuple(JUDGES)
    assert OPTION["ref_precision"].choices == tuple(REF_PRECISIONS)


def test_cell_options_from_values():
    options = cell_options(
        {
            "ref": "cpu",
            "target": "neuron, tpu",
            "layers_full": ["h.0"],
            "allow_fallback": ["aten::sort,topk", "nonzero"],
            "per_output": ["loss=1e-3,1e-4"],
        }
    )
    assert options.targets == ("neuron", "tpu")
    assert options.compare.layers is True  # a module kept whole needs the layer statistics
    assert options.allow_fallback == ("aten::sort", "topk", "nonzero")
    assert options.compare.policy().per_output[0][0] == "loss"
    assert options.compare.to_dict()["tolerance"]["per_output"]


def test_environment_defaults(monkeypatch):
    monkeypatch.setenv("NEURON_WORKBENCH_TARGET", "tpu")
    monkeypatch.setenv("NEURON_WORKBENCH_EXECUTOR", "bogus")  # not a choice: the table's default
    options = cell_options({"ref": "cpu"})
    assert options.compare.target == "tpu" and options.executor == "auto"


def test_bad_values_are_option_errors_spelled_as_flags():
    from neuron_workbench.magics.flags import usage_message

    with pytest.raises(OptionError) as info:
        cell_options({"ref": "cpu", "target": " , "})
    assert usage_message(info.value) == "--target needs a backend name"
    with pytest.raises(OptionError) as info:
        cell_options({"ref": "cpu", "allow_fallback": ["sort"], "scan": False}).validate()
        cell_options({"ref": "cpu", "steps": 0}).validate()
    assert usage_message(info.value) == "--steps must be at least 1"


def test_every_compare_option_set_reaches_the_report_and_back():
    # a value other than the default for each: the report's options record it, and a recording's
    # options rebuild the same settings (neuron-workbench compare judges with them)
    changed = {"ref": "cpu", "target": "tpu", "rtol": 1e-3, "atol": 1e-4,
               "per_output": ("loss=1e-2,1e-3",), "layers_full": ("h.0",),
               "what_if": "bf16-matmul", "max_steps": 5}  # fmt: skip
    for option in OPTIONS:
        if option.group != COMPARE_GROUP or option.name in changed:
            continue
        if option.kind == "bool":
            changed[option.name] = not option.default
        elif option.kind == "choice":
            changed[option.name] = next(c for c in option.choices if c != option.default)
        elif option.kind == "int":
            changed[option.name] = (option.default or 0) + 2
    options = CompareOptions(**changed)
    assert {f.name for f in dataclasses.fields(CompareOptions)} <= set(changed)
    data = options.to_dict()
    again = CompareOptions.from_dict(data)
    assert again == dataclasses.replace(options, per_output=("loss=0.01,0.001",))
