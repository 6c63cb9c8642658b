"""XID injected -> node shown DRAIN in Slurm, with xid-watch running on the lab: p50 / p95.

    python bench/bench_xid_drain.py [--runs 20] [--polled-runs 5] [--idle-seconds 60] [--json]

Each run injects XID 79 on a fake GPU, polls `sinfo`-equivalent state every 20 ms until the node is
drained with an autoheal reason, then heals the GPU and resumes the node. Prints figures only.

``--polled-runs N`` (default 0: off): a polled fault, a double-bit ECC count without its XID (nothing
for the XID path to see), on a lab with the hooks wired (HealthCheckInterval 30 s) -> DRAIN, N runs with
xid-watch's health poll on (``hooks.xid_watch_health_poll``, default 5 s) and N with it off (0: only the
healthcheck finds it). ``--idle-seconds S``: CPU seconds one idle xid-watch uses over S seconds, poll on
and off (``/proc/PID/stat`` utime + stime, node without jobs or faults).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path


def measure(runs: int = 20) -> dict:
    from autoheal import nodeops
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal_lab.cluster import Lab
    from autoheal_lab.gpus import inject

    lab = Lab(Path(tempfile.mkdtemp(prefix="autoheal-bench-xid-")))
    lab.up(nodes=3, gpus=8, spares=0, hooks=False, xid_watch=True, install=False)
    try:
        slurm = CliSlurm(env=lab.slurm_env())
        samples = []
        for i in range(runs):
            node = lab.layout().nodes[i % 3]
            t0 = inject(lab, node, i % 8, "xid", xid=79)["time"]
            _sample_drain(slurm, node, t0, samples, timeout=30, step=0.02)
            inject(lab, node, i % 8, "clear")
            nodeops.resume(slurm, node)
        return _percentiles(samples)
    finally:
        lab.down()


def _sample_drain(slurm, node: str, t0: float, samples: list, timeout: float, step: float) -> None:
    """Append the seconds from ``t0`` until ``node`` carries a drain of ours (nothing after ``timeout``)."""
    from autoheal.reasons import is_ours

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = slurm.get_node(node)
        if n.drain and is_ours(n.reason):
            samples.append(time.time() - t0)
            return
        time.sleep(step)


def _percentiles(samples: list) -> dict:
    samples = sorted(samples)
    if not samples:
        return {"runs": 0}
    return {"runs": len(samples), "p50_s": round(statistics.median(samples), 3),
            "p95_s": round(samples[max(0, int(0.95 * len(samples)) - 1)], 3), "max_s": round(samples[-1], 3)}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def measure_polled(runs: int, idle_seconds: float) -> dict:
    """Polled fault -> DRAIN with the health poll on and off; idle CPU of xid-watch, poll on and off."""
    import re
    import subprocess
    import sys

    from autoheal import nodeops
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal_lab import procs, wiring
    from autoheal_lab.cluster import Lab
    from autoheal_lab.fakenvml import state as gstate

    lab = Lab(Path(tempfile.mkdtemp(prefix="autoheal-bench-polled-")))
    lab.up(nodes=3, gpus=8, spares=0, hooks=True, xid_watch=True, install=False)
    out: dict = {}
    try:
        lay = lab.layout()
        slurm = CliSlurm(env=lab.slurm_env())
        conf = lay.autoheal_conf
        original = conf.read_text()

        def set_poll(seconds: float) -> None:
            text = re.sub(r"(?m)^xid_watch_health_poll = .*\n", "", original)
            conf.write_text(text.replace("[hooks]\n", f"[hooks]\nxid_watch_health_poll = {seconds}\n", 1))
            for node in lay.nodes:
                procs.stop(lab.records()[f"xid-watch-{node}"])
                lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node))
            time.sleep(2.0)  # started and past its first loop

        def heal(node: str, gpu: int) -> None:
            gstate.inject(lay.gpu_state(node), gpu, "clear")
            env = dict(lab.slurm_env(), **lab.node_env(node))
            subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node],
                           env=env, capture_output=True, timeout=60)
            nodeops.resume(slurm, node)

        k = 0
        rng = random.Random(1)
        for mode, seconds in (("poll_on", 5.0), ("poll_off", 0.0)):
            set_poll(seconds)
            if idle_seconds > 0:
                pid = lab.records()[f"xid-watch-{lay.nodes[0]}"].pid
                c0 = _cpu_seconds(pid)
                time.sleep(idle_seconds)
                out[f"idle_cpu_s_{mode}"] = round(_cpu_seconds(pid) - c0, 3)
                out["idle_seconds"] = idle_seconds
            samples = []
            for _ in range(runs):
                node, gpu = lay.nodes[k % 3], (k // 3) % 8
                k += 1
                # a random phase against the poll and the 30 s HealthCheckInterval: back-to-back runs would
                # otherwise each start right after the previous drain, at the same point of the cycle
                time.sleep(rng.uniform(0, seconds or 30.0))
                t0 = time.time()
                with gstate.update_state(lay.gpu_state(node)) as st:
                    st.gpus[gpu].ecc_volatile_uncorrected += 1
                    st.gpus[gpu].ecc_aggregate_uncorrected += 1
                _sample_drain(slurm, node, t0, samples, timeout=90, step=0.05)
                heal(node, gpu)
                time.sleep(1.0)  # the poll sees the healed GPU (and a fault on the next node is its own)
            out[mode] = dict(_percentiles(samples), samples=[round(x, 2) for x in samples])
        conf.write_text(original)
        return out
    finally:
        lab.down()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--polled-runs", type=int, default=0, help="polled-fault runs per mode (poll on / off)")
    ap.add_argument("--idle-seconds", type=float, default=0.0, help="measure idle xid-watch CPU over this long")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(args.runs) if args.runs > 0 else {}
    if args.polled_runs > 0 or args.idle_seconds > 0:
        res["polled"] = measure_polled(args.polled_runs, args.idle_seconds)
    if args.json:
        print(json.dumps(res))
        return
    if res.get("runs"):
        print(f"XID 79 -> DRAIN ({res['runs']} runs): p50 {res['p50_s']:.3f} s  p95 {res['p95_s']:.3f} s  "
              f"max {res['max_s']:.3f} s  (target p95 <= 2 s; periodic health checks every 300 s average 150 s)")
    pol = res.get("polled") or {}
    for mode, label in (("poll_on", "health poll every 5 s"), ("poll_off", "poll off: healthcheck every 30 s")):
        r = pol.get(mode) or {}
        if r.get("runs"):
            print(f"polled DBE (no XID) -> DRAIN, {label} ({r['runs']} runs): p50 {r['p50_s']:.3f} s  "
                  f"p95 {r['p95_s']:.3f} s  max {r['max_s']:.3f} s")
        if f"idle_cpu_s_{mode}" in pol:
            print(f"idle xid-watch CPU, {label}: {pol[f'idle_cpu_s_{mode}']:.3f} s over {pol['idle_seconds']:g} s")


if __name__ == "__main__":
    main()
