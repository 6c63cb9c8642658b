"""The lab itself: idempotent up, clean down, processes killed from outside, fake GPUs via real pynvml."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from autoheal.config.snapshot import snapshot_path
from autoheal_lab import procs
from autoheal_lab.cli import lab as lab_cli
from autoheal_lab.cluster import Lab


def _pids(lab: Lab):
    return {name: rec.pid for name, rec in lab.records().items()}


def test_up_twice_is_idempotent_and_down_stops_every_pid(lab_factory):
    handle = lab_factory(nodes=2, gpus=2, spares=1)
    lab = handle.lab
    first = _pids(lab)
    assert {"munged", "slurmctld", "slurmd-gpu1", "slurmd-gpu2"} <= set(first)
    lab.up(nodes=2, gpus=2, spares=1, hooks=False, xid_watch=False, install=False)
    assert _pids(lab) == first  # nothing restarted
    recs = lab.records()
    # a hook (root) leaves a config snapshot in the machine's /run/autoheal, named by the lab's config path
    snapshot = snapshot_path(str(lab.layout().autoheal_conf))
    os.makedirs(os.path.dirname(snapshot), mode=0o700, exist_ok=True)
    with open(snapshot, "wb") as fh:
        fh.write(b"{}")
    stopped = lab.down()
    assert set(stopped) == set(first)
    assert not any(procs.is_alive(r) for r in recs.values())
    assert not os.path.exists(snapshot)  # down removes it: no lab state outside the lab root
    assert lab.down() == []  # down with nothing up is fine


def test_down_kills_running_jobs_processes(lab_factory, tmp_path):
    """slurmstepd and the job's processes are not lab processes: `down` must not leave them running."""
    handle = lab_factory(nodes=1, gpus=1, spares=0)
    pidfile = tmp_path / "job.pid"
    res = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap",
                          f"trap '' TERM; echo $$ > {pidfile}; while true; do sleep 0.2; done"],
                         env=handle.env, capture_output=True, text=True, timeout=20, cwd="/tmp")
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pidfile.read_text())
    assert procs.proc_start_time(pid) is not None
    handle.lab.down()

    def running() -> bool:  # a zombie left to init is not running
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return ") Z " not in fh.read()
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(), f"job shell {pid} still running after lab down"


def test_down_with_no_lab_at_all(tmp_path):
    result = CliRunner().invoke(lab_cli, ["down", "--dir", str(tmp_path / "never")])
    assert result.exit_code == 0 and "nothing was running" in result.output
    status = CliRunner().invoke(lab_cli, ["status", "--dir", str(tmp_path / "never"), "--json"])
    assert status.exit_code == 1 and json.loads(status.output)["up"] is False


def test_process_killed_from_outside_is_seen_and_up_recovers(lab_factory):
    handle = lab_factory(nodes=2, gpus=2, spares=0)
    lab = handle.lab
    victim = lab.records()["slurmd-gpu2"]
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while procs.is_alive(victim) and time.monotonic() < deadline:
        time.sleep(0.05)
    st = lab.status()
    assert st["up"] is False
    assert [p["alive"] for p in st["processes"] if p["name"] == "slurmd-gpu2"] == [False]
    lab.up(nodes=2, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)
    st = lab.status()
    assert st["up"] is True
    assert {n["name"]: n["state"] for n in st["nodes"]}["gpu2"] == "IDLE"


def test_status_env_and_inject_through_cli(plain_lab):
    runner = CliRunner()
    d = str(plain_lab.root)
    st = json.loads(runner.invoke(lab_cli, ["status", "--dir", d, "--json"]).output)
    assert st["up"] and {p["name"] for p in st["processes"]} >= {"munged", "slurmctld", "slurmd-gpu1"}
    assert all(p["pid"] > 0 for p in st["processes"])
    env_out = runner.invoke(lab_cli, ["env", "--dir", d]).output
    assert f"export SLURM_CONF={plain_lab.layout.slurm_conf}" in env_out
    res = runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "gpu3", "--gpu", "5", "--xid", "79", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert "Xid (PCI:" in out["kernel_log"] and ": 79," in out["kernel_log"]
    assert out["kernel_log"] in plain_lab.layout.kernel_log("gpu3").read_text()
    try:
        probe = ("import json, pynvml as p\np.nvmlInit()\n"
                 "try:\n    p.nvmlDeviceGetTemperature(p.nvmlDeviceGetHandleByIndex(5), 0); r = 'ok'\n"
                 "except p.NVMLError_GpuIsLost:\n    r = 'lost'\n"
                 "print(json.dumps({'count': p.nvmlDeviceGetCount(), 'gpu5': r}))")
        env = dict(plain_lab.env, **plain_lab.lab.node_env("gpu3"))
        got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == {"count": 8, "gpu5": "lost"}
        # other nodes' GPUs are unaffected
        env1 = dict(plain_lab.env, **plain_lab.lab.node_env("gpu1"))
        got1 = subprocess.run([sys.executable, "-c", probe], env=env1, capture_output=True, text=True, timeout=30)
        assert json.loads(got1.stdout)["gpu5"] == "ok"
    finally:
        runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "gpu3", "--gpu", "5", "--clear"])


def test_inject_rejects_bad_input(plain_lab):
    runner = CliRunner()
    d = str(plain_lab.root)
    bad_node = runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "nope", "--xid", "79"])
    assert bad_node.exit_code == 2 and "no node 'nope'" in bad_node.output
    bad_gpu = runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "gpu1", "--gpu", "99", "--xid", "79"])
    assert bad_gpu.exit_code == 2
    both = runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "gpu1", "--xid", "79", "--lost"])
    assert both.exit_code == 2


def test_slurmd_restarted_in_a_time_namespace_is_still_stopped_by_down(lab_factory):
    """The lab's "reboot" restarts slurmd inside `unshare --time` (fresh boot time); /proc then shows its
    start time shifted for readers outside the namespace. `down` must still stop it by PID."""
    import shutil

    unshare = shutil.which("unshare")
    if not unshare:
        import pytest

        pytest.skip("unshare (util-linux) not installed")
    handle = lab_factory(nodes=1, gpus=1, spares=0)
    lab = handle.lab
    code = "from autoheal_lab.cluster import Lab; import sys; Lab(sys.argv[1]).start_slurmd(sys.argv[2])"
    res = subprocess.run([unshare, "--time", "--boottime", "-100", sys.executable, "-c", code, str(lab.root), "gpu1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rec = lab.records()["slurmd-gpu1"]
    assert procs.is_alive(rec)
    lab.down()
    deadline = time.monotonic() + 10
    while procs.proc_start_time(rec.pid) is not None and time.monotonic() < deadline:
        procs._reap(rec.pid)
        time.sleep(0.05)
    stat = open(f"/proc/{rec.pid}/stat").read() if procs.proc_start_time(rec.pid) is not None else ""
    assert stat == "" or ") Z " in stat  # gone (or a zombie awaiting its parent)


def _exports(text: str) -> dict:
    """The variables of `autoheal lab env` output, as the shell would set them."""
    import shlex

    out = {}
    for line in text.splitlines():
        key, _, value = line[len("export "):].partition("=")
        out[key] = shlex.split(value)[0]
    return out


def test_lab_env_is_all_autoheal_check_needs_and_clear_heals_every_gpu(plain_lab):
    """Issue 15: after `eval "$(autoheal lab env)"`, `autoheal check --node gpu1` said "NVML unavailable" on
    a healthy node; `lab inject --clear` without --gpu silently cleared GPU 0 only."""
    from autoheal_lab.fakenvml import state as gstate

    runner = CliRunner()
    d = str(plain_lab.root)
    lab_vars = ("LD_LIBRARY_PATH", "AUTOHEAL_FAKE_NVML_STATE", "AUTOHEAL_NODE", "SLURMD_NODENAME", "SLURM_CONF",
                "AUTOHEAL_CONFIG")
    shell = {k: v for k, v in os.environ.items() if k not in lab_vars}  # a fresh shell, then the eval
    shell.update(_exports(runner.invoke(lab_cli, ["env", "--dir", d]).output))

    def check(node):
        res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--node", node, "--no-drain",
                              "--json"], env=shell, capture_output=True, text=True, timeout=60, cwd="/tmp")
        return res.returncode, json.loads(res.stdout), res.stdout + res.stderr

    code, data, out = check("gpu1")
    assert code == 0 and "NVML unavailable" not in out, out
    assert data["gpus"] == 8
    try:
        for gpu in ("2", "6"):
            res = runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "gpu2", "--gpu", gpu, "--lost"])
            assert res.exit_code == 0, res.output
        code, _data, out = check("gpu2")
        assert code == 1 and "GPU 2 of gpu2" in out and "GPU 6 of gpu2" in out, out
        assert check("gpu1")[0] == 0  # each node sees its own GPUs
    finally:
        res = runner.invoke(lab_cli, ["inject", "--dir", d, "--node", "gpu2", "--clear"])
    assert res.exit_code == 0 and "every GPU" in res.output, res.output
    assert all(not g.lost for g in gstate.read_state(plain_lab.layout.gpu_state("gpu2")).gpus)
    assert check("gpu2")[0] == 0
    assert "every GPU of the node for --clear" in " ".join(runner.invoke(lab_cli, ["inject", "--help"]).output.split())


def test_up_starts_from_a_clean_state_unless_keep_state(lab_factory):
    """Issue 11: a lab reused a directory's Slurm state, journal, node and GPU state from the last run."""
    from autoheal.journal import Journal
    from autoheal_lab.fakenvml import state as gstate

    handle = lab_factory(nodes=1, gpus=2, spares=0)
    lab, slurm = handle.lab, handle.adapter(timeout=10)
    journal = Journal(handle.layout.path("journal", "journal.jsonl"))
    kwargs = dict(nodes=1, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)

    def dirty():
        slurm.drain("gpu1", "autoheal: xid 79 gpu 1: from the last run")
        journal.record("detection", node="gpu1", message="from the last run")
        gstate.inject(handle.layout.gpu_state("gpu1"), 1, "lost")

    dirty()
    lab.down()
    lab.up(keep_state=True, **kwargs)
    node = slurm.get_node("gpu1")
    assert node.drain and "from the last run" in node.reason
    assert [r.message for r in journal.read()] == ["from the last run"]
    assert gstate.read_state(handle.layout.gpu_state("gpu1")).gpus[1].lost
    lab.down()
    lab.up(**kwargs)
    node = slurm.get_node("gpu1")
    assert not node.drain and node.state == "IDLE", node
    assert list(journal.read()) == []
    assert not gstate.read_state(handle.layout.gpu_state("gpu1")).gpus[1].lost
