"""The fake NVML's ``{node}`` state path: one exported value serves a whole lab (`autoheal lab env`).

The node comes from the process's ``--node`` argument, else $SLURMD_NODENAME, else $AUTOHEAL_NODE (the
order autoheal's hooks use); a name that could leave the state folder is never used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autoheal_lab import fakenvml
from autoheal_lab.fakenvml import state as st

# prints the serial of GPU 0 (it names the node: default_state derives it from the node name), or the
# error nvmlInit raised
PROBE = ("import json, sys, pynvml as n\n"
         "try:\n    n.nvmlInit()\n"
         "except n.NVMLError as e:\n    print(json.dumps({'error': type(e).__name__})); sys.exit()\n"
         "print(json.dumps({'serial': n.nvmlDeviceGetSerial(n.nvmlDeviceGetHandleByIndex(0))}))\n")


def _run(lib_dir: Path, template: str, args=(), **env_extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURMD_NODENAME", "AUTOHEAL_NODE")}
    env.update(LD_LIBRARY_PATH=str(lib_dir), **{fakenvml.STATE_ENV: template}, **env_extra)
    res = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_node_template_picks_the_node_of_the_process(lib_dir, tmp_path):
    serial = {}
    for node in ("gpu1", "gpu2", "gpu3"):
        state = st.default_state(node, 2)
        st.write_state(tmp_path / f"{node}.state", state)
        serial[node] = state.gpus[0].serial
    assert len(set(serial.values())) == 3
    tmpl = str(tmp_path / "{node}.state")

    assert _run(lib_dir, tmpl, ["--node", "gpu2"]) == {"serial": serial["gpu2"]}
    assert _run(lib_dir, tmpl, ["--node=gpu3"]) == {"serial": serial["gpu3"]}
    assert _run(lib_dir, tmpl, SLURMD_NODENAME="gpu1") == {"serial": serial["gpu1"]}
    assert _run(lib_dir, tmpl, AUTOHEAL_NODE="gpu3") == {"serial": serial["gpu3"]}
    # --node wins over the environment, $SLURMD_NODENAME over $AUTOHEAL_NODE (as in the hooks)
    assert _run(lib_dir, tmpl, ["--node", "gpu2"], SLURMD_NODENAME="gpu1") == {"serial": serial["gpu2"]}
    assert _run(lib_dir, tmpl, SLURMD_NODENAME="gpu1", AUTOHEAL_NODE="gpu3") == {"serial": serial["gpu1"]}
    # no node known, an unknown node, or a name that would leave the folder: no driver, never another file
    assert _run(lib_dir, tmpl) == {"error": "NVMLError_DriverNotLoaded"}
    assert _run(lib_dir, tmpl, ["--node", "gpu9"]) == {"error": "NVMLError_DriverNotLoaded"}
    (tmp_path / "sub").mkdir()
    st.write_state(tmp_path / "sub" / "x.state", st.default_state("x", 2))
    assert _run(lib_dir, str(tmp_path / "sub" / "{node}.state"), ["--node", "../sub/x"]) == \
        {"error": "NVMLError_DriverNotLoaded"}
    # a plain path (no {node}) is used as it is, whatever the node
    assert _run(lib_dir, str(tmp_path / "gpu1.state"), ["--node", "gpu2"]) == {"serial": serial["gpu1"]}
