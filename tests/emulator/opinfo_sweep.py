"""OpInfo sweep: every op in PyTorch's ``op_db``, on the emulated device vs CPU, by dtype.

For each sample: run the op on CPU twice (same seed; a sample whose two CPU runs differ is
"nondeterministic" and not compared), then on the emulated device, and compare forward outputs
and the gradients of every input that requires grad (``assert_close`` defaults for the dtype,
``equal_nan=True``, device not compared). Backward runs where the op supports autograd, with the
same random ``grad_outputs`` on both sides.

Dtypes (``--dtypes``, default float32): a dtype is swept for an op when CUDA supports it (OpInfo
``dtypesIfCUDA``); where the CPU kernel lacks it (``dtypes``), the CPU reference computes the
emulator's dtype-gap table (``emulator/coverage/cuda-dtype-gaps.json``) the same way, and an op
that still fails on CPU is "cpu_error". A sample that differs only because of a numerics rule of
the device (neuron's float64-as-float32 and int64-as-int32, bf16 matmul passes) is "rule", with
the rules that ran: it is run again with the rules off and then matches. Sample subset:
``--max-samples`` for float32, ``--max-samples-other`` for the other dtypes (the first N samples
OpInfo generates per op and dtype; 0: all).

Process layout: this script, run without ``--worker``, is the orchestrator. It starts worker
processes (this script with ``--worker``) on interleaved shards of the op list and reads one JSON
line per event from each. A worker that dies (SIGABRT, segfault) or stays silent for longer than
``--sample-timeout`` is recorded as an abort / timeout for the sample it had started, killed, and
restarted after that sample. The orchestrator prints (or writes with ``--out``) a JSON summary.

Usage::

    python tests/emulator/opinfo_sweep.py --max-samples 4 --jobs 2 --out summary.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# Worker


def _op_key(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _tensors_in(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors_in(o)]
    return []


def _move(sample: Any, device: str | None) -> Any:
    """A copy of the sample with every tensor a fresh leaf on ``device`` (grad flags kept).

    ``device=None`` keeps each tensor where it is (a sample generated for the device itself).
    """
    import torch

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        with torch.no_grad():
            if device is None or device == t.device.type:
                c = t.detach().clone()
            else:
                c = t.detach().to(device)
        return c.requires_grad_(t.requires_grad)

    return sample.transform(move)


def _same_sample(a: Any, b: Any) -> bool:
    """Whether two samples hold the same values (b may live on another device)."""
    import torch

    la = _flat([a.input, list(a.args), sorted(a.kwargs.items(), key=lambda kv: kv[0])])
    lb = _flat([b.input, list(b.args), sorted(b.kwargs.items(), key=lambda kv: kv[0])])
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided or y.layout != torch.strided:
                return False
            if x.requires_grad != y.requires_grad:
                return False
            y = y.detach().cpu()
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if not torch.equal(torch.nan_to_num(x.detach()), torch.nan_to_num(y)):
                return False
        elif isinstance(x, torch.device) or isinstance(y, torch.device):
            continue
        else:
            try:
                if not bool(x == y or (x != x and y != y)):
                    return False
            except Exception:
                return False
    return True


def _diff_inputs(sample: Any) -> list:
    import torch

    seen: set[int] = set()
    out = []
    for t in _tensors_in([sample.input, sample.args, sample.kwargs]):
        if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _run(op: Any, sample: Any, grad_seed: int | None, seed: int) -> tuple[Any, list | None]:
    """Forward (and backward when ``grad_seed`` is given): (outputs, input gradients)."""
    import torch

    torch.manual_seed(seed)
    out = op(sample.input, *sample.args, **sample.kwargs)
    if grad_seed is None:
        return out, None
    inputs = _diff_inputs(sample)
    outs = [
        t
        for t in _tensors_in(out)
        if t.requires_grad and (t.is_floating_point() or t.is_complex()) and t.numel() > 0
    ]
    if not inputs or not outs:
        return out, None
    gen = torch.Generator().manual_seed(grad_seed)
    gouts = []
    for t in outs:
        g = torch.randn(t.shape, dtype=t.dtype, generator=gen)
        gouts.append(g.to(t.device) if t.device.type != "cpu" else g)
    grads = torch.autograd.grad(outs, inputs, gouts, allow_unused=True)
    return out, list(grads)


def _flat(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in _flat(o)]
    return [obj]


def _compare(ref: Any, got: Any, values: bool = True) -> str | None:
    """None when equal at float32 defaults (metadata only if not ``values``), else a reason."""
    import torch

    r_list, g_list = _flat(ref), _flat(got)
    if len(r_list) != len(g_list):
        return f"output structure differs: {len(r_list)} vs {len(g_list)} leaves"
    for i, (r, g) in enumerate(zip(r_list, g_list)):
        if isinstance(r, torch.Tensor) or isinstance(g, torch.Tensor):
            if not (isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor)):
                return f"leaf {i}: {type(r).__name__} vs {type(g).__name__}"
            r = r.detach()
            g = g.detach()
            if g.device.type != "cpu":
                g = g.cpu()
            if r.layout != torch.strided:
                r = r.to_dense()
            if g.layout != torch.strided:
                g = g.to_dense()
            if not values:
                if (g.shape, g.dtype) != (r.shape, r.dtype):
                    return f"leaf {i}: {g.shape}/{g.dtype} vs {r.shape}/{r.dtype}"
                continue
            try:
                torch.testing.assert_close(g, r, equal_nan=True, check_device=False)
            except AssertionError as exc:
                lines = [s.strip() for s in str(exc).splitlines() if s.strip()]
                return f"leaf {i}: " + " ".join(lines[:3])[:300]
        elif r is None or g is None:
            if (r is None) != (g is None):
                return f"leaf {i}: {r!r} vs {g!r}"
        else:
            try:
                same = r == g or (r != r and g != g)  # NaN == NaN here
            except Exception:
                same = False
            if not bool(same):
                return f"leaf {i}: {r!r} vs {g!r}"[:300]
    return None


def _err(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"[:300]


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# Ops whose output is uninitialized memory: only shapes and dtypes are compared.
UNINITIALIZED = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)


def _emu_failure(exc: BaseException, phase: str) -> dict:
    # The emulator's documented refusals are categories of their own: sparse layouts, and (neuron)
    # a copy to the device asked for in the channels_last memory format.
    if isinstance(exc, NotImplementedError) and "tensor cannot be created on" in str(exc):
        status = "unsupported_layout"
    elif isinstance(exc, RuntimeError) and str(exc).endswith(
        "Neuron tensors only support contiguous or preserve memory format"
    ):
        status = "unsupported_memory_format"
    else:
        status = "emu_error"
    return {"status": status, "phase": phase, "error": _err(exc)}


def _widened_on_cpu() -> Any:
    """A dispatch mode: CPU ops compute the dtype-gap table's dtypes as the emulator does."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from neuron_workbench.emulator import _policy

    gaps = _policy.dtype_gaps()

    class Widened(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            table = gaps.get(_policy.overload_name(func))
            if table is not None:
                return _policy.run_widened(func, table, list(args), kwargs or {})
            return func(*args, **(kwargs or {}))

    return Widened()


def _rules_off() -> Any:
    """Switch the device's numerics rules off (64-bit narrowing, bf16 matmul passes) for a block."""
    import contextlib

    from neuron_workbench.emulator import _core

    @contextlib.contextmanager
    def off() -> Any:
        saved = _core.NARROW_64BIT, _core.MATMUL_PASSES
        _core.NARROW_64BIT, _core.MATMUL_PASSES = False, 0
        _core.reset_plans()
        try:
            yield
        finally:
            _core.NARROW_64BIT, _core.MATMUL_PASSES = saved
            _core.reset_plans()

    return off()


#: Counters of the ops of a rule that did something in particular (ran at one pass, wrapped a
#: value around): evidence within their rule, not rules of their own.
_REFINEMENTS = frozenset({"tpu-matmul-1pass", "int64-wrapped", "fp64-rounded"})


def _sample_result(
    op: Any, sample: Any, device: str, seed: int, dev_sample: Any = None, widen: bool = False
) -> dict:
    """Compare one sample, then say whether a numerics rule explains a difference."""
    from neuron_workbench import emulator

    before = emulator.read_rule_ops()
    res = _compare_sample(op, sample, device, seed, dev_sample, widen)
    pair = res.pop("_pair", None)
    rules = sorted(
        k
        for k, v in emulator.read_rule_ops().items()
        if v > before.get(k, 0) and k not in _REFINEMENTS
    )
    if res["status"] in ("mismatch_forward", "mismatch_backward", "emu_error") and rules:
        with _rules_off():
            again = _compare_sample(op, sample, device, seed, dev_sample, widen)
        again.pop("_pair", None)
        if again["status"] == "match":
            res.update(status="rule", rules=rules)
            return res
    if widen and res["status"] == "emu_error" and "not implemented for '" in res["error"]:
        # The op falls back to CPU on this device, and the CPU kernel lacks the dtype: the real
        # backend's CPU fallback runs that same kernel and fails the same way.
        res["status"] = "fallback_dtype_gap"
    elif pair is not None and _low_precision(sample):
        ratio = _error_ratio(op, sample, seed, res["status"], *pair)
        if ratio is not None:
            res["ratio"] = round(ratio, 3)
        if ratio is not None and ratio <= PRECISION_RATIO:
            # As far from the float32 result as the CPU's own low-precision result is: another
            # order of the same low-precision arithmetic (a composite run as its parts).
            res.update(status="precision", ratio=round(ratio, 3))
        elif op.name in DEVICE_PATH:
            res["status"] = "device_path"
    return res


#: Ops whose own Python implementation chooses its arithmetic by device type: on an accelerator
#: other than CUDA and MPS they take a generic path, which the CPU reference does not take.
DEVICE_PATH = {
    "nn.functional.linear_cross_entropy": "torch_nn::_linear_cross_entropy_batch_chunked "
    "casts and accumulates by device type (is_cuda branches): float16/bfloat16 take the "
    "generic path on neuron and tpu",
}

#: Error ratio (emulated vs float32, over CPU vs float32) up to which a float16/bfloat16
#: difference counts as the same low-precision arithmetic in another order.
PRECISION_RATIO = 2.0


def _low_precision(sample: Any) -> bool:
    import torch

    return any(
        t.dtype in (torch.float16, torch.bfloat16)
        for t in _tensors_in([sample.input, sample.args, sample.kwargs])
    )


def _error_ratio(op: Any, sample: Any, seed: int, status: str, ref: Any, got: Any) -> float | None:
    """‖emulated − float32‖ / ‖cpu − float32‖ over the compared leaves (float32: the same sample
    with its float16/bfloat16 tensors made float32, on CPU); None when it cannot be computed."""
    import torch

    def up(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        with torch.no_grad():
            c = t.detach().to("cpu")
            if c.dtype in (torch.float16, torch.bfloat16):
                c = c.float()
        return c.requires_grad_(t.requires_grad)

    try:
        out32, grads32 = _run(
            op, sample.transform(up), seed + 1 if op.supports_autograd else None, seed
        )
    except Exception:
        return None
    exact = out32 if status == "mismatch_forward" else grads32
    a, r, g = _flat(exact), _flat(ref), _flat(got)
    if not (len(a) == len(r) == len(g)):
        return None
    num = den = scale = 0.0
    low = [
        t.dtype
        for t in _tensors_in([sample.input, sample.args, sample.kwargs])
        if t.dtype in (torch.float16, torch.bfloat16)
    ]
    eps = max(torch.finfo(d).eps for d in low)
    for x, y, z in zip(a, r, g):
        if isinstance(y, float) and isinstance(z, float):  # .item() of a low-precision result
            y, z = torch.tensor(y), torch.tensor(z)
            x = torch.as_tensor(x.detach() if isinstance(x, torch.Tensor) else x)
        if not all(isinstance(v, torch.Tensor) for v in (x, y, z)):
            continue
        if not y.is_floating_point():
            continue
        x = x.detach().double()
        y, z = y.detach().cpu(), z.detach().cpu()
        keep = torch.isfinite(x) & torch.isfinite(y.double()) & torch.isfinite(z.double())
        num += float(((z.double() - x)[keep] ** 2).sum())
        den += float(((y.double() - x)[keep] ** 2).sum())
        scale += float((x[keep] ** 2).sum())
    floor = (eps * scale**0.5) ** 2  # a CPU result equal to float32 still has its rounding
    return (num / max(den, floor)) ** 0.5 if num or den else None


def _compare_sample(
    op: Any, sample: Any, device: str, seed: int, dev_sample: Any, widen: bool
) -> dict:
    """Compare one sample; ``dev_sample`` is the same sample generated on the device, if any."""
    import contextlib

    import torch

    grad_seed = seed + 1 if op.supports_autograd else None
    values = op.name not in UNINITIALIZED
    res: dict[str, Any] = {}
    try:
        with _widened_on_cpu() if widen else contextlib.nullcontext():
            ref_out, ref_grads = _run(op, _move(sample, "cpu"), grad_seed, seed)
            ref2_out, ref2_grads = _run(op, _move(sample, "cpu"), grad_seed, seed)
    except Exception as exc:
        res["status"] = "cpu_error"
        res["error"] = _err(exc)
        return res
    if _compare(ref_out, ref2_out, values) or _compare(ref_grads, ref2_grads, values):
        res["status"] = "nondeterministic"
        return res
    template, where = (dev_sample, None) if dev_sample is not None else (sample, device)
    try:
        emu = _move(template, where)
    except Exception as exc:
        res.update(_emu_failure(exc, "transfer"))
        return res
    try:
        torch.manual_seed(seed)
        got_out = op(emu.input, *emu.args, **emu.kwargs)
    except Exception as exc:
        res.update(_emu_failure(exc, "forward"))
        return res
    why = _compare(ref_out, got_out, values)
    if why:
        res["status"] = "mismatch_forward"
        res["error"] = why
        res["_pair"] = (ref_out, got_out)
        return res
    if ref_grads is None:
        res["status"] = "match"
        return res
    try:
        _, got_grads = _run(op, _move(template, where), grad_seed, seed)
    except Exception as exc:
        res.update(_emu_failure(exc, "backward"))
        return res
    why = _compare(ref_grads, got_grads, values)
    if why:
        res["status"] = "mismatch_backward"
        res["error"] = why
        res["_pair"] = (ref_grads, got_grads)
        return res
    res["status"] = "match"
    res["backward"] = True
    return res


def worker(args: argparse.Namespace) -> int:
    """Run the shard ``args.shard`` of ``args.jobs`` from (op, sample) ``args.resume``."""
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    import neuron_workbench

    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    _emit({"core": neuron_workbench.emulate(args.device).core})
    if args.exact_64bit:
        neuron_workbench.emulator.configure(narrow_64bit=False)
    from torch.testing._internal.common_methods_invocations import op_db

    resume_op, resume_sample = args.resume
    for index, op in enumerate(op_db):
        if index % args.jobs != args.shard or index < resume_op:
            continue
        key = _op_key(op)
        if args.ops and not any(re.fullmatch(p, key) for p in args.ops):
            continue
        cpu_dtypes, cuda_dtypes = op.supported_dtypes("cpu"), op.supported_dtypes("cuda")
        # float32 where the CPU has it (as the float32-only sweep did); other dtypes where CUDA
        # has them (not a CUDA dtype for the op: nothing to be faithful to)
        swept = [
            dtype
            for dtype in dtypes
            if (dtype in cpu_dtypes if dtype is torch.float32 else dtype in cuda_dtypes)
        ]
        if not swept:
            reason = "no float32 on cpu" if dtypes == [torch.float32] else "no swept dtype"
            _emit({"op": index, "key": key, "skip": reason})
            continue
        _emit({"begin": [index, -1], "key": key})  # sample generation (-1: no sample yet)
        # (dtype, sample, device twin) for every dtype swept; "begin" counts through all of them
        work: list = []
        for dtype in swept:
            name = str(dtype).removeprefix("torch.")
            # float32 keeps the seeds of the float32-only sweep
            op_seed = zlib.crc32(
                key.encode() if dtype is torch.float32 else f"{key}@{name}".encode()
            )
            limit = (args.max_samples if dtype is torch.float32 else args.max_samples_other) or None
            grad = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
            try:
                torch.manual_seed(op_seed)
                samples = list(
                    itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), limit)
                )
            except Exception as exc:  # the sample generator itself failed
                _emit({"op": index, "key": f"{key}@{name}", "generator_error": _err(exc)})
                continue
            # The same samples generated for the device (same seed; the emulator draws from the
            # CPU generator), so tensors a sample keeps on CPU on purpose (tensor_split's
            # indices) stay there. A sample that differs from its CPU twin is moved from CPU.
            dev_samples: list = []
            try:
                torch.manual_seed(op_seed)
                dev_samples = list(
                    itertools.islice(
                        op.sample_inputs(args.device, dtype, requires_grad=grad), limit
                    )
                )
            except Exception:
                dev_samples = []
            widen = dtype not in cpu_dtypes
            for j, sample in enumerate(samples):
                twin = dev_samples[j] if j < len(dev_samples) else None
                work.append((name, op_seed + j, sample, twin, widen))
        start = resume_sample if index == resume_op else 0
        count = len(work)
        for j, (name, seed, sample, twin, widen) in enumerate(work):
            if j < start:
                continue
            _emit({"begin": [index, j], "key": key})
            if args.abort_on and re.fullmatch(args.abort_on, key) and j == 0:
                os.abort()  # lets the tests check that an abort is caught and reported
            if twin is not None and not _same_sample(sample, twin):
                twin = None
            t0 = time.perf_counter()
            res = _sample_result(op, sample, args.device, seed, twin, widen)
            res.update(
                op=index, sample=j, key=key, dtype=name, s=round(time.perf_counter() - t0, 4)
            )
            res["source"] = "device" if twin is not None else "moved"
            _emit(res)
        _emit({"op": index, "key": key, "done": count})
    _emit({"shard_done": args.shard})
    return 0


# ---------------------------------------------------------------------------------------------
# Orchestrator


class _Shard:
    def __init__(self, args: argparse.Namespace, shard: int) -> None:
        self.args = args
        self.shard = shard
        self.results: list[dict] = []
        self.skips: list[dict] = []
        self.generator_errors: list[dict] = []
        self.ops_done: dict[int, str] = {}
        self.restarts = 0
        self.cores: set[str] = set()

    def _start(self, resume: tuple[int, int]) -> subprocess.Popen:
        a = self.args
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--device", a.device,
            "--jobs", str(a.jobs),
            "--shard", str(self.shard),
            "--resume", str(resume[0]), str(resume[1]),
            "--max-samples", str(a.max_samples),
            "--max-samples-other", str(a.max_samples_other),
            "--dtypes", a.dtypes,
        ]  # fmt: skip
        for p in a.ops or ():
            cmd += ["--ops", p]
        if a.exact_64bit:
            cmd.append("--exact-64bit")
        if a.abort_on:
            cmd += ["--abort-on", a.abort_on]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT / "workbench") + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("NEURON_WORKBENCH_EMULATE", None)
        env.setdefault("OMP_NUM_THREADS", "1")
        return subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,
        )

    def run(self, deadline: float) -> None:
        resume = (0, 0)
        while True:
            proc = self._start(resume)
            begun: list[Any] | None = None
            begun_key = ""
            buf = b""
            finished = False
            timed_out = False
            last = time.monotonic()
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            while True:
                now = time.monotonic()
                limit = self.args.sample_timeout if begun else self.args.startup_timeout
                if now > deadline or now - last > limit:
                    timed_out = True
                    break
                ready, _, _ = select.select([fd], [], [], 1.0)
                if not ready:
                    if proc.poll() is not None:
                        break
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                last = time.monotonic()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    if "begin" in msg:
                        begun, begun_key = msg["begin"], msg["key"]
                    elif "core" in msg:
                        self.cores.add(msg["core"])
                    elif "shard_done" in msg:
                        finished = True
                    elif "skip" in msg:
                        self.skips.append(msg)
                    elif "generator_error" in msg:
                        self.generator_errors.append(msg)
                        self.ops_done[msg["op"]] = msg["key"]
                        begun = None
                    elif "done" in msg:
                        self.ops_done[msg["op"]] = msg["key"]
                        begun = None
                    else:
                        self.results.append(msg)
                        begun = None
            if timed_out or proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            rc = proc.wait()
            proc.stdout.close()
            if finished:
                return
            if time.monotonic() > deadline:
                if begun:
                    self.results.append(
                        {"op": begun[0], "sample": begun[1], "key": begun_key, "status": "timeout"}
                    )
                return
            if begun is None:
                # died between samples (import, sample generation): nothing to blame, give up
                self.results.append(
                    {"op": -1, "sample": -1, "key": "<worker>", "status": "abort", "rc": rc}
                )
                return
            status = "timeout" if timed_out else "abort"
            self.results.append(
                {"op": begun[0], "sample": begun[1], "key": begun_key, "status": status, "rc": rc}
            )
            self.restarts += 1
            # after a sample: the next one; during sample generation (-1): the next op
            resume = (begun[0], begun[1] + 1) if begun[1] >= 0 else (begun[0] + 1, 0)


def _group(results: list[dict], statuses: tuple[str, ...], top: int) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in results:
        if r["status"] in statuses:
            msg = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", r.get("error", ""))[:120]
            groups[(r["status"], msg)].append(r)
    out = []
    for (status, msg), rs in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:top]:
        ops = Counter(r["key"] for r in rs)
        out.append(
            {
                "status": status,
                "message": msg,
                "samples": len(rs),
                "ops": dict(ops.most_common(12)),
                "example": rs[0].get("error", ""),
            }
        )
    return out


def orchestrate(args: argparse.Namespace) -> dict:
    """Run every shard to completion and build the summary."""
    t0 = time.monotonic()
    deadline = t0 + args.total_timeout
    shards = [_Shard(args, i) for i in range(args.jobs)]
    threads = [threading.Thread(target=s.run, args=(deadline,)) for s in shards]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [r for s in shards for r in s.results]
    counts = Counter(r["status"] for r in results)
    cpu_pass = sum(
        counts[k]
        for k in (
            "match", "mismatch_forward", "mismatch_backward", "emu_error", "unsupported_layout",
            "abort", "timeout", "rule", "precision", "fallback_dtype_gap", "device_path",
        )
    )  # fmt: skip
    matched = counts["match"]
    # refused on purpose, with the documented errors: not a sample the device gets wrong
    supported = cpu_pass - counts["unsupported_layout"] - counts["unsupported_memory_format"]
    by_dtype: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        by_dtype[r.get("dtype", "?")][r["status"]] += 1
    rules: Counter = Counter()
    for r in results:
        if r["status"] == "rule":
            rules["+".join(r["rules"])] += 1
    per_op_bad = Counter(
        r["key"]
        for r in results
        if r["status"] in ("mismatch_forward", "mismatch_backward", "emu_error")
    )
    ops_done = {k for s in shards for k in s.ops_done.values()}
    return {
        "device": args.device,
        "cores": sorted({c for s in shards for c in s.cores}),
        "narrow_64bit": not args.exact_64bit,
        "max_samples_per_op": args.max_samples or None,
        "max_samples_per_op_other_dtypes": args.max_samples_other or None,
        "jobs": args.jobs,
        "ops": len(ops_done),
        "ops_skipped": sorted({m["key"] for s in shards for m in s.skips}),
        "generator_errors": [m for s in shards for m in s.generator_errors],
        "samples": len(results),
        "dtypes": args.dtypes.split(","),
        "counts": dict(counts),
        "counts_by_dtype": {k: dict(v) for k, v in sorted(by_dtype.items())},
        "rule_samples": dict(rules),
        "cpu_passing": cpu_pass,
        "matched": matched,
        "match_rate": round(matched / cpu_pass, 5) if cpu_pass else None,
        "match_rate_supported_layouts": round(matched / supported, 5) if supported else None,
        "samples_from_device": sum(1 for r in results if r.get("source") == "device"),
        "aborts": [r for r in results if r["status"] == "abort"],
        "timeouts": [r for r in results if r["status"] == "timeout"],
        "restarts": sum(s.restarts for s in shards),
        "mismatch_groups": _group(
            results,
            (
                "mismatch_forward",
                "mismatch_backward",
                "emu_error",
                "unsupported_layout",
                "unsupported_memory_format",
            ),
            args.top,
        ),
        # samples the CPU cannot compute even with the dtype-gap table (not compared)
        "cpu_error_groups": _group(results, ("cpu_error",), args.top),
        "worst_ops": dict(per_op_bad.most_common(args.top)),
        "runtime_s": round(time.monotonic() - t0, 1),
        "slowest_samples": sorted(
            ({"key": r["key"], "sample": r["sample"], "s": r["s"]} for r in results if "s" in r),
            key=lambda d: -d["s"],
        )[:10],
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry (orchestrator, or worker with ``--worker``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="neuron", choices=("neuron", "tpu"))
    p.add_argument("--max-samples", type=int, default=0, help="float32 samples per op (0: all)")
    p.add_argument(
        "--max-samples-other", type=int, default=0, help="samples per op, other dtypes (0: all)"
    )
    p.add_argument(
        "--dtypes", default="float32", help="comma-separated, e.g. float32,float16,int64,bool"
    )
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--ops", action="append", help="regex on op name[.variant] (repeatable)")
    p.add_argument("--sample-timeout", type=float, default=60.0)
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--total-timeout", type=float, default=1500.0)
    p.add_argument(
        "--exact-64bit",
        action="store_true",
        help="switch off neuron's float64-as-float32 / int64-as-int32 numerics policy",
    )
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", help="write the JSON summary here (default: stdout)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--abort-on", help=argparse.SUPPRESS)
    p.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--resume", type=int, nargs=2, default=(0, 0), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    summary = orchestrate(args)
    text = json.dumps(summary, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
