"""The hooks' whole process side by side with a baseline, in the same run (issue 24 section 6).

Each of ``autoheal-healthcheck``, ``-prolog`` and ``-epilog`` runs as a node runs it: the console script
of a plain (non-editable) install in a venv of its own, made here from this tree's wheel with the
interpreter this benchmark runs on (its base interpreter, not this venv: no editable finder, no test
tools' ``.pth`` files, none of the dev venv's site-packages), started as a fresh process on a lab node
with 8 fake GPUs behind the fake ``libnvidia-ml.so.1``, a healthy node: the pass Slurm pays for every
``HealthCheckInterval`` and before and after every job. The commands run interleaved, round after round,
so a machine that is busy is equally busy for all of them:

* ``python -c pass``: the node venv's interpreter start, the floor under any Python hook;
* LBNL NHC with four checks (its own config), when ``nhc`` is installed (``--nhc PATH``; Debian 12 has no
  package of it: install it from its source, github mej/nhc: ``nhc`` to /usr/sbin, ``scripts/*.nhc`` to
  /etc/nhc/scripts, ``helpers/*`` to /usr/libexec/nhc);
* ``bash, 4 NHC-style checks``: bash doing what NHC's four commonest checks do (``check_fs_mount_rw /``,
  ``check_hw_cpuinfo``, ``check_hw_physmem``, ``check_ps_service``: read /proc/mounts, /proc/cpuinfo,
  /proc/meminfo and one ``ps`` listing, parsed in bash loops), without NHC's driver and its function
  libraries: a floor under NHC's time, not NHC.

``--ref COMMIT`` (repeatable) adds the three hooks of another commit of this repository, installed the
same way in a venv of their own: before and after a change in one run, on a machine equally busy for
both. Each variant reads its own copy of the config (same text, its own path), so each has its own config
snapshot (``autoheal.config.snapshot``: one file per config path): sharing one, the variants would
overwrite each other's and every run of both would time the slow path (parse + validate). The snapshot is
written only by root: run as another user, every hook parses the TOML, and the output says so. Prints the
median wall time, CPU time and peak memory of each over ``--runs`` rounds (the machine's load, and per
config whether its snapshot was used). Nothing is asserted. Needs gcc + nvidia-nvml-dev (the fake NVML),
git, and setuptools and wheel in this interpreter (the wheels are built without build isolation: no network).

    python bench/bench_hook_startup.py [--runs 21] [--nhc /usr/sbin/nhc] [--ref COMMIT ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

#: The four checks, in NHC's own configuration syntax (``* || check ...``) and as bash without NHC.
NHC_CONF = """\
* || check_fs_mount_rw -f /
* || check_hw_cpuinfo {sockets}
* || check_hw_physmem 1kB 1PB
* || check_ps_service -u root init
"""
BASH_CHECKS = r"""
set -u
fail() { echo "ERROR: $*" >&2; exit 1; }
check_fs_mount_rw() { local dev mnt fs opts rest; while read -r dev mnt fs opts rest; do
    [[ $mnt == "$1" ]] && { [[ ,$opts, == *,rw,* ]] && return 0; fail "$1 not rw"; }; done < /proc/mounts
  fail "$1 not mounted"; }
check_hw_cpuinfo() { local n=0 line; while IFS= read -r line; do [[ $line == processor* ]] && n=$((n+1)); done \
    < /proc/cpuinfo; (( n == $1 )) || fail "$n cpus, not $1"; }
check_hw_physmem() { local k v u; while read -r k v u; do [[ $k == MemTotal: ]] && { (( v >= $1 )) && return 0;
    fail "memory $v kB"; }; done < /proc/meminfo; fail "no MemTotal"; }
check_ps_service() { local user cmd; while read -r user cmd; do [[ $user == "$1" && ${cmd##*/} == "$2" ]] && \
    return 0; done < <(ps -eo user=,comm=); fail "no $2 of $1"; }
check_fs_mount_rw /
check_hw_cpuinfo CPUS
check_hw_physmem 1
check_ps_service root PID1
"""


def node_env(tmp: Path) -> Dict[str, str]:
    """A lab node's hook environment: the fake libnvidia-ml.so.1 with 8 healthy GPUs, a kernel log, a
    config; no Slurm is asked on a healthy pass."""
    from autoheal_lab import fakenvml
    from autoheal_lab.fakenvml import state as gstate

    fakenvml.build_library(tmp / "lib")
    gstate.write_state(tmp / "n1.state", gstate.default_state("n1", 8))
    (tmp / "n1.kmsg").touch()
    (tmp / "ah.toml").write_text(f'[journal]\npath = "{tmp}/journal.jsonl"\njob_spool = "{tmp}/spool"\n'
                                 f'[hooks]\nstate_dir = "{tmp}/state/{{node}}"\n'
                                 f'kernel_log = "{tmp}/{{node}}.kmsg"\nexpected_gpus = 8\ndcgm_mapping_dir = ""\n')
    # slurmd's environment has no PYTHON* variables (a dev shell's PYTHONDONTWRITEBYTECODE, PYTHONPATH...)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return dict(base, AUTOHEAL_CONFIG=str(tmp / "ah.toml"), LD_LIBRARY_PATH=str(tmp / "lib"),
                AUTOHEAL_FAKE_NVML_STATE=str(tmp / "n1.state"), SLURMD_NODENAME="n1", SLURM_JOB_ID="1",
                SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_USER="bench", SLURM_JOB_NODELIST="n1")


def sockets() -> int:
    """CPU sockets as NHC's ``check_hw_cpuinfo`` counts them (its first argument is sockets, not CPUs:
    distinct ``physical id`` lines, else one per processor)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    ids = {ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("physical id")}
    return len(ids) or sum(1 for ln in lines if ln.startswith("processor")) or 1


def commands(tmp: Path, nhc: str, node_bin: Path) -> Dict[str, List[str]]:
    cpus = os.cpu_count() or 1
    pid1 = Path("/proc/1/comm").read_text().strip()
    script = tmp / "checks.sh"
    script.write_text(BASH_CHECKS.replace("CPUS", str(cpus)).replace("PID1", pid1))
    out = {"python -c pass": [str(node_bin / "python"), "-c", "pass"]}
    if nhc:
        conf = tmp / "nhc.conf"
        conf.write_text(NHC_CONF.format(sockets=sockets()).replace("init", pid1))
        out["LBNL NHC, 4 checks"] = [nhc, "-c", str(conf), "MARK_OFFLINE=0", "NHC_RM=none"]
    out["bash, 4 NHC-style checks"] = ["bash", str(script)]
    out.update(hook_commands(node_bin))
    return out


def hook_commands(node_bin: Path, label: str = "") -> Dict[str, List[str]]:
    """The console scripts Slurm runs (``HealthCheckProgram=/usr/local/bin/autoheal-healthcheck``): the
    script pip wrote, whose shebang is the node venv's interpreter. Never ``python -m`` (``runpy`` and the
    search of the current directory are not what a node pays)."""
    return {f"{hook}{label}": [str(node_bin / f"autoheal-{hook}")] for hook in HOOKS}


HOOKS = ("healthcheck", "prolog", "epilog")
REPO = Path(__file__).resolve().parent.parent


def source_tree(ref: str, dest: Path) -> Path:
    """A copy of this working tree as it is (``ref`` empty: tracked and untracked files git does not
    ignore), or of commit ``ref``'s files, in ``dest``: wheels are built from a copy, so a build never
    writes ``build/`` or ``*.egg-info`` into the tree."""
    dest.mkdir(parents=True)
    if ref:
        tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True,
                             check=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True, timeout=120)
        return dest
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=120).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = REPO / name
        if src.is_file():  # a tracked file deleted in the tree is not part of it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def node_venv(src: Path, dest: Path) -> Path:
    """A venv of the base interpreter holding only a plain install of ``src``'s wheel (the hooks need no
    third-party package on Python 3.11+), as an admin installs autoheal on a node; its ``bin``."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=300)
    wheels = Path(str(dest) + "-wheel")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
                   check=True, timeout=600, stdout=subprocess.DEVNULL)
    subprocess.run([*pip, "--python", str(dest / "bin" / "python"), "install", "--no-deps",
                    *(str(w) for w in sorted(wheels.glob("slurm_autoheal-*.whl")))],
                   check=True, timeout=600, stdout=subprocess.DEVNULL)
    return dest / "bin"


#: GNU time (Debian's ``time``) reports a child's own peak memory: wait4's ru_maxrss would include this
#: benchmark's memory at the fork (Linux keeps the high-water mark across exec).
GNU_TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else ""


def run_once(argv: List[str], env: Dict[str, str], rss_file: Path) -> Tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB, or NaN without GNU time) of one whole process."""
    full = [GNU_TIME, "-f", "%M", "-o", str(rss_file), *argv] if GNU_TIME else argv
    t0 = time.perf_counter()
    # cwd: the spool's folder, as slurmd's; never the source tree (python -m would import from it)
    proc = subprocess.Popen(full, env=env, cwd=rss_file.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv[:3])}: exit {code}: {err.strip()[:300]}")
    rss = float(rss_file.read_text().split()[-1]) / 1024.0 if GNU_TIME else float("nan")
    return wall, usage.ru_utime + usage.ru_stime, rss


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def snapshot_use(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, str]:
    """Per config: was its snapshot used over the measured rounds (there, and not rewritten)?"""
    if os.geteuid() != 0:
        return dict.fromkeys(before, "none: not root (only root writes one), every hook parsed the TOML")
    return {label: ("none: never written" if not after[label] else
                    "rewritten during the rounds: the slow path was timed" if before[label] != after[label] else
                    "used (unchanged over the rounds)") for label in before}


def measure(runs: int = 21, nhc: str = "", refs: Tuple[str, ...] = ()) -> dict:
    from autoheal.config.snapshot import snapshot_path

    tmp = Path(tempfile.mkdtemp(prefix="bench-hook-startup-"))
    snapshots: Dict[str, str] = {}
    try:
        env = node_env(tmp)
        cmds = commands(tmp, nhc, node_venv(source_tree("", tmp / "src"), tmp / "node"))
        envs = dict.fromkeys(cmds, env)
        snapshots["this tree"] = snapshot_path(env["AUTOHEAL_CONFIG"])
        for i, ref in enumerate(refs):
            src = source_tree(ref, tmp / f"src-{i}")
            own = tmp / f"ah-{i}.toml"  # its own config path: its own snapshot (see the module docstring)
            shutil.copyfile(env["AUTOHEAL_CONFIG"], own)
            snapshots[f"@{ref}"] = snapshot_path(str(own))
            hooks = hook_commands(node_venv(src, tmp / f"node-{i}"), f" @{ref}")
            cmds.update(hooks)
            envs.update({name: dict(env, AUTOHEAL_CONFIG=str(own)) for name in hooks})
        for name, argv in cmds.items():  # warm: .pyc files written, the fake library paged in, snapshots
            run_once(argv, envs[name], tmp / "rss")
        samples: Dict[str, List[Tuple[float, float, float]]] = {k: [] for k in cmds}
        load0 = os.getloadavg()[0]
        before = {label: _mtime(path) for label, path in snapshots.items()}
        for _ in range(runs):  # interleaved: each round runs every command once
            for name, argv in cmds.items():
                samples[name].append(run_once(argv, envs[name], tmp / "rss"))
        after = {label: _mtime(path) for label, path in snapshots.items()}
        load1 = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for path in snapshots.values():  # root's /run/autoheal: the configs they name are gone
            try:
                os.unlink(path)
            except OSError:
                pass
    rows = {name: {"wall_ms": round(statistics.median(s[0] for s in got) * 1000, 1),
                   "cpu_ms": round(statistics.median(s[1] for s in got) * 1000, 1),
                   "rss_mib": round(statistics.median(s[2] for s in got), 1)} for name, got in samples.items()}
    return {"runs": runs, "cpus": os.cpu_count(), "load_before": round(load0, 1), "load_after": round(load1, 1),
            "python": sys.version.split()[0], "nhc": nhc or "not installed", "refs": list(refs),
            "snapshot": snapshot_use(before, after), "results": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21, help="interleaved rounds (medians over them)")
    ap.add_argument("--nhc", default=shutil.which("nhc") or "", help="LBNL NHC's nhc, if installed")
    ap.add_argument("--ref", action="append", default=[], metavar="COMMIT",
                    help="also time the hooks of this commit, installed the same way (repeat for more): "
                    "before and after in one run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(args.runs, args.nhc, tuple(args.ref))
    if args.json:
        print(json.dumps(res))
        return
    print(f"{res['runs']} interleaved rounds, {res['cpus']} CPUs, load average {res['load_before']} -> "
          f"{res['load_after']}, Python {res['python']}, NHC: {res['nhc']}")
    for label, how in res["snapshot"].items():
        print(f"config snapshot, {label}: {how}")
    rows = res["results"]
    base = next((n for n in ("LBNL NHC, 4 checks", "bash, 4 NHC-style checks") if n in rows), "")
    for name, r in rows.items():
        ratio = (f"  {r['wall_ms'] / rows[base]['wall_ms']:.2f}x / {r['cpu_ms'] / rows[base]['cpu_ms']:.2f}x {base}"
                 f" (wall / cpu)" if base and name != base else "")
        print(f"{name:<30} wall {r['wall_ms']:7.1f} ms  cpu {r['cpu_ms']:7.1f} ms  rss {r['rss_mib']:5.1f} MiB{ratio}")


if __name__ == "__main__":
    main()
