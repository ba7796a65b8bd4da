"""OpInfo sweep: every op in PyTorch's ``op_db``, float32 samples, on the emulated device vs CPU.

For each sample: run the op on CPU twice (same seed; a sample whose two CPU runs differ is
"nondeterministic" and not compared), then on the emulated device, and compare forward outputs
and the gradients of every input that requires grad (``assert_close`` float32 defaults,
``equal_nan=True``, device not compared). Backward runs where the op supports autograd, with the
same random ``grad_outputs`` on both sides.

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
    # The emulator's documented refusal of sparse layouts is its own category.
    unsupported = isinstance(exc, NotImplementedError) and "tensor cannot be created on" in str(exc)
    return {
        "status": "unsupported_layout" if unsupported else "emu_error",
        "phase": phase,
        "error": _err(exc),
    }


def _sample_result(op: Any, sample: Any, device: str, seed: int, dev_sample: Any = None) -> dict:
    """Compare one sample; ``dev_sample`` is the same sample generated on the device, if any."""
    import torch

    grad_seed = seed + 1 if op.supports_autograd else None
    values = op.name not in UNINITIALIZED
    res: dict[str, Any] = {}
    try:
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

    neuron_workbench.emulate(args.device)
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
        if torch.float32 not in op.supported_dtypes("cpu"):
            _emit({"op": index, "key": key, "skip": "no float32 on cpu"})
            continue
        op_seed = zlib.crc32(key.encode())
        start = resume_sample if index == resume_op else 0
        limit = args.max_samples or None
        _emit({"begin": [index, -1], "key": key})  # sample generation (-1: no sample yet)
        try:
            torch.manual_seed(op_seed)
            samples = list(
                itertools.islice(
                    op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd),
                    limit,
                )
            )
        except Exception as exc:  # the sample generator itself failed
            _emit({"op": index, "key": key, "generator_error": _err(exc)})
            continue
        # The same samples generated for the device (same seed; the emulator draws from the
        # CPU generator), so tensors a sample keeps on CPU on purpose (tensor_split's indices)
        # stay there. A sample that differs from its CPU twin is moved from CPU instead.
        dev_samples: list = []
        try:
            torch.manual_seed(op_seed)
            dev_samples = list(
                itertools.islice(
                    op.sample_inputs(
                        args.device, torch.float32, requires_grad=op.supports_autograd
                    ),
                    limit,
                )
            )
        except Exception:
            dev_samples = []
        count = len(samples)
        for j, sample in enumerate(samples):
            if j < start:
                continue
            _emit({"begin": [index, j], "key": key})
            if args.abort_on and re.fullmatch(args.abort_on, key) and j == 0:
                os.abort()  # lets the tests check that an abort is caught and reported
            twin = dev_samples[j] if j < len(dev_samples) else None
            if twin is not None and not _same_sample(sample, twin):
                twin = None
            t0 = time.perf_counter()
            res = _sample_result(op, sample, args.device, op_seed + j, twin)
            res.update(op=index, sample=j, key=key, s=round(time.perf_counter() - t0, 4))
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
            "abort", "timeout",
        )
    )  # fmt: skip
    matched = counts["match"]
    supported = cpu_pass - counts["unsupported_layout"]
    per_op_bad = Counter(
        r["key"]
        for r in results
        if r["status"] in ("mismatch_forward", "mismatch_backward", "emu_error")
    )
    ops_done = {k for s in shards for k in s.ops_done.values()}
    return {
        "device": args.device,
        "narrow_64bit": not args.exact_64bit,
        "max_samples_per_op": args.max_samples or None,
        "jobs": args.jobs,
        "ops": len(ops_done),
        "ops_skipped": sorted({m["key"] for s in shards for m in s.skips}),
        "generator_errors": [m for s in shards for m in s.generator_errors],
        "samples": len(results),
        "counts": dict(counts),
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
            ("mismatch_forward", "mismatch_backward", "emu_error", "unsupported_layout"),
            args.top,
        ),
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
    p.add_argument("--max-samples", type=int, default=0, help="samples per op (0: all)")
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
