"""The worker transport: one pickle, tensors by storage, arenas on shared memory, lenient loading."""

import contextvars
import enum
import gc
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import weakref

import pytest
import torch

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.target_requests import pack_request
from neuron_workbench.run.transport import (
    COMPILE_REQUEST_ATTR,
    Unloadable,
    device_module_equivalent,
    dumps,
    loads,
    loads_leniently,
    remember_compile_requests,
    unloadable_in,
)
from neuron_workbench.worker_launch import arena_folder

ARENAS = ["in-band", "shared memory", "own folder"] if arena_folder() else ["in-band", "own folder"]


@pytest.fixture(params=ARENAS)
def arena(request, tmp_path):
    """Where the storages go: in the message, to shared memory, or to a folder of a worker's own.

    In a folder of its own a loaded arena is kept for the next message.
    """
    if request.param == "in-band":
        return None
    if request.param == "shared memory":
        return arena_folder()
    folder = tempfile.mkdtemp(prefix="neuron-workbench-test-", dir=arena_folder() or tmp_path)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


def test_views_share_their_base_after_the_trip(arena):
    x = torch.arange(8.0)
    sent = {"x": x, "head": x[:3], "strided": x[1::2], "t": x.view(2, 4).t()}
    back = loads(dumps(sent, arena))
    back["head"].add_(100)
    back["strided"].mul_(-1)
    assert back["x"].tolist() == [100.0, -101.0, 102.0, -3.0, 4.0, -5.0, 6.0, -7.0]
    assert torch.equal(back["t"], back["x"].view(2, 4).t())
    assert back["t"].stride() == x.view(2, 4).t().stride()
    # the sender's tensors are untouched: the receiver has its own memory
    assert x.tolist() == list(map(float, range(8)))


def test_a_model_its_optimizer_and_tied_weights_arrive_connected(arena):
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    model(torch.arange(5)).sum().backward()
    opt = torch.optim.Adam(model.parameters())
    opt.step()
    back_model, back_opt = loads(dumps((model, opt), arena))
    assert back_model[0].weight is back_model[1].weight
    assert isinstance(back_model[0].weight, torch.nn.Parameter)
    assert back_opt.param_groups[0]["params"][0] is back_model[0].weight
    state = back_opt.state[back_model[0].weight]
    assert torch.equal(state["exp_avg"], opt.state[emb.weight]["exp_avg"])
    assert torch.equal(back_model[0].weight.grad, emb.weight.grad)


def test_parametrized_modules_arrive_parametrized_with_their_optimizer(arena):
    # torch.nn.utils.parametrize refuses pickling ("only supported through state_dict()")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3)),
        torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(3, 2)),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    back_net, back_opt = loads(dumps((net, opt), arena))
    assert torch.nn.utils.parametrize.is_parametrized(back_net[0], "weight")
    assert type(back_net[0]).__name__ == "ParametrizedLinear"
    assert type(back_net[0]) is not type(net[0])  # a class of its own, as parametrize makes
    assert torch.equal(back_net(x), net(x))
    originals = [p for p in back_net.parameters()]
    assert back_opt.param_groups[0]["params"] == originals
    assert all(a is b for a, b in zip(back_opt.param_groups[0]["params"], originals, strict=True))
    back_net(x).sum().backward()
    back_opt.step()  # the arrived copy trains on its own
    assert not torch.equal(back_net[0].weight, net[0].weight)


class _Locked(torch.nn.Linear):
    """A module class of the user's that drops its lock when pickled."""

    def __init__(self):
        super().__init__(3, 2)
        self.lock = __import__("threading").Lock()

    def __getstate__(self):
        return {k: v for k, v in super().__getstate__().items() if k != "lock"}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.lock = __import__("threading").Lock()


def test_a_parametrized_module_keeps_its_own_state_rules():
    module = torch.nn.utils.parametrizations.weight_norm(_Locked())
    back = loads(dumps(module))
    assert type(back).__name__ == "Parametrized_Locked"
    assert back.lock is not module.lock and not back.lock.locked()
    x = torch.randn(4, 3)
    assert torch.equal(back(x), module(x))


def test_a_function_using_cudnn_flags_travels():
    # torch.backends.cudnn is an instance of a module subclass ("cannot pickle 'CudnnModule'")
    namespace = {"torch": torch}
    exec(
        "def seed_everything(seed):\n"
        "    torch.manual_seed(seed)\n"
        "    torch.backends.cudnn.deterministic = True\n"
        "    return torch.backends.cudnn",
        namespace,
    )
    back = loads(dumps(namespace["seed_everything"]))
    assert back(0) is torch.backends.cudnn


def test_a_c_extensions_submodule_travels_by_the_path_to_it():
    # torch._C._functions is no entry of sys.modules: cloudpickle sent it by value, which cannot be
    # rebuilt, so no custom Function with a once_differentiable backward came back from a worker
    assert "torch._C._functions" not in sys.modules
    assert loads(dumps(torch._C._functions)) is torch._C._functions
    backward = torch.autograd.function.once_differentiable(lambda ctx, g: g * 2)
    assert torch.equal(loads(dumps(backward))(None, torch.ones(2)), torch.full((2,), 2.0))
    # a module made in the notebook, found by no path, still travels by value
    made = type(sys)("made_here")
    made.answer = 42
    assert loads(dumps(made)).answer == 42


def test_the_devices_standing_for_cuda_travel_as_cuda_and_no_other():
    stand_in, other = torch.device("cpu"), torch.device("cpu")
    back = loads(dumps({"cfg": {"device": stand_in}, "data": other}, cuda_devices={id(stand_in)}))
    assert back == {"cfg": {"device": torch.device("cuda")}, "data": torch.device("cpu")}


def test_a_cached_notebook_function_travels_as_its_function():
    namespace = {"__name__": "__main__"}
    exec(
        "import functools\n"
        "@functools.lru_cache(maxsize=8, typed=True)\n"
        "def fib(n):\n"
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)",
        namespace,
    )
    back = loads(dumps(namespace["fib"]))
    assert back(20) == 6765
    assert back.cache_parameters() == {"maxsize": 8, "typed": True}
    assert back.cache_info().hits > 0  # its recursion goes through the new cache


def test_compiled_functions_and_modules_travel_as_their_original_compiled_again(arena, monkeypatch):
    monkeypatch.setattr(torch, "compile", torch.compile)  # as it was, after the test
    remember_compile_requests()
    namespace = {"__name__": "__main__"}
    exec("def double(t):\n    return t * 2", namespace)
    compiled = torch.compile(namespace["double"], backend="eager")
    model = torch.nn.Linear(2, 2)
    compiled_model = torch.compile(model, mode="max-autotune-no-cudagraphs")
    assert COMPILE_REQUEST_ATTR not in vars(model)  # the original module is left as it was
    back = loads(dumps({"f": compiled, "m": compiled_model, "model": model}, arena))
    assert getattr(back["f"], COMPILE_REQUEST_ATTR) == {"backend": "eager"}
    assert (
        back["f"]._torchdynamo_orig_callable.__code__.co_code
        == namespace["double"].__code__.co_code
    )
    assert back["f"](torch.ones(2)).tolist() == [2.0, 2.0]
    assert type(back["m"]) is type(compiled_model)
    assert back["m"]._orig_mod is back["model"]
    assert getattr(back["m"], COMPILE_REQUEST_ATTR) == {"mode": "max-autotune-no-cudagraphs"}


def test_a_module_compiled_in_place_travels_compiled_again_with_its_request(arena, monkeypatch):
    # Module.__getstate__ drops what model.compile() set: the receiver had an eager model
    monkeypatch.setattr(torch, "compile", torch.compile)  # as it was, after the test
    remember_compile_requests()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.compile(backend="eager", dynamic=False)
    sent = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    back = loads(dumps(sent, arena))
    compiled = vars(back["model"])["_compiled_call_impl"]
    assert compiled is not None and compiled is not vars(model)["_compiled_call_impl"]
    assert getattr(compiled, COMPILE_REQUEST_ATTR) == {"backend": "eager", "dynamic": False}
    # the module's state arrived whole: its optimizer still holds its parameters
    assert back["optimizer"].param_groups[0]["params"][0] is back["model"][0].weight
    assert torch.equal(back["model"](torch.ones(1, 2)), model(torch.ones(1, 2)))


def test_a_parameters_hooks_travel_and_one_that_cannot_says_so(arena):
    import threading

    class Locked:
        def __init__(self):
            self.lock = threading.Lock()

        def hook(self, grad):
            return grad

    lin = torch.nn.Linear(2, 1)
    lin.weight.register_hook(lambda g: g * 0)
    back = loads(dumps({"lin": lin}, arena))["lin"]
    back(torch.ones(1, 2)).sum().backward()
    assert torch.count_nonzero(back.weight.grad) == 0
    assert back.bias.grad.item() == 1.0
    # one that cannot travel is not dropped on one side only: the value cannot be sent
    lin.bias.register_hook(Locked().hook)
    with pytest.raises(WorkbenchUsageError, match="'lin'.*cannot be sent.*lock"):
        pack_request({}, {"lin": lin}, {"__name__": "__main__"}, "neuron", arena)


def test_a_module_compiled_in_place_before_the_extension_says_what_to_do(monkeypatch):
    # torch's own compile (an earlier test's %load_ext may have wrapped it): no request remembered
    monkeypatch.setattr(torch, "compile", getattr(torch.compile, "__wrapped__", torch.compile))
    model = torch.nn.Linear(2, 2)
    model.compile(backend="eager")
    remember_compile_requests()
    with pytest.raises(
        WorkbenchUsageError, match="'layers'.*before %load_ext neuron_workbench.*run the cell"
    ):
        pack_request({}, {"layers": [model]}, {"__name__": "__main__"}, "neuron")


def test_a_function_compiled_before_the_extension_says_what_to_do(monkeypatch):
    monkeypatch.setattr(torch, "compile", torch.compile)  # as it was, after the test
    remember_compile_requests()
    unremembered = torch.compile.__wrapped__(lambda t: t + 1, backend="eager")
    with pytest.raises(
        WorkbenchUsageError, match="before %load_ext neuron_workbench.*run the cell"
    ):
        pack_request({}, {"step": unremembered}, {"__name__": "__main__"}, "neuron")


def test_a_library_class_its_module_names_otherwise_travels_with_its_members():
    # torch.nn.attention.SDPBackend is a C++ enum named _SDPBackend, a name its module lacks:
    # pickle could not find it ("attribute lookup _SDPBackend on torch.nn.attention failed"), so a
    # cell using SDPBackend.FLASH_ATTENTION could not be sent to the worker
    from torch.nn.attention import SDPBackend

    sent = {"kind": SDPBackend, "chosen": [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]}
    back = loads(dumps(sent))
    assert back["kind"] is SDPBackend
    assert back["chosen"] == [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def test_a_module_compiled_before_the_extension_says_what_to_do(monkeypatch):
    # cmodel = torch.compile(model) run before %load_ext: pickled with the host's compiler
    # callback, it reached the target and failed there (BackendCompilerFailed: backend='inductor'
    # raised: AttributeError: 'DeviceProperties' object has no attribute 'gcnArchName')
    monkeypatch.setattr(torch, "compile", torch.compile)  # as it was, after the test
    remember_compile_requests()
    unremembered = torch.compile.__wrapped__(torch.nn.Linear(2, 2))
    with pytest.raises(
        WorkbenchUsageError, match="'cmodel' was compiled .*before %load_ext.*run the cell"
    ):
        pack_request({}, {"cmodel": unremembered}, {"__name__": "__main__"}, "neuron")


def test_a_tensor_a_graph_computed_arrives_saying_so_when_backward_reaches_it(arena):
    w = torch.ones(2, requires_grad=True)
    back = loads(dumps({"loss": (w * 3).sum()}, arena))["loss"]
    assert back.is_leaf and back.requires_grad and back.item() == 6.0
    with pytest.raises(RuntimeError, match=r"an earlier cell computed \(SumBackward0\)"):
        back.backward()


def test_an_inference_tensor_arrives_as_one(arena):
    # it arrived as a normal tensor: a backward pass through it worked where a GPU raises
    with torch.inference_mode():
        feats = torch.randn(2, 3)
        weight = torch.nn.Parameter(torch.randn(2))  # rare: a normal one, as the kernel copies it
    feats.tag = "kept"
    back = loads(
        dumps({"feats": feats, "view": feats[1], "plain": torch.ones(2), "w": weight}, arena)
    )
    assert back["feats"].is_inference() and back["view"].is_inference()
    assert torch.equal(back["feats"], feats) and back["feats"].tag == "kept"
    assert not back["plain"].is_inference() and not back["w"].is_inference()
    assert back["w"].requires_grad
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        (back["feats"] * back["w"][0]).sum()


def test_lazy_conjugates_empty_and_odd_dtypes_survive(arena):
    z = torch.randn(3, dtype=torch.complex64)
    values = {
        "conj": z.conj(),
        "neg": torch.ones(2, dtype=torch.complex64).conj().imag,
        "empty": torch.empty(0, 3),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5),
        "leaf": torch.ones(2, requires_grad=True),
    }
    back = loads(dumps(values, arena))
    for name, value in values.items():
        assert torch.equal(back[name], value.resolve_conj().resolve_neg()), name
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
    assert back["leaf"].requires_grad and back["leaf"].is_leaf


def test_an_arena_is_one_file_removed_once_loaded():
    folder = arena_folder()
    if folder is None:
        pytest.skip("no shared-memory folder on this host")
    packed = dumps({"a": torch.ones(100), "b": torch.zeros(3)}, folder)
    assert packed.arena is not None and os.path.dirname(packed.arena) == folder
    assert [nbytes for _, nbytes in packed.table] == [400, 12]
    assert all(offset % 64 == 0 for offset, _ in packed.table)
    assert b"\x00\x00\x80?" * 4 not in packed.data  # the values are not in the pickle stream
    back = loads(packed)
    assert not os.path.exists(packed.arena)
    back["a"].add_(1)  # writable, copy-on-write
    assert back["a"].sum().item() == 200.0
    # nothing is kept in the host's shared-memory folder: it would outlive both processes
    del back
    gc.collect()
    assert not any(name.startswith("kept-arena") for name in os.listdir(folder))


def test_an_arena_loaded_in_a_folder_of_its_own_is_kept_once_its_tensors_are_gone(
    tmp_path, monkeypatch
):
    from neuron_workbench.run import transport

    folder = tempfile.mkdtemp(prefix="neuron-workbench-test-", dir=arena_folder() or tmp_path)
    try:
        kept = [os.path.join(folder, name) for name in ("kept-arena-0", "kept-arena-1")]
        x = torch.arange(8.0)
        first = dumps({"x": x, "head": x[:3]}, folder)
        back = loads(first)
        with pytest.raises(FileNotFoundError):
            loads(first)  # a message is loaded once, as when its file was removed
        second = dumps({"y": torch.full((4,), 7.0)}, folder)  # a file of its own: none kept
        back["head"].add_(100)  # views of one storage, writable, copy-on-write
        assert back["x"].tolist() == [100.0, 101.0, 102.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        assert x.tolist() == list(map(float, range(8)))
        assert not any(map(os.path.exists, kept))
        del back
        gc.collect()
        # its tensors gone, the first arena is kept; the next message is written into it
        assert os.path.exists(kept[0]) and not os.path.exists(kept[1])
        inode = os.stat(kept[0]).st_ino
        third = dumps({"z": torch.full((2,), 3.0)}, folder)
        assert not os.path.exists(kept[0]) and os.stat(third.arena).st_ino == inode
        assert os.path.getsize(third.arena) == 8  # cut to its own bytes
        assert loads(second)["y"].tolist() == [7.0] * 4
        assert loads(third)["z"].tolist() == [3.0] * 2
        assert loads(dumps({"w": torch.ones(1)}, folder))["w"].tolist() == [1.0]
        gc.collect()
        assert sorted(os.listdir(folder)) == ["kept-arena-0", "kept-arena-1"]  # two at most
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        # one loaded before this process forked is not kept, by either process: the other one
        # may still map it
        shared = loads(dumps({"v": torch.ones(2)}, folder))["v"]
        child = os.fork()
        if child == 0:
            del shared
            gc.collect()
            os._exit(1 if any(map(os.path.exists, kept)) else 0)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        del shared
        gc.collect()
        assert os.listdir(folder) == []
        loads(dumps({"w": torch.ones(1)}, folder))
        gc.collect()
        assert os.listdir(folder) == ["kept-arena-0"]
        # a larger arena than the setting allows (here one written into that kept file) is
        # removed once loaded, as in shared memory
        monkeypatch.setenv(transport.KEPT_ARENA_ENV, "0")
        big = loads(dumps({"w": torch.ones(4)}, folder))["w"]
        assert os.listdir(folder) == []
        assert big.tolist() == [1.0] * 4
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _kept_after_loading(folder, nbytes):
    """Whether an arena of ``nbytes`` loaded in ``folder`` is kept once its tensor is gone."""
    back = loads(dumps({"x": torch.zeros(nbytes, dtype=torch.uint8)}, folder))
    assert back["x"].numel() == nbytes
    del back
    gc.collect()
    kept = os.listdir(folder)
    for name in kept:
        os.unlink(os.path.join(folder, name))
    assert kept in ([], ["kept-arena-0"])
    return bool(kept)


class _FileSystem:
    """What ``os.statvfs`` answers for a file system of ``size`` bytes with ``free`` left."""

    def __init__(self, size, free):
        self.f_frsize = 4096
        self.f_blocks, self.f_bavail = size // 4096, free // 4096


def test_the_kept_arena_limit_is_a_share_of_memory_and_of_the_folder(monkeypatch):
    from neuron_workbench.run import transport

    monkeypatch.delenv(transport.KEPT_ARENA_ENV, raising=False)
    gib, mib = 1 << 30, 1 << 20

    def limit(memory, size, free):
        monkeypatch.setattr(transport, "_usable_memory", lambda: memory)
        monkeypatch.setattr(os, "statvfs", lambda path: _FileSystem(size, free))
        return transport.kept_arena_limit("/any")

    assert limit(64 * gib, 32 * gib, 30 * gib) == 2 * gib  # 1/32 of the memory
    assert limit(8 * gib, 32 * gib, 30 * gib) == 256 * mib  # a container's 8 GiB
    assert limit(64 * gib, 4 * gib, 4 * gib) == 512 * mib  # 1/8 of the folder's file system
    assert limit(64 * gib, 32 * gib, 1 * gib) == 256 * mib  # 1/4 of the space left there
    assert limit(64 * gib, 64 * mib, 64 * mib) == 8 * mib  # docker's /dev/shm: 8 MiB, as before
    assert limit(None, 32 * gib, 30 * gib) == 8 * mib  # memory not known
    # the setting decides instead, in whole MiB; anything else warns once and keeps 8 MiB
    monkeypatch.setenv(transport.KEPT_ARENA_ENV, " 16 ")
    assert transport.kept_arena_limit("/any") == 16 * mib
    monkeypatch.setenv(transport.KEPT_ARENA_ENV, "0")
    assert transport.kept_arena_limit("/any") == 0
    for setting in ("8M", "-1", "\u00b2"):
        monkeypatch.setenv(transport.KEPT_ARENA_ENV, setting)
        with pytest.warns(UserWarning, match="not a whole number of MiB"):
            assert transport.kept_arena_limit("/any") == 8 * mib


def test_the_usable_memory_is_a_containers_limit_where_one_is_set(tmp_path, monkeypatch):
    from neuron_workbench.run import transport

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for text, usable in (("max\n", physical), ("1073741824\n", min(physical, 1 << 30))):
        (tmp_path / "memory.max").write_text(text)
        monkeypatch.setattr(transport, "_CGROUP_MEMORY_LIMITS", (str(tmp_path / "memory.max"),))
        transport._usable_memory.cache_clear()
        assert transport._usable_memory() == usable
    transport._usable_memory.cache_clear()


def test_arenas_up_to_the_limit_are_kept_and_a_lowered_limit_frees_them(tmp_path, monkeypatch):
    from neuron_workbench.run import transport

    folder = tempfile.mkdtemp(prefix="neuron-workbench-test-", dir=arena_folder() or tmp_path)
    try:
        # more than the 8 MiB kept before: a mid-size model's state is written into kept memory
        monkeypatch.setenv(transport.KEPT_ARENA_ENV, "16")
        assert _kept_after_loading(folder, 12 << 20)
        assert not _kept_after_loading(folder, 20 << 20)
        # kept, then the limit lowered: the next message does not reuse it, and its memory goes
        kept = os.path.join(folder, "kept-arena-0")
        back = loads(dumps({"x": torch.zeros(12 << 20, dtype=torch.uint8)}, folder))
        del back
        gc.collect()
        inode = os.stat(kept).st_ino
        monkeypatch.setenv(transport.KEPT_ARENA_ENV, "1")
        packed = dumps({"y": torch.ones(4)}, folder)
        assert not os.path.exists(kept) and os.stat(packed.arena).st_ino != inode
        assert loads(packed)["y"].tolist() == [1.0] * 4
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_loaded_arena_that_cannot_be_kept_is_removed(tmp_path, monkeypatch):
    # a folder without hard links: the loaded file goes, as an arena not kept does
    folder = tempfile.mkdtemp(prefix="neuron-workbench-test-", dir=arena_folder() or tmp_path)
    try:

        def no_links(source, destination):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
        back = loads(dumps({"x": torch.ones(3)}, folder))
        assert back["x"].tolist() == [1.0] * 3
        del back
        gc.collect()
        assert os.listdir(folder) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_arena_is_written_whole_across_short_writes(tmp_path, monkeypatch):
    from neuron_workbench.run import transport

    real = os.pwritev

    def short(fd, buffers, offset):  # at most 5 bytes a call, as a write may be cut short
        return real(fd, [b"".join(bytes(buffer) for buffer in buffers)[:5]], offset)

    monkeypatch.setattr(os, "pwritev", short)
    monkeypatch.setattr(transport, "_IOV_MAX", 2)  # and more chunks than one call takes
    chunks = [b"abc", memoryview(b"defghij"), b"k", memoryview(b"lmnopqrstu")]
    fd = os.open(tmp_path / "arena", os.O_WRONLY | os.O_CREAT)
    try:
        transport._write_all(fd, chunks, 21)
    finally:
        os.close(fd)
    assert (tmp_path / "arena").read_bytes() == b"abcdefghijklmnopqrstu"
    values = {"a": torch.arange(10.0), "b": torch.arange(3), "c": torch.ones(2)}
    back = loads(dumps(values, str(tmp_path)))
    assert all(torch.equal(back[name], value) for name, value in values.items())


def test_a_tensors_attributes_and_flags_arrive_as_they_were(arena):
    # most tensors travel without state, graph or hooks (a shorter stream): same tensors arrive
    labelled = torch.ones(2)
    labelled.label = "inputs"
    only_backward = torch.ones(2)
    only_backward._backward_note = 1  # dropped, as always
    marked = torch.ones(2)
    marked._is_param = True
    values = {
        "plain": torch.arange(3.0),
        "labelled": labelled,
        "only_backward": only_backward,
        "marked": marked,
        "requires_grad": torch.ones(2, requires_grad=True),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "ints": torch.arange(3),
    }
    back = loads(dumps(values, arena))
    for name, value in values.items():
        assert torch.equal(back[name], value), name
        assert type(back[name]) is type(value) or name == "marked", name
        assert back[name].requires_grad == value.requires_grad and back[name].is_leaf, name
        assert back[name].grad is None, name
    assert vars(back["labelled"]) == {"label": "inputs"}
    assert vars(back["only_backward"]) == {} and vars(back["plain"]) == {}
    assert isinstance(back["marked"], torch.nn.Parameter)


def test_device_names_are_torchs_own():
    from neuron_workbench.run.transport import _device_name, _device_type

    for device in (torch.device("cpu"), torch.device("meta"), torch.device("cuda", 1)):
        for _ in range(2):  # the remembered answer too
            assert (_device_type(device), _device_name(device)) == (device.type, str(device))


def test_a_discarded_message_leaves_no_file():
    folder = arena_folder()
    if folder is None:
        pytest.skip("no shared-memory folder on this host")
    packed = dumps(torch.ones(4), folder)
    packed.discard()
    assert not os.path.exists(packed.arena)


MISSING_MODULE_SENDER = """
import sys, types, pickle
import torch
sys.path[:0] = {paths!r}
from neuron_workbench.run.transport import dumps

# A module the receiver does not have (a device SDK, the target's torch.<device>).
sdk = types.ModuleType("nwtest_sdk")
sys.modules["nwtest_sdk"] = sdk
exec("class Stream:\\n    def __init__(self):\\n        self.handle = 7", sdk.__dict__)
sdk.Stream.__module__ = "nwtest_sdk"
torch.tpu = types.ModuleType("torch.tpu")
sys.modules["torch.tpu"] = torch.tpu
value = {{"stream": sdk.Stream(), "module": sdk, "device_module": torch.tpu, "y": torch.ones(2)}}
packed = dumps(value)
sys.stdout.buffer.write(pickle.dumps((packed.data, [bytes(b.raw()) for b in packed.storages])))
"""


def test_what_the_receiver_lacks_becomes_a_stand_in():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [os.path.join(root, "workbench")]
    sender = textwrap.dedent(MISSING_MODULE_SENDER.format(paths=paths))
    done = subprocess.run(
        [sys.executable, "-c", sender], capture_output=True, check=True, timeout=120
    )
    from neuron_workbench.run.transport import Packed

    data, storages = pickle.loads(done.stdout)
    packed = Packed(data, [], [pickle.PickleBuffer(bytearray(s)) for s in storages])
    with pytest.raises(ModuleNotFoundError):
        loads(packed)
    loaded = loads_leniently(
        Packed(data, [], [pickle.PickleBuffer(bytearray(s)) for s in storages])
    )
    assert loaded.stood_in
    value = loaded.value
    assert isinstance(value["stream"], Unloadable) and "nwtest_sdk.Stream" in value["stream"].reason
    assert isinstance(value["module"], Unloadable) and "nwtest_sdk" in value["module"].reason
    # the target's device module is the reference's equivalent: what the cell holds on CUDA
    assert value["device_module"] is torch.cuda
    assert torch.equal(value["y"], torch.ones(2))
    assert unloadable_in(value["y"]) is None
    assert unloadable_in([{"k": value["stream"]}]) is value["stream"]


def test_device_module_equivalent_names_only_accelerator_modules():
    assert device_module_equivalent("torch.neuron") is torch.cuda
    assert device_module_equivalent("torch.tpu") is torch.cuda
    assert device_module_equivalent("torch.nn") is None
    assert device_module_equivalent("torch_neuronx") is None


def test_a_full_or_missing_arena_folder_sends_in_the_message(tmp_path):
    # e.g. a container's small /dev/shm: writing the arena fails, the storages travel in-band
    missing = tmp_path / "gone"
    packed = dumps({"a": torch.arange(4.0)}, str(missing))
    assert packed.arena is None and len(packed.storages) == 1
    assert loads(packed)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_stand_in_class_is_found_as_unloadable():
    from neuron_workbench.run.transport import _stand_in

    stand_in = _stand_in("nwtest_sdk.Stream", ImportError("No module named 'nwtest_sdk'"))
    assert unloadable_in({"kind": stand_in}) is not None
    assert unloadable_in({"kind": int}) is None


def test_ordered_dicts_keep_their_order_attributes_and_subclass(arena):
    import collections

    class Registry(collections.OrderedDict):
        pass

    plain = collections.OrderedDict([("b", torch.ones(1)), ("a", 2)])
    plain.note = "kept"
    sub = Registry(z=1, y=2)
    back_plain, back_sub = loads(dumps((plain, sub), arena))
    assert type(back_plain) is collections.OrderedDict and list(back_plain) == ["b", "a"]
    assert back_plain.note == "kept" and torch.equal(back_plain["b"], torch.ones(1))
    assert type(back_sub) is Registry and list(back_sub.items()) == [("z", 1), ("y", 2)]


@pytest.mark.inprocess_device
@pytest.mark.parametrize("in_place", [False, True], ids=["host-copy", "read-in-place"])
@pytest.mark.parametrize("where", ARENAS, ids=lambda a: "arena" if a else "in-band")
def test_device_tensors_leave_for_the_host_as_views_of_one_copy(where, in_place):
    # in_place: the emulated device's storages are host memory, read where they are
    base = torch.arange(12.0, device="neuron")
    param = torch.nn.Parameter(torch.full((3,), 2.0, device="neuron"))
    param.grad = torch.ones(3, device="neuron")
    sent = {"base": base, "view": base[4:10].view(2, 3), "param": param, "cpu": torch.ones(2)}
    back = loads(dumps(sent, where, host_devices=("neuron",) if in_place else ()))
    assert back["base"].device.type == "cpu" and back["base"].tolist() == base.cpu().tolist()
    assert back["view"].tolist() == [[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    # one host storage for the device storage: the view still writes into its base
    back["view"][0, 0] = -1.0
    assert back["base"][4].item() == -1.0
    assert (
        isinstance(back["param"], torch.nn.Parameter) and back["param"].grad.tolist() == [1.0] * 3
    )
    assert back["param"]._workbench_device == "neuron:0"
    # every device tensor names its device, in attributes of its own (one state is sent for all)
    assert back["base"]._workbench_device == back["view"]._workbench_device == "neuron:0"
    del back["base"]._workbench_device
    assert back["view"]._workbench_device == back["param"]._workbench_device == "neuron:0"
    assert not hasattr(back["cpu"], "_workbench_device")
    assert base[4].item() == 4.0  # the sender's tensor is untouched


@pytest.mark.inprocess_device
def test_only_the_native_emulated_device_has_its_memory_on_the_host():
    from neuron_workbench import emulator
    from neuron_workbench.backends import get_backend

    native = emulator.status().core == "native"
    assert get_backend("neuron").memory_on_host() is native
    assert get_backend("cpu").memory_on_host() is False


NOTEBOOK_FUNCTION = """
import torch

def act(x):
    return torch.nn.functional.relu(x)  # torch.nn.functional: a submodule reached through torch
"""


def test_a_notebook_function_still_brings_the_submodules_it_uses(monkeypatch):
    import cloudpickle.cloudpickle as cp

    from neuron_workbench.run import transport

    namespace = {"__name__": "__main__"}
    exec(NOTEBOOK_FUNCTION, namespace)
    act = namespace["act"]
    packages = [torch]
    found = cp._find_imported_submodules(act.__code__, iter(packages))
    assert found == transport._find_imported_submodules(act.__code__, packages)  # cloudpickle's
    assert torch.nn in found and torch.nn.functional in found
    assert cp._find_imported_submodules(act.__code__, iter(packages)) == found  # again, remembered
    # a submodule loaded after the function was first sent is found the next time
    later = {"__name__": "__main__"}
    exec(NOTEBOOK_FUNCTION.replace("functional.relu", "nwtest_loaded_later"), later)
    code = later["act"].__code__
    assert cp._find_imported_submodules(code, iter(packages)) == [torch.nn]
    fake = type(torch)("torch.nn.nwtest_loaded_later")
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    assert fake in cp._find_imported_submodules(code, iter(packages))
    # one removed and another loaded (as many modules as before): not the remembered answer
    monkeypatch.delitem(sys.modules, fake.__name__)
    monkeypatch.setitem(sys.modules, "nwtest_unrelated", type(torch)("nwtest_unrelated"))
    assert cp._find_imported_submodules(code, iter(packages)) == [torch.nn]
    # a module object without __package__ is no package, as for cloudpickle
    bare = type(torch)("nwtest_bare")
    del bare.__package__
    assert cp._find_imported_submodules(code, iter([bare])) == []
    back = loads(dumps(act))
    assert back is not act and torch.equal(
        back(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0])
    )


def test_an_answer_leaves_a_class_this_process_has_as_it_is():
    # A notebook class travels by value; an answer's instance is of this process's own class, whose
    # methods must not become the sender's copies (their globals are the sender's).
    namespace = {"__name__": "__main__", "SCALE": 2}
    exec("class Scaled:\n    def get(self):\n        return SCALE", namespace)
    cls = namespace["Scaled"]
    packed = dumps(cls())
    cls.get = lambda self: "changed here after sending"
    method = cls.get
    back = loads_leniently(packed).value
    assert type(back) is cls and cls.get is method
    # a request (loads) keeps cloudpickle's way: the sender's class is the truth there
    assert loads(packed).get() == 2 and cls.get is not method


def test_a_request_rebuilds_the_same_code_and_one_namespace_for_the_notebooks_functions():
    # torch.compile keeps what it compiled on the code object and reads its graph from the
    # globals it compiled under: a target process compiled a notebook's model again in each cell
    from neuron_workbench.run.transport import notebook_globals_cleared

    namespace = {"__name__": "__main__", "SCALE": 2}
    exec("def scaled(t):\n    return t * SCALE", namespace)
    first = loads(dumps(namespace["scaled"]))
    first.__globals__["__compiled_fn_7"] = "a graph"  # as Dynamo installs it
    first.__globals__["_140001_c0"] = "a guarded object"
    notebook_globals_cleared()  # the next request
    namespace["SCALE"] = 3
    second = loads(dumps(namespace["scaled"]))
    assert second.__code__ is first.__code__ and second.__globals__ is first.__globals__
    assert second(torch.ones(1)).item() == 3.0  # the new request's globals, not the old ones
    assert second.__globals__["__compiled_fn_7"] == "a graph"
    assert second.__globals__["_140001_c0"] == "a guarded object"
    exec("def scaled(t):\n    return t * SCALE * 10", namespace)  # redefined: new code
    assert loads(dumps(namespace["scaled"])).__code__ is not first.__code__


def test_dynamos_names_are_there_while_the_values_cleared_away_are_freed():
    # Freeing a value can free code Dynamo compiled for it, whose cleanup deletes the names it put
    # into the globals: emptied and refilled, they were missing then ("Exception ignored in: ...
    # KeyError: '__builtins_dict___28'" on the worker's stderr, under the next cell)
    from neuron_workbench.run.transport import notebook_globals_cleared

    namespace = {"__name__": "__main__"}
    exec("def step():\n    pass", namespace)
    scope = loads(dumps(namespace["step"])).__globals__

    class Guarded:
        pass

    scope["opt"] = Guarded()
    scope["__builtins_dict___28"] = {}
    found = []
    # as Dynamo's CleanupHook, once the object its compiled code guarded is gone
    weakref.finalize(scope["opt"], lambda: found.append(scope.pop("__builtins_dict___28", None)))
    notebook_globals_cleared()
    assert found == [{}] and "opt" not in scope and scope["__name__"] == "__main__"


def test_a_bound_optimizer_step_arrives_with_its_hooks_where_its_class_has_none_yet():
    # pickle sent the class's hooked step by its name, and a process that had made no SGD yet
    # found the bare one there: a saved `opt.step` ran without the optimizer's step hooks
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    opt.register_step_post_hook(lambda o, args, kwargs: setattr(o, "stepped", True))
    packed = dumps(opt.step)
    hooked = vars(torch.optim.SGD)["step"]
    torch.optim.SGD.step = hooked.__wrapped__  # as in a process that made no SGD yet
    try:
        step = loads(packed)
        assert getattr(type(step.__self__).step, "hooked", False)
        step()
        assert getattr(step.__self__, "stepped", False)  # its post hook ran
    finally:
        torch.optim.SGD.step = hooked


def test_the_notebooks_globals_stay_while_a_thread_runs_code_over_them():
    # a thread a cell started in the worker failed with NameError once the answer was sent: the
    # globals were emptied under it
    import threading

    from neuron_workbench.run.transport import notebook_globals_cleared

    namespace = {"__name__": "__main__", "LATER": 5}
    exec("def waits(go, out):\n    go.wait(10)\n    out.append(LATER)", namespace)
    waits = loads(dumps(namespace["waits"]))
    go, out = threading.Event(), []
    thread = threading.Thread(target=waits, args=(go, out))
    thread.start()
    try:
        notebook_globals_cleared()  # the answer was sent
        assert waits.__globals__["LATER"] == 5
    finally:
        go.set()
        thread.join()
    assert out == [5]
    notebook_globals_cleared()  # it has ended: the next request finds them emptied
    assert "LATER" not in waits.__globals__


class _Stopped(Exception):
    def __init__(self, step, loss):
        super().__init__(f"stop at {step}")
        self.step, self.loss = step, loss


class _Custom(Exception):
    def __reduce__(self):  # an exception that says how it is rebuilt is rebuilt so
        return _Custom, ("rebuilt",)


def test_exceptions_travel_without_their_init_and_storages_by_bytes():
    stopped = _Stopped(3, torch.tensor(0.25))
    storage = torch.arange(4, dtype=torch.uint8).untyped_storage()
    back = loads(dumps({"e": stopped, "st": storage, "c": _Custom("x")}))
    assert type(back["e"]) is _Stopped and back["e"].args == ("stop at 3",)
    assert back["e"].step == 3 and torch.equal(back["e"].loss, torch.tensor(0.25))
    assert isinstance(back["st"], torch.UntypedStorage) and list(back["st"]) == [0, 1, 2, 3]
    assert back["c"].args == ("rebuilt",)


class _Missing(OSError):
    def __init__(self, path):
        super().__init__(2, "missing", path)
        self.where = path


def test_built_in_exceptions_keep_what_they_hold_outside_their_args():
    back = loads(
        dumps(
            {
                "stop": StopIteration(5),
                "exit": SystemExit(3),
                "syntax": SyntaxError("bad", ("f.py", 3, 1, "x")),
                "missing": _Missing("/data"),
            }
        )
    )
    assert back["stop"].value == 5 and back["exit"].code == 3
    assert back["syntax"].lineno == 3 and str(back["syntax"]) == "bad (f.py, line 3)"
    assert back["missing"].errno == 2 and back["missing"].filename == "/data"
    assert back["missing"].where == "/data"


class _Forwarding:
    """A wrapper forwarding what it lacks to what it wraps, as tqdm's output stream is."""

    def __init__(self, wrapped):
        object.__setattr__(self, "_wrapped", wrapped)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)

    def __setattr__(self, name, value):
        setattr(self._wrapped, name, value)


class _SlottedForwarding(_Forwarding):
    __slots__ = ("extra",)


def test_a_wrapper_forwarding_its_attributes_arrives(arena):
    # pickle asks the empty instance for __setstate__, which __getattr__ forwarded to the wrapped
    # object it did not have yet: a RecursionError lost the whole answer of a cell that bound a
    # tqdm bar (`pbar = tqdm(range(5))`)
    slotted = _SlottedForwarding(torch.ones(2))
    object.__setattr__(slotted, "extra", 3)
    plain, back_slotted = loads_leniently(dumps([_Forwarding([1, 2]), slotted], arena)).value
    assert plain._wrapped == [1, 2] and plain.count(2) == 1
    assert torch.equal(back_slotted._wrapped, torch.ones(2)) and back_slotted.extra == 3
    assert back_slotted.shape == (2,)


def test_an_asyncio_bar_over_a_data_loader_arrives_without_its_iterator(arena):
    # tqdm.auto's bar takes an iterator of a loader when built (for `async for`), held by the bar
    # and, through a weak proxy, by its output stream's guard: a loader's iterator cannot be
    # pickled, so `pbar = tqdm(loader)` could not be sent back
    import asyncio
    import io

    from tqdm.asyncio import tqdm_asyncio

    loader = torch.utils.data.DataLoader(torch.arange(4.0), batch_size=2)
    bar = tqdm_asyncio(loader, file=io.StringIO())
    for _ in bar:
        pass
    back = loads_leniently(dumps(bar, arena)).value
    assert back.n == 2 and back.total == 2
    assert torch.equal(back.iterable.dataset, torch.arange(4.0))

    async def drawn():  # the copy's `async for` starts a fresh iterator of the loader
        return [batch.tolist() async for batch in back]

    assert asyncio.run(drawn()) == [[0.0, 1.0], [2.0, 3.0]]


_ACTIVE = contextvars.ContextVar("active", default=None)  # a module global no pickle takes


def _make_hook(key):
    """A closure over a module's global, as a library installs on a model (transformers')."""

    def hook(value):
        active = _ACTIVE.get()
        if active is not None:
            active.append((key, value, again))

    def again():  # a closure naming itself: rebuilt before its cells are filled
        return hook

    if False:  # a cell never filled
        unused = None
    hook.marker = "kept"
    return hook, lambda: unused


def test_a_librarys_closure_arrives_over_its_modules_own_globals(arena):
    # cloudpickle sent such a closure by value with copies of the globals it reads: a ContextVar
    # cannot be pickled, so a transformers model that had captured hidden states once could not be
    # sent to the worker again, and a copy would not be the state the module's own code sets
    hook, unfilled = _make_hook("hidden")
    back, back_unfilled = loads_leniently(dumps([hook, unfilled], arena)).value
    assert back.__globals__ is globals() and back.marker == "kept"
    assert back.__qualname__ == hook.__qualname__
    seen = []
    token = _ACTIVE.set(seen)
    try:
        back(3)
    finally:
        _ACTIVE.reset(token)
    assert seen[0][:2] == ("hidden", 3) and seen[0][2]() is back
    with pytest.raises(NameError):
        back_unfilled()


class _Color(enum.Enum):
    RED = 1


def test_enum_classes_and_members_arrive(arena):
    # Python 3.11's EnumType has a __getattr__: an enum class was taken for a forwarding proxy
    # and rebuilt as an instance (Enum.__reduce_ex__ without its proto): anything holding an enum
    # could not be sent, a transformers model from from_pretrained among them (its kernels mode)
    values = {"member": _Color.RED, "cls": _Color, "flag": re.IGNORECASE | re.MULTILINE}
    back = loads_leniently(dumps(values, arena)).value
    assert back == values


def test_a_notebooks_slotted_forwarding_proxy_arrives(arena):
    # a notebook class travels by value; with __slots__ only, its reduction took another branch,
    # where pickle again asked the empty proxy's __getattr__ for __setstate__ (RecursionError)
    class Proxy:
        __slots__ = ("_obj",)

        def __init__(self, obj):
            object.__setattr__(self, "_obj", obj)

        def __getattr__(self, name):
            return getattr(self._obj, name)

    Proxy.__module__ = "__main__"  # as a notebook cell defines it
    back = loads_leniently(dumps(Proxy([1, 2]), arena)).value
    assert back._obj == [1, 2] and back.count(1) == 1


@pytest.mark.parametrize("load", [loads, loads_leniently], ids=["request", "answer"])
def test_a_loaded_message_goes_as_soon_as_nothing_holds_it(load):
    # The unpickler's memo held every loaded object and the unpickler's own methods that
    # find_class gave for a notebook's function or class sent by value (a cycle back to it): the
    # message lived until the collector ran, and a worker found the last run's device tensors
    # there on every other cell and paid for a full collection (130 ms with transformers loaded)
    namespace = {"__name__": "__main__"}
    exec("class Net:\n    pass\n\ndef step(x):\n    return x + 1\n", namespace)
    net = namespace["Net"]()
    net.weight = torch.ones(3)
    message = dumps({"step": namespace["step"], "net": net})
    gc.disable()
    try:
        value = load(message)
        value = getattr(value, "value", value)
        loaded = weakref.ref(value["net"].weight)
        del value
        assert loaded() is None
    finally:
        gc.enable()


def test_a_lazy_modules_parameters_arrive_uninitialized_with_their_dtype_and_state():
    # their own pickling raised on the way (is_conj) and forgets the dtype; a buffer is still one
    net = torch.nn.Sequential(
        torch.nn.LazyLinear(2, dtype=torch.float64), torch.nn.LazyBatchNorm1d(dtype=torch.float64)
    )
    back = loads(dumps(net))
    weight, buffer = back[0].weight, back[1].running_mean
    assert isinstance(weight, torch.nn.UninitializedParameter) and weight.requires_grad
    assert weight.dtype == torch.float64
    assert isinstance(buffer, torch.nn.UninitializedBuffer) and buffer.persistent
    assert back(torch.ones(3, 4, dtype=torch.float64)).shape == (3, 2)


def test_an_exported_program_arrives_as_a_program_that_runs():
    # torch's own pickling of its graph module fails (its tracer cannot be made again)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    program = torch.export.export(net, (x,))
    back = loads(dumps({"program": program}))["program"]
    assert type(back) is torch.export.ExportedProgram
    assert torch.equal(back.module()(x), net(x))
