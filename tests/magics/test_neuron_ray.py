"""%%neuron --on ray://...: targets in Ray actors on a local cluster the tests start (loopback only).

One head node for the module (``ray start --head --block`` on 127.0.0.1, with fake ``neuron_cores``
and ``TPU`` resources, dashboard off), reached as a remote cluster through Ray Client, and ended in
the teardown. Skipped where Ray is not installed (``pip install neuron-workbench[ray]``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from neuron_workbench.testing import run_cell, user_ns_snapshot

NEURON_CELL = """
x = base.cuda().reshape(2, 4)
y = nw_ray_helpers.scale(x.sort(dim=1, descending=True).values)
m = x.argmax(dim=1)
"""

TPU_CELL = """
x = base.cuda().reshape(2, 4)
a = torch.special.i0(x)
b = x.kthvalue(2).values
"""

#: Ray's own settings for a loopback-only cluster with no usage reporting or token files.
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # node address 127.0.0.1, not the host's
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # A client's server process that dies as it starts (ray-project/ray#63202) is noticed after
    # this many seconds (default 30); the workbench then connects again.
    "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "15",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    if text.encode() in handle.read():
                        pids.append(int(name))
            except OSError:
                continue
    return pids


@pytest.fixture(scope="module")
def ray_cluster():
    """``ray://127.0.0.1:PORT`` of a one-node cluster with neuron_cores: 2 and TPU: 1."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install neuron-workbench[ray])")
    folder = tempfile.mkdtemp(prefix="nwray-")  # short: Ray's socket paths have a length limit
    port = _free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    log = open(os.path.join(folder, "head.log"), "w")  # noqa: SIM115 - closed in the teardown
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--port=0",
         f"--ray-client-server-port={port}", "--min-worker-port=0", "--max-worker-port=0",
         "--dashboard-port=0", "--dashboard-agent-listen-port=0", "--include-dashboard=false",
         "--num-cpus=2", '--resources={"neuron_cores": 2, "TPU": 1}',
         "--object-store-memory=80000000", "--disable-usage-stats", f"--temp-dir={folder}"],
        env={**os.environ, **RAY_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    patch = pytest.MonkeyPatch()
    for name, value in RAY_ENV.items():
        patch.setenv(name, value)
    try:
        deadline = time.monotonic() + 90
        while True:
            if head.poll() is not None:
                pytest.fail(f"ray start failed: {Path(folder, 'head.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the Ray head did not open its client port within 90 s")
                time.sleep(0.5)
        yield f"ray://127.0.0.1:{port}"
    finally:
        from neuron_workbench.testing import testing_shell

        shell = testing_shell()
        magics = shell.magics_manager.registry["NeuronMagics"]
        for pool in magics.session._ray_pools.values():
            pool.close()
        magics.session._ray_pools.clear()
        magics.cluster = ""
        magics.ray_resources = {}
        magics.ray_ready_timeout = 30.0
        import ray

        ray.shutdown()
        head.send_signal(signal.SIGTERM)  # --block stops the node's processes on SIGTERM
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in _processes_mentioning(folder):  # anything of this cluster still running
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        log.close()
        patch.undo()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def notebook_folder(tmp_path_factory):
    """A notebook's folder with a module of its own (one for the module: actors keep it)."""
    folder = tmp_path_factory.mktemp("notebook")
    (folder / "nw_ray_helpers.py").write_text("def scale(t):\n    return t * 3 - 1\n")
    return folder


@pytest.fixture
def ray_ip(ip, notebook_folder, monkeypatch, ray_cluster):
    """The shell, with a notebook module (imported from the working folder) the cells use."""
    monkeypatch.chdir(notebook_folder)
    monkeypatch.syspath_prepend(str(notebook_folder))
    run_cell(ip, "import os, time\nimport torch\nimport nw_ray_helpers\nbase = torch.arange(8.0)")
    yield ip
    sys.modules.pop("nw_ray_helpers", None)


def _report(ip, line: str, cell: str):
    run_cell(ip, f"%%neuron {line} -o r\n{cell}")
    return ip.user_ns["r"]


def _fallbacks(report):
    return sorted((e["op"], e["count"]) for e in report.target.fallbacks)


def _same_verdict(local, remote, where):
    assert remote.verdict == local.verdict
    assert remote.summary() == local.summary().replace(
        f"{local.target.backend.name} (emulated)",
        f"{local.target.backend.name} (emulated) on {where}",
    )
    assert _fallbacks(remote) == _fallbacks(local)
    assert (remote.target.error is None) == (local.target.error is None)
    if local.target.error is not None:
        assert remote.target.error.message == local.target.error.message
        assert remote.target.error.lineno == local.target.error.lineno


def test_a_plain_neuron_cell_imports_nothing_of_ray():
    code = textwrap.dedent(
        """
        import sys
        from neuron_workbench.testing import run_cell, testing_shell
        ip = testing_shell()
        run_cell(ip, "import torch")
        run_cell(ip, "%%neuron -o r\\ny = torch.ones(3, device='cuda') * 2")
        print(ip.user_ns["r"].verdict, "ray" in sys.modules,
              any(m.startswith("neuron_workbench.run.ray_") for m in sys.modules))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_WORKBENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "PASS False False"


@pytest.mark.timeout(240)
def test_neuron_and_tpu_on_ray_give_the_local_workers_verdicts(ray_ip, ray_cluster):
    ip, where = ray_ip, ray_cluster
    local = _report(ip, "--target neuron --executor worker", NEURON_CELL)
    local_y = ip.user_ns["y"].clone()
    remote = _report(ip, f"--target neuron --on {where}", NEURON_CELL)
    assert remote.verdict == "PASS" and _fallbacks(remote)  # sort and argmax fell back
    _same_verdict(local, remote, where)
    assert remote.summary().startswith(f"PASS neuron (emulated) on {where} vs cpu (as cuda)")
    assert remote.target.backend.details["ran_on"] == where
    assert remote.target.backend.details["ray_node"] == "127.0.0.1"
    # the cell's function came from the notebook's own module, shipped to the actor
    assert ip.user_ns["y"].tolist() == local_y.tolist()

    local_tpu = _report(ip, "--target tpu --executor worker", TPU_CELL)
    remote_tpu = _report(ip, f"--target tpu --on {where}", TPU_CELL)
    assert remote_tpu.verdict == "ERROR"  # TorchTPU's default: the first missing op raises
    assert "operator 'aten::i0.out' is not implemented for TPU" in remote_tpu.target.error.message
    _same_verdict(local_tpu, remote_tpu, where)

    # the full list of missing ops, from the actor too
    full = _report(ip, f"--target tpu --on {where} --list-fallbacks", TPU_CELL)
    assert full.verdict == "PASS"
    assert {e["op"] for e in full.target.fallbacks} == {"aten::i0", "aten::kthvalue"}
    assert "full list" in full.target.backend.details["fallback_mode"]
    assert full.options["list_fallbacks"] is True


@pytest.mark.timeout(120)
def test_on_ray_and_the_cluster_setting_use_the_connected_cluster(ray_ip, ray_cluster):
    ip, where = ray_ip, ray_cluster
    _report(ip, f"--target neuron --on {where}", "z = base.cuda() * 2")  # connects
    report = _report(ip, "--target neuron --on ray", "z = base.cuda() * 3")
    assert report.verdict == "PASS" and report.target.backend.details["ran_on"] == where
    ip.run_line_magic("config", f"NeuronMagics.cluster = {where!r}")
    try:
        report = _report(ip, "--target neuron", "z = base.cuda() * 4")
        assert report.target.backend.details["ran_on"] == where
        local = _report(ip, "--target neuron --on local", "z = base.cuda() * 4")
        assert "ran_on" not in local.target.backend.details
    finally:
        ip.run_line_magic("config", "NeuronMagics.cluster = ''")
    rows = [row for row in ip.run_line_magic("neuron_workers", "").rows if "@" in row.target]
    assert [row.target for row in rows if row.target.startswith("neuron@")] == [f"neuron@{where}"]
    assert all(row.alive and row.pid for row in rows)


@pytest.mark.timeout(120)
def test_a_resource_no_node_has_is_a_one_line_error_not_a_hang(ray_ip, ray_cluster):
    ip, where = ray_ip, ray_cluster
    ip.run_line_magic("config", "NeuronMagics.ray_resources = {'neuron': {'neuron_cores': 3}}")
    try:
        started = time.monotonic()
        with pytest.raises(UsageError) as info:
            run_cell(ip, f"%%neuron --target neuron --on {where}\nz = base.cuda()")
        assert time.monotonic() - started < 30
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"no node of {where} has neuron_cores: 3 for the neuron target")
        # A resource the cluster has, all of it in use: refused after the ready timeout.
        ip.run_line_magic("config", "NeuronMagics.ray_resources = {}")
        _report(ip, f"--target neuron --on {where}", "z = base.cuda()")  # holds a neuron core
        assert ip.user_ns["r"].verdict == "PASS"  # the actor the refused cell found still runs
        ip.run_line_magic(
            "config", "NeuronMagics.ray_resources = {'tpu': {'TPU': 1, 'neuron_cores': 2}}"
        )
        ip.run_line_magic("config", "NeuronMagics.ray_ready_timeout = 3.0")
        started = time.monotonic()
        with pytest.raises(UsageError, match=r"tpu actor on .* not ready within 3 s: no node had"):
            run_cell(ip, f"%%neuron --target tpu --on {where}\nz = base.cuda()")
        assert time.monotonic() - started < 30
    finally:
        ip.run_line_magic("config", "NeuronMagics.ray_resources = {}")
        ip.run_line_magic("config", "NeuronMagics.ray_ready_timeout = 30.0")


@pytest.mark.timeout(120)
def test_killing_the_actor_mid_run_gives_error_and_the_next_cell_works(ray_ip, ray_cluster):
    import ray

    ip, where = ray_ip, ray_cluster
    _report(ip, f"--target neuron --on {where}", "z = base.cuda()")  # the actor is up
    slot = ip.magics_manager.registry["NeuronMagics"].session.ray_pool(where).get("neuron")
    actor = slot._actor
    before = user_ns_snapshot(ip)

    def kill_when_running():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                _, line, _ = ray.get(actor.probe.remote(), timeout=5)
            except Exception:
                return
            if line == 4:  # in the cell's sleep (line 1 is %%neuron): the run has started
                time.sleep(1.5)  # the kernel looks at the actor every 0.5 s
                ray.kill(actor)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    report = _report(
        ip,
        f"--target neuron --on {where}",
        "w = base.cuda() + 1\nif os.environ.get('NEURON_WORKBENCH_WORKER'):\n    time.sleep(60)",
    )
    killer.join()
    assert report.verdict == "ERROR"
    error = report.target.error
    assert error.type == "TargetProcessDied"
    assert re.fullmatch(
        rf"target actor on {re.escape(where)} died \(ended with ray\.kill\); last seen at cell "
        r"line 4, after running aten::\S+",
        error.message,
    ), error.message
    # the kernel and its namespace are as they were (the report is the only new name)
    assert {k: v for k, v in user_ns_snapshot(ip).items() if k != "r"} == {
        k: v for k, v in before.items() if k != "r"
    }
    after = _report(ip, f"--target neuron --on {where}", "z = base.cuda() * 5")
    assert after.verdict == "PASS" and ip.user_ns["z"].tolist() == [5.0 * i for i in range(8)]


@pytest.mark.timeout(120)
def test_a_hung_target_on_ray_is_ended_after_the_timeout(ray_ip, ray_cluster):
    ip, where = ray_ip, ray_cluster
    started = time.monotonic()
    report = _report(
        ip,
        f"--target neuron --on {where} --timeout 3",
        "w = base.cuda() + 1\nif os.environ.get('NEURON_WORKBENCH_WORKER'):\n    time.sleep(60)",
    )
    assert report.verdict == "ERROR"
    assert re.fullmatch(
        rf"target actor on {re.escape(where)} timed out after 3 s at cell line 4, after running "
        r"aten::\S+; it was ended",
        report.target.error.message,
    ), report.target.error.message
    assert time.monotonic() - started < 30
