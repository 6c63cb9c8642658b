"""Node-side healing against a real lab: real Slurm, fake NVML through the real pynvml."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from autoheal.lab import wiring
from autoheal.lab.fakenvml import state as gstate
from autoheal.lab.gpus import inject


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_hook(handle, node: str, module: str = "autoheal.hooks.healthcheck", extra_env=None, timeout=30):
    env = dict(handle.env)
    env.update(handle.lab.node_env(node))
    env.update(SLURMD_NODENAME=node, **(extra_env or {}))
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=timeout)
    return res, time.monotonic() - t0


def node_line(handle, node: str) -> str:
    return subprocess.run(["scontrol", "-o", "show", "node", node], env=handle.env, capture_output=True,
                          text=True, timeout=10).stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One 3-node lab with hooks wired, xid-watch running with a short grace window."""
    import os
    import shutil
    from types import SimpleNamespace

    from autoheal.lab.cluster import Lab

    if not shutil.which("slurmctld") and not os.path.exists("/usr/sbin/slurmctld") or os.geteuid() != 0:
        pytest.skip("needs Slurm installed and root (the lab runs Slurm daemons)")
    lab_ = Lab(tmp_path_factory.mktemp("hookslab"))
    lab_.up(nodes=3, gpus=8, spares=0, hooks=True, xid_watch=True, install=False)
    handle = SimpleNamespace(lab=lab_, layout=lab_.layout(), env=lab_.slurm_env())
    conf = handle.layout.autoheal_conf
    import re

    text = re.sub(r"(?m)^(grace_seconds|nvml_timeout) = .*\n", "", conf.read_text())
    conf.write_text(text.replace("[hooks]\n", "[hooks]\ngrace_seconds = 2.0\nnvml_timeout = 2.0\n"))
    for node in handle.layout.nodes:  # pick up the new config
        handle.lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node))
    yield handle
    handle.lab.down()


def test_healthcheck_drains_then_resumes_its_own_drain(lab):
    node = "gpu3"
    res, _ = run_hook(lab, node)
    assert res.returncode == 0, res.stderr
    inject(lab.lab, node, 2, "ecc-dbe")
    res, _ = run_hook(lab, node)
    assert res.returncode == 1
    line = node_line(lab, node)
    assert "DRAIN" in line and "Reason=autoheal: " in line, line
    # the node is drained and idle: the healthcheck runs the reset rung (the lab's gpu-reset)
    assert gstate.read_state(lab.layout.gpu_state(node)).gpus[2].ecc_volatile_uncorrected == 0

    def healthy_run_resumed():
        # resume needs 2 consecutive passes and the lab's 5 s cooldown: keep running the healthcheck
        res, _ = run_hook(lab, node)
        assert res.returncode == 0, res.stderr
        return "DRAIN" not in node_line(lab, node)

    wait_for(healthy_run_resumed, 20, "our drain to be resumed")
    journal = [json.loads(x) for x in open(lab.layout.root / "journal" / "journal.jsonl")]
    assert any(r["event"] == "resume" and r["node"] == node for r in journal)
    assert any(r["event"] == "remediation-step" and r["action"] == "reset-gpu" for r in journal)


def test_admin_drain_survives_healthy_runs(lab):
    node = "gpu3"
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=admin: bios update"],
                   env=lab.env, check=True, timeout=10)
    try:
        for _ in range(3):
            res, _ = run_hook(lab, node)
            assert res.returncode == 0
        assert "Reason=admin: bios update" in node_line(lab, node)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=lab.env, timeout=10)


def test_nvml_hang_gives_unknown_within_budget_and_no_drain(lab):
    node = "gpu3"
    gstate.inject(lab.layout.gpu_state(node), 4, "hang", hang_ms=20000)
    try:
        res, took = run_hook(lab, node)
        assert res.returncode == 2, res.stdout + res.stderr
        assert took < 2.0 + 3.0, took  # budget 2 s plus interpreter start and Slurm-free exit
        assert "unknown" in res.stderr
        assert "DRAIN" not in node_line(lab, node)
    finally:
        gstate.inject(lab.layout.gpu_state(node), 4, "clear")


def test_slurmctld_unreachable_exit_2_no_crash(lab, tmp_path):
    node = "gpu3"
    # a config whose Slurm points at a dead controller port: scontrol times out / is refused
    bad_conf = tmp_path / "slurm.conf"
    text = lab.layout.slurm_conf.read_text()
    import re

    bad_conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", text))
    (tmp_path / "gres.conf").write_text((lab.layout.slurm_conf.parent / "gres.conf").read_text())
    conf = tmp_path / "autoheal.toml"
    conf.write_text(lab.layout.autoheal_conf.read_text().replace(str(lab.layout.slurm_conf), str(bad_conf))
                    .replace("[hooks]\n", "[hooks]\nslurm_timeout = 1.0\n"))
    inject(lab.lab, node, 5, "pcie-degraded")  # no XID: xid-watch stays out of it
    try:
        res, _ = run_hook(lab, node, extra_env={"AUTOHEAL_CONFIG": str(conf), "SLURM_CONF": str(bad_conf)})
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        assert "DRAIN" not in node_line(lab, node)
    finally:
        gstate.inject(lab.layout.gpu_state(node), 5, "clear")
        run_hook(lab, node)


def test_xid_watch_drains_and_requeues_running_two_node_job(lab):
    out = subprocess.run(["sbatch", "--parsable", "-N2", "-w", "gpu1,gpu2", "--gres=gpu:2", "--requeue", "-o", "/dev/null",
                          "--wrap", "sleep 600"], env=lab.env, capture_output=True, text=True, timeout=10)
    job = out.stdout.strip().split(";")[0]
    assert job.isdigit(), out.stderr

    def job_field(key):
        text = subprocess.run(["scontrol", "-o", "show", "job", job], env=lab.env, capture_output=True,
                              text=True, timeout=10).stdout
        for tok in text.split():
            if tok.startswith(key + "="):
                return tok.split("=", 1)[1]
        return ""

    try:
        wait_for(lambda: job_field("JobState") == "RUNNING", 30, "the job to run")
        # the prologs have run once the DCGM mapping files name the job (they run at allocation)
        mapping = [lab.layout.root / "dcgm" / n / "0" for n in ("gpu1", "gpu2")]
        wait_for(lambda: all(m.exists() and job in m.read_text().split() for m in mapping), 30,
                 "the prologs to write the DCGM job mapping")
        t0 = time.monotonic()
        inject(lab.lab, "gpu1", 1, "xid", xid=79)
        wait_for(lambda: "DRAIN" in node_line(lab, "gpu1"), 10, "gpu1 to drain")
        assert time.monotonic() - t0 < 5
        assert "Reason=autoheal: xid 79 gpu 1 (0000:3b:00.0): fallen off the bus" in node_line(lab, "gpu1")
        wait_for(lambda: int(job_field("Restarts") or 0) >= 1, 30, "the job to be requeued")
        text = subprocess.run(["scontrol", "show", "job", job], env=lab.env, capture_output=True, text=True,
                              timeout=10).stdout
        assert "autoheal: requeued after xid 79 on gpu1" in text
        # replaying the same kernel-log record after an xid-watch restart is not acted on twice
        before = sum(1 for _ in open(lab.layout.root / "journal" / "journal.jsonl"))
        lab.lab.start_node_daemon("xid-watch-gpu1", "gpu1", wiring.xid_watch_argv("gpu1"))
        log = lab.layout.kernel_log("gpu1")
        last = log.read_text().splitlines()[-1]
        with open(log, "a") as fh:
            fh.write(last + "\n")
        time.sleep(1.5)  # give the restarted daemon time to (not) act
        after = [json.loads(x) for x in open(lab.layout.root / "journal" / "journal.jsonl")][before:]
        assert not [r for r in after if r["source"] == "xid-watch" and r["event"] in ("detection", "drain", "signal")], after
    finally:
        subprocess.run(["scancel", job], env=lab.env, timeout=10)
