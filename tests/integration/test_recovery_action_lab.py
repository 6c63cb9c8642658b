"""XID 154 on the real lab (issue 22): NVML's GPU recovery action, served by the fake libnvidia-ml.so.1
(field 230, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) and read through the real pynvml, decides what autoheal
does when the driver says it changed: NONE nothing, GPU_RESET a drain and the GPU reset, DRAIN_P2P a
drain with no repair until the action changes, then the node back in service."""

from __future__ import annotations

import subprocess
import sys

from helpers import wait_for
from test_hooks_lab import journal, node_line, run_hook

from autoheal_lab.fakenvml import state as gstate
from autoheal_lab.gpus import inject

READ_FIELD = """
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex({gpu})
fv = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
print(fv.nvmlReturn, fv.value.uiVal)
"""


def read_recovery_action(handle, node: str, gpu: int) -> str:
    """The field as the real pynvml reads it from the node's fake NVML (what gather() reads)."""
    env = dict(handle.env)
    env.update(handle.lab.node_env(node))
    res = subprocess.run([sys.executable, "-c", READ_FIELD.format(gpu=gpu)], env=env, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def in_service(handle, node: str) -> bool:
    line = node_line(handle, node)
    return "State=IDLE " in line and "DRAIN" not in line


def test_xid_154_acts_on_nvmls_recovery_action(lab_factory):
    handle = lab_factory(nodes=2, gpus=2, hooks=True, xid_watch=True, hooks_conf={"resume_cooldown": 1.0})

    # NONE: the driver says the action changed back to nothing; journalled, never a drain
    inject(handle.lab, "gpu2", 1, "recovery-action", action=gstate.RECOVERY_NONE)
    assert read_recovery_action(handle, "gpu2", 1) == "0 0"
    wait_for(lambda: any(r["event"] == "detection" and (r.get("evidence") or {}).get("xid") == 154
                         and r["node"] == "gpu2" for r in journal(handle)), 20, "xid-watch to see XID 154")
    res, _ = run_hook(handle, "gpu2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert in_service(handle, "gpu2"), node_line(handle, "gpu2")

    # GPU_RESET: xid-watch reads the action at once and drains with its rung; the healthcheck resets
    inject(handle.lab, "gpu1", 1, "recovery-action", action=gstate.RECOVERY_GPU_RESET)
    assert read_recovery_action(handle, "gpu1", 1) == "0 1"
    wait_for(lambda: "Reason=autoheal: recovery-action: GPU 1 of gpu1" in node_line(handle, "gpu1"), 20,
             "xid-watch to drain gpu1 for the recovery action")
    assert "GPU reset required" in node_line(handle, "gpu1")
    drains = [r for r in journal(handle) if r["event"] == "drain" and r["node"] == "gpu1"]
    assert [r["source"] for r in drains] == ["xid-watch"], drains
    res, _ = run_hook(handle, "gpu1")
    assert res.returncode == 1, res.stdout + res.stderr
    resets = [r for r in journal(handle) if r["event"] == "remediation-step" and r["node"] == "gpu1"]
    assert [r["action"] for r in resets] == ["reset-gpu"] and "GPU 1 of gpu1" in resets[0]["message"], resets
    assert read_recovery_action(handle, "gpu1", 1) == "0 0"  # the lab's reset cleared it

    def back(node: str):
        def look() -> bool:
            if in_service(handle, node):
                return True
            run_hook(handle, node)  # passing checks, then our resume
            return False
        return look

    wait_for(back("gpu1"), 60, "gpu1 back in service after the reset", step=1.0)

    # DRAIN_P2P: drained (the jobs would leave), no repair, until the driver says something else
    inject(handle.lab, "gpu2", 0, "recovery-action", action=gstate.RECOVERY_DRAIN_P2P)
    wait_for(lambda: "drain P2P required" in node_line(handle, "gpu2"), 20, "gpu2 drained for drain P2P")
    for _ in range(2):
        res, _ = run_hook(handle, "gpu2")
        assert res.returncode == 1 and "DRAIN" in node_line(handle, "gpu2"), res.stdout + res.stderr
    assert not [r for r in journal(handle) if r["event"] == "remediation-step" and r["node"] == "gpu2"]
    inject(handle.lab, "gpu2", 0, "recovery-action", action=gstate.RECOVERY_NONE)  # P2P traffic drained
    wait_for(back("gpu2"), 60, "gpu2 back in service once the action is NONE", step=1.0)
