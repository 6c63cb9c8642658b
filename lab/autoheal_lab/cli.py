"""``autoheal lab``: a real multi-node Slurm cluster with fake GPUs on this machine."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import ClassVar, Dict, Tuple

import click

from autoheal.cliutil import handle_errors, json_option, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM


def dir_option(fn):
    return click.option("--dir", "lab_dir", type=click.Path(file_okay=False), envvar="AUTOHEAL_LAB_DIR",
                        help="Lab directory [env AUTOHEAL_LAB_DIR; default ~/.local/state/lab/autoheal_lab]. "
                             "Several labs can coexist in different directories.")(fn)


def _lab(lab_dir):
    from autoheal_lab.cluster import Lab

    return Lab(Path(lab_dir) if lab_dir else None)


class _LabGroup(click.Group):
    """Commands defined in their own modules load only when used (``autoheal.cli`` sits above the lab,
    so its LazyGroup cannot be imported here)."""

    LAZY: ClassVar[Dict[str, Tuple[str, str]]] = {"soak": ("autoheal_lab.soak_cli", "soak")}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def get_command(self, ctx, cmd_name):
        if cmd_name in self.LAZY:
            import importlib

            module, attr = self.LAZY[cmd_name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LabGroup)
def lab() -> None:
    """A local lab cluster: munge, slurmctld and one slurmd per node, fake GPUs, fake kernel logs.

    \b
      autoheal lab up                  start (installs Debian's Slurm if missing, as root)
      eval "$(autoheal lab env)"       use its Slurm from this shell (sinfo, squeue, sbatch)
      autoheal lab inject --node gpu1 --gpu 3 --xid 79
      autoheal lab status / down
      autoheal lab soak --seed 7       seeded compound faults, invariants checked
    """


@lab.command()
@dir_option
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 32), help="GPU nodes.")
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 16), help="Fake GPUs per node.")
@click.option("--spares", default=1, show_default=True, type=click.IntRange(0, 8),
              help="Spare nodes, defined in Slurm but held out of service for node replacement.")
@click.option("--slurm-defaults", is_flag=True, help="Leave out the recommended slurm.conf fragment.")
@click.option("--no-hooks", is_flag=True, help="Do not wire HealthCheckProgram/Prolog/Epilog to autoheal.")
@click.option("--no-xid-watch", is_flag=True, help="Do not run autoheal xid-watch on the nodes.")
@click.option("--no-install", is_flag=True, help="Fail instead of apt-installing missing Slurm packages.")
@click.option("--kube", is_flag=True, help="Also start Kubernetes: a real control plane (etcd, kube-apiserver, "
              "kube-controller-manager, built once per machine from Go modules; a Node and a slurmd pod per node; "
              "KUBECONFIG in `autoheal lab env`), the sync's Helm chart, `autoheal sync` with node remediation "
              "running as the chart's ServiceAccount, and the spare pool that fulfils replacement requests with "
              "the --spares nodes.")
@click.option("--spare-delay", default=1.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds the spare pool takes to 'provision' a replacement (with --kube).")
@click.option("--keep-state", is_flag=True, help="Keep the cluster state an earlier lab left in --dir (Slurm's "
              "jobs and node states, journal, node and GPU state, kernel logs, Kubernetes objects, spares used).")
@json_option
@handle_errors
def up(lab_dir, nodes, gpus, spares, slurm_defaults, no_hooks, no_xid_watch, no_install, kube,
       spare_delay, keep_state, as_json) -> None:
    """Start the lab (a lab already up is left as it is).

    A lab started in a directory that held an earlier one starts from a clean cluster state: Slurm's
    saved jobs and node states, the slurmd spools, the journal, node and fake GPU state, kernel logs,
    Kubernetes objects, the spare pool's bookkeeping and old drills are emptied (only those folders of
    the lab directory; a symlink leading out of it is refused). --keep-state keeps them. Configuration
    (etc/autoheal.toml, edits included), munge's key and the logs are always kept.

    \b
    The full replacement drill:
      autoheal lab up --kube --spares 1
      autoheal lab inject --node gpu1 --gpu 3 --xid 79
      autoheal lab kube-status        # gpu1: quarantined -> draining -> replacing -> done
    """
    status = _lab(lab_dir).up(nodes=nodes, gpus=gpus, spares=spares, slurm_defaults=slurm_defaults,
                              hooks=not no_hooks, xid_watch=not no_xid_watch, install=not no_install,
                              kube=kube, spare_delay=spare_delay, keep_state=keep_state)
    _print_status(status, as_json)


@lab.command()
@dir_option
@json_option
@handle_errors
def down(lab_dir, as_json) -> None:
    """Stop every lab process by PID (nothing up is fine)."""
    stopped = _lab(lab_dir).down()
    if as_json:
        print_json({"stopped": stopped})
    else:
        click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@lab.command("prometheus")
@dir_option
@handle_errors
def prometheus_cmd(lab_dir) -> None:
    """Start a real Prometheus (Debian's prometheus) on the running lab, with a node-exporter per node
    reading xid-watch's textfile and one for the guard's, evaluating autoheal's alert rules (every `for:`
    shortened to seconds); prints its URL (loopback). `autoheal lab down` stops them."""
    from autoheal_lab import prometheus as labprom

    click.echo(labprom.start(_lab(lab_dir)))


@lab.command()
@dir_option
@json_option
@handle_errors
def status(lab_dir, as_json) -> None:
    """Every lab process (pid, alive, log), the sync's /metrics URL (with --kube) and every node (state,
    GPU state file, kernel log). Exit 1 if not up."""
    st = _lab(lab_dir).status()
    _print_status(st, as_json)
    sys.exit(EXIT_OK if st["up"] else EXIT_PROBLEM)


def _print_status(st: dict, as_json: bool) -> None:
    if as_json:
        print_json(st)
        return
    click.echo(f"lab {st['dir']}: {'up' if st['up'] else 'not up'}")
    for p in st["processes"]:
        port = f"port {p['port']:<6}" if p.get("port") else " " * 11
        click.echo(f"  {p['name']:<24} pid {p['pid']:<8} {port} {'running' if p['alive'] else 'DEAD'}  {p['log']}")
    for name, url in sorted(st.get("metrics", {}).items()):
        click.echo(f"  metrics of {name}: {url}")
    for n in st["nodes"]:
        click.echo(f"  node {n['name']:<10} {n['state']:<22} gpus {n['gpu_state_file']}  kmsg {n['kernel_log']}")


@lab.command()
@dir_option
@handle_errors
def env(lab_dir) -> None:
    """Print exports for a shell: eval "$(autoheal lab env)".

    \b
    Then Slurm's commands (sinfo, squeue, sbatch), kubectl (with --kube) and autoheal use the lab:
      autoheal check --node gpu1 --no-drain    # gpu1's fake GPUs, its kernel log, the lab's config
    LD_LIBRARY_PATH gains the lab's fake libnvidia-ml.so.1, and AUTOHEAL_FAKE_NVML_STATE names the
    per-node GPU state with {node}: the fake library reads the GPUs of the node a process names with
    --node, else of $SLURMD_NODENAME or $AUTOHEAL_NODE (a job step on gpu2 sees gpu2's GPUs)."""
    for key, value in _lab(lab_dir).env().items():
        click.echo(f"export {key}={shlex.quote(value)}")


@lab.command()
@dir_option
@click.option("--node", required=True, help="Lab node, e.g. gpu1.")
@click.option("--gpu", type=int, help="GPU index on that node [default: GPU 0 for a fault; every GPU of the "
              "node for --clear].")
@click.option("--xid", type=int, help="Raise this XID (NVML event + kernel-log line), e.g. 79; any XID of "
              "NVIDIA's catalog (`autoheal xid table`).")
@click.option("--pid", type=click.IntRange(1), help="With --xid: the process the driver names (pid=...), e.g. a "
              "job's; its Slurm job is the one an application XID is recorded against.")
@click.option("--name", "proc_name", help="With --pid: the process name the driver names.")
@click.option("--ecc-dbe", "kind", flag_value="ecc-dbe", help="Uncorrectable (double-bit) ECC error.")
@click.option("--remap-failure", "kind", flag_value="remap-failure", help="Row-remap failure.")
@click.option("--remap-pending", "kind", flag_value="remap-pending", help="Row remap pending (reset needed).")
@click.option("--thermal", "kind", flag_value="thermal", help="Over-temperature with HW slowdown.")
@click.option("--lost", "kind", flag_value="lost", help="GPU lost (NVML_ERROR_GPU_IS_LOST), no XID.")
@click.option("--pcie-degraded", "kind", flag_value="pcie-degraded", help="PCIe link below max gen/width.")
@click.option("--nvlink-down", "kind", flag_value="nvlink-down", help="An NVLink link down.")
@click.option("--hang", "kind", flag_value="hang", help="NVML calls on this GPU hang.")
@click.option("--recovery-action", "action", type=click.IntRange(0, 0xFFFFFFFF),
              help="NVML's GPU recovery action becomes this value (nvml.h: 0 NONE, 1 GPU_RESET, 2 NODE_REBOOT, "
                   "3 DRAIN_P2P, 4 DRAIN_AND_RESET; 5-7 in newer headers), with the XID 154 the driver raises.")
@click.option("--clear", "kind", flag_value="clear", help="Heal the GPU (what a GPU reset does in the lab); "
              "without --gpu, every GPU of the node.")
@json_option
@handle_errors
def inject(lab_dir, node, gpu, xid, pid, proc_name, kind, action, as_json) -> None:
    """Break one fake GPU on one node (or --clear it: one GPU with --gpu, else all of the node's)."""
    from autoheal_lab.gpus import clear_all
    from autoheal_lab.gpus import inject as do_inject

    if action is not None:
        if kind or xid is not None:
            raise click.UsageError("give --recovery-action alone, not with --xid or another fault flag")
        kind = "recovery-action"
    if xid is not None and kind:
        raise click.UsageError("give either --xid or one fault flag, not both")
    if xid is None and not kind:
        raise click.UsageError("give --xid N or a fault flag (--ecc-dbe, --lost, --clear, ...)")
    if kind == "clear" and gpu is None:
        result = clear_all(_lab(lab_dir), node)
        if as_json:
            print_json(result)
        else:
            click.echo(f"{node}: cleared GPUs {', '.join(str(g) for g in result['gpus'])} (every GPU of the node)")
        return
    gpu = 0 if gpu is None else gpu
    if pid is not None and xid is None:
        raise click.UsageError("--pid goes with --xid")
    result = do_inject(_lab(lab_dir), node, gpu, "xid" if xid is not None else kind, xid=xid, pid=pid,
                       name=proc_name, action=action)
    if as_json:
        print_json(result)
    else:
        what = f"xid {xid}" if xid is not None else kind if action is None else f"recovery action {action}"
        click.echo(f"GPU {gpu} of {node}: {'cleared' if kind == 'clear' else 'injected ' + what}"
                   + (f"\n  kernel log: {result['kernel_log']}" if result["kernel_log"] else ""))


@lab.command()
@dir_option
@click.option("--slurm-defaults", is_flag=True,
              help="Run the lab without the recommended slurm.conf fragment, to see what it buys.")
@click.option("--no-kube", is_flag=True, help="Leave Kubernetes out (no API server, sync or spare pool).")
@click.option("--plain", is_flag=True, help="Submit with plain sbatch (the job does not opt in): it is still "
              "drained and requeued, but restarts from scratch.")
@click.option("--submitit", is_flag=True, help="Run a real submitit Checkpointable job (the recipe in "
              "sbatch_helpers/examples/submitit_job.py on its step's fake GPU, through autoheal sbatch; with --plain "
              "as plain submitit, which asks for --signal=USR2@<grace> and requeues itself). Needs submitit installed.")
@click.option("--hot-spare", is_flag=True, help="Submit with `autoheal sbatch --spare-nodes 1` (3 nodes, steps on "
              "2): the failed node is swapped for the spare inside the allocation, no requeue.")
@click.option("--keep", is_flag=True, help="Leave the lab up afterwards to explore.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), help="Also draw the timeline as a PNG.")
@click.option("--timeout", default=240.0, show_default=True, type=click.FloatRange(10, 3600),
              help="Seconds to wait for the phases before reporting the missing ones.")
@json_option
@handle_errors
def drill(lab_dir, slurm_defaults, no_kube, plain, submitit, hot_spare, keep, plot_file, timeout,
          as_json) -> None:
    """The XID 79 drill: a GPU dies under a 2-node training job; every healing phase, timed.

    Starts the lab from a clean state (3 GPU nodes x 8 fake GPUs + 1 spare, the recommended slurm.conf,
    hooks and xid-watch, and unless --no-kube the real Kubernetes control plane with `autoheal sync` and the
    spare pool; where Go is missing to build it, the drill says so in one line and runs without it, the
    Kubernetes phases marked "not run"; a lab already up in --dir is restarted, since an earlier fault would
    change the story),
    submits the example trainer with `autoheal sbatch`, waits for a checkpoint, injects XID 79 on the GPU
    one of its ranks holds, and stamps each phase from Slurm, the journal, the trainer's output and
    Kubernetes, each tied to this fault's node and job. The lab is torn down unless --keep, so drills
    can run again and again in one directory.

    The fault reaches the job as on real hardware: the trainers run on their steps' fake GPUs with a real
    allreduce each step (tiny_trainer --device lab --collective), so the broken rank's next GPU call
    fails and it cannot save, and its peer blocks in the collective (--plain too: Slurm's requeue then
    waits KillWait for the blocked rank). There is no kinder mode: the lab must not be kinder than the world.

    Each phase is stamped from its evidence's own clock (the journal record, the trainer's time=, Slurm's
    StartTime or reason time, a Kubernetes object's time) and the clock is printed next to it; "polled"
    marks evidence with no time of its own (the poll's time).

    --submitit: the same timeline for a real submitit Checkpointable job (one node, one fake GPU, the
    XID on that GPU): its next step fails and submitit's on-signal checkpoint cannot copy the state off
    the GPU, so the job (requeued through submitit's own handler) must resume from its last durable
    checkpoint before the fault (one every 10 steps).

    Every drill reports the lost steps (the newest step before the restart minus the step resumed from,
    from the trainers' own output) next to fault -> training resumed.

    \b
    Exit 0 every phase observed; 1 a phase missing or contradicted (e.g. resumed from the wrong step);
    2 bad usage or the lab could not start; 3 drill error: a probe raised, so the drill could not tell.
    """
    from autoheal_lab.drill import Drill, plot_timeline

    if plain and hot_spare:
        raise click.UsageError("--plain and --hot-spare exclude each other (hot spares need autoheal sbatch)")
    if submitit and hot_spare:
        raise click.UsageError("--submitit and --hot-spare exclude each other (the submitit drill runs one node)")
    if submitit:
        from autoheal_lab.drill_submitit import submitit_available

        if not submitit_available():
            raise click.UsageError("--submitit needs submitit: pip install submitit")
    the_lab = _lab(lab_dir)
    st = the_lab.load_state()
    restarted = bool(st and st.get("procs"))
    if restarted:
        the_lab.down()  # a lab that already ran (or has the other slurm.conf) would tell another story
    kwargs = dict(nodes=3, gpus=8, spares=1, slurm_defaults=slurm_defaults)
    not_run = ""
    if not no_kube and _lab_supports_kube():
        not_run = _kube_missing()
        if not_run:
            click.echo(f"autoheal lab drill: Kubernetes phases not run: {not_run}", err=True)
        else:
            kwargs.update(kube=True)
    try:
        the_lab.up(**kwargs)
        if submitit:
            from autoheal_lab.drill_submitit import SubmititDrill

            report = SubmititDrill(the_lab, opt_in=not plain, kube=not no_kube, phase_timeout=timeout,
                                   kube_not_run=not_run).run()
        else:
            report = Drill(the_lab, opt_in=not plain, kube=not no_kube, phase_timeout=timeout,
                           hot_spare=hot_spare, kube_not_run=not_run).run()
        if restarted:
            report.notes.append(f"the lab in {the_lab.root} was up: restarted it from a clean state")
        if not_run:
            report.notes.append(f"Kubernetes phases not run: {not_run}")
        elif not no_kube and not report.kube:
            report.notes.append("this lab has no Kubernetes side: Kubernetes phases were skipped")
    finally:
        if not keep:
            the_lab.down()
    if plot_file:
        plot_timeline(report, plot_file)
    if as_json:
        print_json(report.to_dict())
    else:
        from autoheal_lab.drill import render_timeline as _render

        click.echo(_render(report))
    sys.exit(report.exit_code)


def _kube_missing() -> str:
    """One line naming what to install when the real control plane cannot be built here, else ""."""
    from autoheal_lab import kube as labkube

    return labkube.cannot_start() or ""


def _lab_supports_kube() -> bool:
    import inspect

    from autoheal_lab.cluster import Lab

    return "kube" in inspect.signature(Lab.up).parameters


@lab.command("gpu-reset", hidden=True)
@dir_option
@click.option("--node", required=True)
@click.option("--gpu", required=True, type=int)
@handle_errors
def gpu_reset(lab_dir, node, gpu) -> None:
    """The lab's GPU reset command (the hooks' reset_command): clears the fake GPU's fault state."""
    from autoheal_lab.gpus import inject as do_inject

    do_inject(_lab(lab_dir), node, gpu, "clear")
    click.echo(f"GPU {gpu} of {node}: reset")



@lab.command("kube-status")
@dir_option
@json_option
@handle_errors
def kube_status(lab_dir, as_json) -> None:
    """Kubernetes view of a `lab up --kube` lab: Nodes (cordon, Ready, GPUHealthy, remediation state) and
    NodeReplacement requests. Exit 1 when the lab has no Kubernetes side."""
    from autoheal_lab import kube as labkube

    lab_ = _lab(lab_dir)
    if not (lab_.load_state() or {}).get("kubeconfig"):
        click.echo("this lab has no Kubernetes side: run `autoheal lab up --kube`", err=True)
        sys.exit(EXIT_PROBLEM)
    data = labkube.status(lab_)
    if as_json:
        print_json(data)
        return
    for n in data["nodes"]:
        click.echo(f"{n['name']:10} ready={n['ready']:7} cordoned={n['unschedulable']!s:5} "
                   f"GPUHealthy={n['gpu_healthy'] or '-':5} remediation={n['remediation'] or '-'}"
                   + (f" ({n['remediation_reason']})" if n["remediation_reason"] else ""))
    for r in data["replacements"]:
        click.echo(f"NodeReplacement {r['name']}: {r['status'].get('phase', 'requested')}"
                   + (f" -> {r['status']['replacementNode']}" if r["status"].get("replacementNode") else ""))


if __name__ == "__main__":
    lab()
