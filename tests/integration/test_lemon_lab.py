"""A lemon on the real lab (issue 22 section 4): a GPU whose XID 95 comes back after every reset and
return to service is drained 'autoheal: lemon: 3 faults in 7 d (xid 95, 95, 95)' on the third time, and
stays drained however healthy it looks; `autoheal node history` shows the record."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from helpers import wait_for
from test_hooks_lab import node_line, run_hook

from autoheal_lab.gpus import inject


def journal_tail(handle, n=12):
    path = handle.layout.root / "journal" / "journal.jsonl"
    return [(r.get("event"), r.get("source"), r.get("message", "")[:100]) for r in
            (json.loads(x) for x in path.read_text().splitlines()[-n:])] if path.exists() else []


def set_hooks(handle, **values):
    path = handle.layout.autoheal_conf
    lines = path.read_text().splitlines()
    start = lines.index("[hooks]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    body = [ln for ln in lines[start + 1:end] if ln.split("=")[0].strip() not in values]
    body += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines[:start + 1] + body + lines[end:]) + "\n")


def test_gpu_that_keeps_failing_after_repairs_ends_a_lemon(lab_factory):
    handle = lab_factory(nodes=2, gpus=2, hooks=True)  # the healing wiring (fake NVML, RebootProgram)
    set_hooks(handle, lemon_faults=3, resume_cooldown=1.0)  # hook runs started from now read it
    node, gpu = "gpu1", 1
    for round_ in (1, 2):
        inject(handle.lab, node, gpu, "xid", xid=95)
        # reads the XID, drains the idle node and resets the GPU (the lab heals it)
        res, _ = run_hook(handle, node)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "xid 95 on GPU 1 of gpu1" in node_line(handle, node), node_line(handle, node)

        def back() -> bool:
            line = node_line(handle, node)
            if "State=IDLE " in line and "DRAIN" not in line and "REBOOT" not in line:
                return True
            run_hook(handle, node)  # the healthcheck: passes, then our resume
            time.sleep(1.0)
            return False

        wait_for(back, 60, f"{node} back in service after round {round_}")
        # the technician "repairs" it (and the defect stays): the ladder starts at a reset again
        env = dict(handle.env)
        env.update(handle.lab.node_env(node))
        subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--node", node, "--clear-faults"],
                       env=env, capture_output=True, text=True, timeout=30, check=True)
    inject(handle.lab, node, gpu, "xid", xid=95)
    run_hook(handle, node)
    state = handle.layout.root / "nodestate" / node / "state.json"
    assert "Reason=autoheal: lemon: 3 faults in 7 d (xid 95, 95, 95)" in node_line(handle, node), \
        (node_line(handle, node), journal_tail(handle), state.read_text())
    # healthy GPUs, passing checks: never returned. Passes on the lemon fail while its fault is open (a
    # lemon gets no repair rung, so they always would): the technician clears the faults, and then each
    # passing pass says it looked at the return and refused it (its resume action), so "still drained" is
    # the pass's answer, not a pass that never got that far
    env = dict(handle.env)
    env.update(handle.lab.node_env(node))
    subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--node", node, "--clear-faults"],
                   env=env, capture_output=True, text=True, timeout=30, check=True)
    for _ in range(3):
        res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--node", node, "--json"],
                             env=env, capture_output=True, text=True, timeout=60)
        passed = json.loads(res.stdout)
        assert passed["status"] == "ok", passed
        assert [a["outcome"] for a in passed["actions"] if a["action"] == "resume"] == \
            ["never: a lemon is not returned automatically"], passed
    assert "autoheal: lemon: 3 faults" in node_line(handle, node) and "DRAIN" in node_line(handle, node)
    res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "node", "history", node, "--json"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [e["event"] for e in out["history"]] == ["fault", "returned", "fault", "returned", "fault"], out
    assert out["lemon"] is True
