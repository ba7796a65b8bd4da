"""compare/flatten.py: the leaves of containers and objects a cell changes in place."""

import argparse
import collections
import types
import warnings

import torch

from neuron_workbench.compare.flatten import iter_leaves


class _Cached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)
        self.kv = torch.zeros(2)  # a plain attribute: state the forward keeps
        self.history = [torch.ones(1)]
        self.width = 2  # a setting: no tensor, not an output
        self.unused = None


def test_deques_and_namespaces_are_walked_by_index_and_attribute():
    t = torch.ones(1)
    leaves = dict(
        iter_leaves(
            {
                "dq": collections.deque([t, 2.0]),
                "ns": types.SimpleNamespace(v=t),
                "args": argparse.Namespace(lr=0.1),
            }
        )
    )
    assert list(leaves) == ["dq[0]", "dq[1]", "ns.v", "args.lr"]
    assert leaves["dq[0]"] is t and leaves["ns.v"] is t


def test_a_dataframe_is_walked_by_column_and_a_series_as_one():
    # A metrics table the cell bound was left out of the comparison: a PASS over the other outputs
    # hid a column that differed (found by trying the default path as a user)
    import pandas as pd

    frame = pd.DataFrame({"loss": [0.5, 0.25], "step": [1, 2], "tag": ["a", "b"]})
    leaves = dict(iter_leaves({"df": frame, "s": frame["loss"], "top": frame.iloc[[1]]}))
    assert list(leaves) == [
        "df['loss']",
        "df['step']",
        "df['tag']",
        "s",
        "top['loss']",
        "top['step']",
        "top['tag']",
        "top.index",
    ]
    assert leaves["df['loss']"].tolist() == [0.5, 0.25]
    assert leaves["df['tag']"] == "a\nb"  # one output for a text column, not one per row
    assert leaves["top.index"].tolist() == [1]  # a row picked by the values: its index is a result


def test_every_column_of_a_dataframe_is_a_leaf_of_its_own_whatever_its_kind():
    # (after review) columns whose labels repeat overwrote each other's path, so one was never
    # compared; times and nullable numbers were no leaf at all
    import pandas as pd

    frame = pd.DataFrame(
        {
            "v": [1, 2],
            "w": [3, 4],
            "when": pd.to_datetime([1, 2], unit="s").as_unit("us"),
            "count": pd.array([1, None], dtype="Int64"),
        }
    ).rename(columns={"w": "v"})
    leaves = dict(iter_leaves({"df": frame}))
    assert list(leaves) == [f"df.iloc[:, {i}]" for i in range(4)]
    assert [leaves[f"df.iloc[:, {i}]"].tolist()[0] for i in range(3)] == [1, 3, 1_000_000]
    assert str(leaves["df.iloc[:, 3]"].tolist()) == "[1.0, nan]"


def test_tensors_a_module_holds_as_attributes_are_leaves_after_its_parameters():
    model = torch.nn.Sequential(_Cached())
    model[0].inner.extra = torch.full((3,), 7.0)
    paths = [path for path, _ in iter_leaves({"m": model})]
    assert paths == [
        "m.0.inner.weight",
        "m.0.inner.bias",
        "m.0.kv",
        "m.0.history[0]",
        "m.0.inner.extra",
    ]


def test_a_library_model_has_only_its_parameters_and_buffers():
    model = torch.nn.BatchNorm1d(3)
    paths = [path for path, _ in iter_leaves({"bn": model})]
    assert paths == [
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]


class _Layer:
    """A library's cache layer (this module is no notebook): its tensors and settings."""

    def __init__(self, keys):
        self.keys, self.values = keys, keys * 2
        self.device, self.is_initialized = keys.device, True


class _Cache:
    def __init__(self, *keys):
        self.layers = [_Layer(k) for k in keys]
        self.offloading = False


def test_a_librarys_objects_are_compared_by_the_attributes_that_hold_tensors():
    # They were passed over: a cell binding a dataset, a distribution or a KV cache compared
    # nothing (UNCOMPARED, 0 outputs) and said nothing of why
    dataset = torch.utils.data.TensorDataset(torch.ones(3, 2), torch.zeros(3))
    dist = torch.distributions.Normal(torch.zeros(2), torch.ones(2))
    outputs = {
        "ds": dataset,
        "dist": dist,
        "cache": _Cache(torch.ones(2)),
        "loader": torch.utils.data.DataLoader(dataset, batch_size=2),
        "parser": argparse.ArgumentParser(),  # no tensor: no output, as before
    }
    leaves = dict(iter_leaves(outputs))
    assert list(leaves) == [
        "ds.tensors[0]",
        "ds.tensors[1]",
        "dist.loc",
        "dist.scale",
        "cache.layers[0].keys",
        "cache.layers[0].values",
        "loader.dataset.tensors[0]",
        "loader.dataset.tensors[1]",
    ]
    assert leaves["dist.loc"] is dist.loc and leaves["ds.tensors[1]"] is dataset.tensors[1]


def test_a_modules_own_parameters_held_again_are_not_leaves_twice_and_nested_caches_are():
    lstm = torch.nn.LSTM(2, 3)
    paths = [path for path, _ in iter_leaves({"lstm": lstm})]
    assert not any("_flat_weights" in p for p in paths) and len(paths) == len(set(paths)) == 4
    model = torch.nn.Linear(2, 2)
    model.past = [(torch.ones(1), torch.zeros(1))]  # the legacy KV-cache format
    paths = [path for path, _ in iter_leaves({"m": model})]
    assert paths[-2:] == ["m.past[0][0]", "m.past[0][1]"]


class _Tied(torch.nn.Module):
    """Shared submodules and parameters, a missing bias, and a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's lm_head
        shared = torch.nn.Linear(3, 3)
        self.blocks = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
        self.register_buffer("scale", torch.ones(1), persistent=False)
        self.register_buffer("unset", None)
        self.norm = torch.nn.BatchNorm1d(3)


class _OwnParameters(torch.nn.Linear):
    """A class with its own idea of its parameters: its own method is used."""

    def named_parameters(self, *args, **kwargs):
        return iter([("only", self.weight)])


def _names_and_ids(pairs):
    return [(name, id(value)) for name, value in pairs]


def test_one_walk_of_the_module_tree_gives_what_torchs_three_walks_give():
    from neuron_workbench.compare.flatten import _module_tree

    for model in (
        _Tied(),
        torch.nn.LSTM(2, 3),
        torch.nn.Sequential(_Tied(), _Tied()),
        _OwnParameters(2, 2),
    ):
        submodules, parameters, buffers = _module_tree(model)
        assert _names_and_ids(submodules) == _names_and_ids(model.named_modules())
        assert _names_and_ids(parameters) == _names_and_ids(model.named_parameters())
        assert _names_and_ids(buffers) == _names_and_ids(model.named_buffers())
    assert [name for name, _ in _module_tree(_OwnParameters(2, 2))[1]] == ["only"]
    # a module given its own named_parameters (an instance attribute) is asked too
    patched = torch.nn.Linear(2, 2)
    patched.named_parameters = lambda *args, **kwargs: iter([("only", patched.weight)])
    assert [name for name, _ in _module_tree(patched)[1]] == ["only"]


def test_the_attributes_looked_into_are_every_attribute_that_holds_a_tensor():
    from neuron_workbench.compare.flatten import _state_attributes
    from neuron_workbench.run.namespace import module_attributes, tensors_held

    model = _Cached()
    model.cache = {"k": torch.ones(1)}
    model.pair = (torch.ones(1), 2)
    model.queue = collections.deque([torch.ones(1)])
    model.settings = types.SimpleNamespace(t=torch.ones(1))  # not looked into, as before
    model.label = "x"
    model.tags = {torch.ones(1)}  # a set: not looked into
    model.nothing = []

    def holding(attributes):
        return [(key, id(item)) for key, item in attributes if list(tensors_held(item))]

    assert holding(_state_attributes(model)) == holding(module_attributes(model))
    assert [key for key, _ in holding(_state_attributes(model))] == [
        "kv",
        "history",
        "cache",
        "pair",
        "queue",
    ]


def test_a_parameter_that_is_no_leaf_any_more_is_read_without_a_warning():
    # `layer.bias.add_(y)` with y requiring grad makes the parameter a non-leaf; reading its .grad
    # made torch warn inside the user's cell
    layer = torch.nn.Linear(2, 2)
    layer.bias.requires_grad_(False)
    layer.bias.add_(torch.ones(2, requires_grad=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        leaves = dict(iter_leaves({"layer": layer}))
    assert list(leaves) == ["layer.weight", "layer.bias"]


def test_a_librarys_private_tensors_are_its_bookkeeping_not_outputs():
    # a GradScaler's _scale (unset on a device whose scaler is off) made the grad_scaler idiom
    # FAIL with "scaler._scale missing on the target" once library objects were compared
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    assert scaler._scale is not None
    assert list(iter_leaves({"scaler": scaler})) == []


def test_none_is_a_leaf_only_where_the_cell_bound_it_to_a_name():
    # A transformers model output without labels or attentions read "6 outputs, 6 match" for one
    # tensor of logits: its five unset fields counted as matched outputs
    import dataclasses

    @dataclasses.dataclass
    class Output:
        loss: torch.Tensor | None = None
        logits: torch.Tensor | None = None
        attentions: tuple | None = None

    logits = torch.ones(2)
    leaves = dict(
        iter_leaves(
            {
                "best": None,
                "out": Output(logits=logits),
                "metrics": {"val": None, "acc": 0.5},
                "steps": [None, 1],
            }
        )
    )
    assert list(leaves) == ["best", "out.logits", "metrics['acc']", "steps[1]"]
    assert leaves["best"] is None and leaves["out.logits"] is logits


def test_a_set_is_one_leaf_of_its_items_in_order_and_a_set_of_objects_is_not_compared():
    # a set was no leaf at all: a cell binding one read UNCOMPARED, "0 outputs compared"
    from neuron_workbench.run.records import NotCompared

    leaves = dict(
        iter_leaves(
            {
                "ids": {3, 1, 2},
                "words": frozenset({"b", "a"}),
                "mixed": {2, "x", (1, None), 0.5},
                "empty": set(),
                "tensors": {torch.ones(1)},
            }
        )
    )
    assert leaves["ids"] == "{1, 2, 3}" and leaves["words"] == "{'a', 'b'}"
    assert leaves["mixed"] == "{0.5, 2, 'x', (1, None)}" and leaves["empty"] == "set()"
    assert isinstance(leaves["tensors"], NotCompared)


def test_outputs_flattened_ahead_give_the_leaves_of_the_outputs_as_they_are_now():
    # The reference's outputs are flattened while the target runs; by the comparison the output
    # names may be completed (a name only the other run bound) or rebound to another object.
    from neuron_workbench.compare.flatten import FlattenedOutputs

    model = torch.nn.Linear(2, 2)
    outputs = {"model": model, "stats": {"loss": 1.5}, "x": torch.ones(2)}
    flattened = FlattenedOutputs(outputs)
    assert list(flattened.leaves(outputs)) == list(iter_leaves(outputs))
    later = {"model": model, "stats": {"loss": 2.5}, "x": outputs["x"], "y": torch.zeros(1)}
    leaves = list(flattened.leaves(later))
    assert leaves == list(iter_leaves(later))
    assert [path for path, _ in leaves] == [
        "model.weight",
        "model.bias",
        "stats['loss']",
        "x",
        "y",
    ]
    assert dict(leaves)["stats['loss']"] == 2.5  # another object bound to the name: walked again


def test_a_lazy_modules_parameters_before_its_first_call_are_no_leaves():
    # they have no value yet (reading one raises): both runs' moved lazy model is nothing to compare
    net = torch.nn.Sequential(
        torch.nn.Linear(2, 3), torch.nn.LazyLinear(2), torch.nn.LazyBatchNorm1d()
    )
    paths = [path for path, _ in iter_leaves({"net": net, "w": net[1].weight})]
    assert paths == ["net.0.weight", "net.0.bias", "net.2.num_batches_tracked"]
