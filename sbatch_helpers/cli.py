"""``autoheal sbatch`` (also installed as ``autoheal-sbatch``): submit a batch script under the job runner."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import click

from autoheal.cliutil import config_option, handle_errors, load_cfg, print_json
from autoheal.config.sbatch_section import SbatchSection, limits
from autoheal.errors import EXIT_PROBLEM, SlurmError
from autoheal.sbatch_helpers import wrapper

if TYPE_CHECKING:
    from autoheal.config import Config

_D = SbatchSection()  # the defaults the help names
CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False,
           "help_option_names": ["--help"], "max_content_width": 100}


@click.command("sbatch", context_settings=CONTEXT)
@click.option("--max-restarts", type=click.IntRange(*limits("max_restarts")), default=None,
              help="Restarts allowed before the job stops for good "
                   f"[config sbatch.max_restarts; default {_D.max_restarts}]. "
                   "The job also stops when two consecutive restarts resume from the same checkpoint step.")
@click.option("--checkpoint-dir", default=None, metavar="DIR",
              help="Checkpoint folder exported as AUTOHEAL_CHECKPOINT_DIR; %j %A %a %x %u expand like sbatch's "
                   "[default <submit dir>/autoheal-checkpoints/%j-TOKEN, TOKEN being random per submission, "
                   "so a new job that gets an old job id never shares its folder].")
@click.option("--grace", type=click.IntRange(*limits("grace")), default=None, metavar="SECONDS",
              help=f"Time to checkpoint between the grace signal and the requeue [default {_D.grace}].")
@click.option("--signal", "signal_name", default=None, metavar="SIG",
              help=f"Grace signal sent to the batch shell and forwarded to the job's processes [default {_D.signal}]; "
                   "sbatch syntax B:SIG@SECONDS also sets --grace.")
@click.option("--exclude-failed/--no-exclude-failed", default=None,
              help="After a node problem, add the node to the job's excluded nodes before it restarts "
                   "[default: on]. Your own --exclude is kept.")
@click.option("--notify", multiple=True, metavar="URL", help="Webhook told about each restart (repeatable).")
@click.option("--allow-foreign-checkpoint", is_flag=True, default=None,
              help="Resume also from checkpoints written by an earlier job that had the same job id (e.g. "
                   "before the cluster's job ids were reset). Refused by default: that is another job's "
                   "model state.")
@click.option("--spare-nodes", type=click.IntRange(*limits("spare_nodes")), default=None, metavar="K",
              help="Hot spares: ask for K nodes more than --nodes (and --no-kill); your srun lines run on the "
                   "others, and a node that fails is swapped for a spare in seconds, without a requeue "
                   f"[config sbatch.spare_nodes; default {_D.spare_nodes}]. See the researcher guide.")
@click.option("--min-nodes", type=click.IntRange(1, 100000), default=None, metavar="M",
              help="With --spare-nodes: an elastic job; once the spares are used up it goes on with fewer nodes "
                   "(at least M) instead of being requeued.")
@click.option("--watchdog", type=click.IntRange(*limits("watchdog")), default=None, metavar="SECONDS",
              help="Hang detection with no fault signal: a step whose ranks all stopped calling heartbeat() for "
                   "this long is ended and the job requeued from its newest checkpoint (cause 'hang'); jobs that "
                   f"never call heartbeat() are not watched. 0: off [config sbatch.watchdog; default {_D.watchdog}].")
@click.option("--hang-after-fault", type=click.IntRange(*limits("hang_after_fault")), default=None, metavar="SECONDS",
              help="After a grace signal, end the step once no rank advanced or saved for this long, instead of "
                   "waiting the whole --grace for ranks blocked in a collective "
                   f"[config sbatch.hang_after_fault; default {_D.hang_after_fault}].")
@click.option("--preload", default=None, metavar="MODULES",
              help="Warm interpreters: one per node (spares too) imports these modules (comma-separated, e.g. "
                   "torch,torch.optim,torch._dynamo) at the job's start; ranks started as 'srun autoheal-warm "
                   "python train.py' fork from it, so a restarted rank does not import them again. See the "
                   "researcher guide.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch command and the generated script; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the plan with --dry-run, else the job id).")
@config_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def sbatch(max_restarts: Optional[int], checkpoint_dir: Optional[str], grace: Optional[int], signal_name: Optional[str],
           exclude_failed: Optional[bool], notify: Tuple[str, ...], allow_foreign_checkpoint: Optional[bool],
           spare_nodes: Optional[int], min_nodes: Optional[int], watchdog: Optional[int],
           hang_after_fault: Optional[int], preload: Optional[str], dry_run: bool, as_json: bool,
           config_path: Optional[str], args: Tuple[str, ...]) -> None:
    """Submit SCRIPT like sbatch, with automatic checkpoint-requeue-resume.

    \b
    Usage: autoheal sbatch [WRAPPER OPTIONS] [SBATCH OPTIONS] SCRIPT [ARGS]...
           autoheal sbatch [WRAPPER OPTIONS] [SBATCH OPTIONS] --wrap "COMMAND"

    Every sbatch option and #SBATCH line works as usual. autoheal sbatch adds what requeueing needs
    (--requeue, --open-mode=append, --signal=B:USR2@GRACE, a job comment starting with autoheal-runner)
    and runs SCRIPT under a job runner that, for every run, exports

    \b
      AUTOHEAL_CHECKPOINT_DIR   where to save checkpoints
      AUTOHEAL_RESUME_FROM      newest valid checkpoint (unset on a fresh start)
      AUTOHEAL_RESTART_COUNT    0 on the first run
      AUTOHEAL_REQUEUE_REASON   why the previous run ended: time-limit, preemption,
                                node-failure, autoheal-drain, external-requeue, hang

    On the grace signal (node drained by autoheal, preemption, time limit near) the runner forwards the
    signal to your script (and through srun to every task), waits up to --grace seconds for it to save and
    exit, then requeues the job, away from a failed node. Ranks that call heartbeat() each step are
    watched: blocked after the signal (--hang-after-fault) or with no signal at all (--watchdog), the
    step is ended at once and the job resumes from its newest valid checkpoint.

    Defaults come from the config file's [sbatch] section, then "#AUTOHEAL --grace 300"-style lines in the
    script, then the command line.

    \b
    Examples:
      autoheal sbatch -N 2 --time=4:00:00 train.sh --lr 0.1
      autoheal sbatch --grace 300 --max-restarts 10 --notify https://hooks.example/x train.sh
      autoheal sbatch --dry-run train.sh        # review the command and generated script
      autoheal sbatch -N 8 --spare-nodes 1 train.sh   # 9 nodes; a failed one is swapped for the spare

    Each submission gets a random token (AUTOHEAL_SUBMIT_TOKEN). The default checkpoint folder contains it,
    and checkpoints saved with autoheal.sbatch_helpers.checkpoint record it: a job never resumes a
    checkpoint of an earlier job that had the same job id (say, before the cluster's job ids were reset)
    unless you ask for it with --allow-foreign-checkpoint.

    Exit codes: 0 submitted (sbatch's output is passed through; --parsable honoured), 1 sbatch refused the
    job (its message is shown), 2 bad script, option or config (also a script path or option value holding
    a newline or another control character).
    """
    cfg = load_cfg(config_path)
    sbatch_args, late, script, script_args = wrapper.split_command_line(args)
    overrides = _overrides({"max_restarts": max_restarts, "checkpoint_dir": checkpoint_dir, "grace": grace,
                            "signal": signal_name, "exclude_failed": exclude_failed, "notify": list(notify),
                            "allow_foreign_checkpoint": allow_foreign_checkpoint or None,
                            "spare_nodes": spare_nodes, "min_nodes": min_nodes, "watchdog": watchdog,
                            "hang_after_fault": hang_after_fault, "preload": preload}, late)
    plan = wrapper.build_plan(_request(cfg, sbatch_args, script, script_args, overrides))
    _show_or_submit(plan, cfg, dry_run, as_json)


def _show_or_submit(plan: wrapper.SubmitPlan, cfg: Any, dry_run: bool, as_json: bool) -> None:
    """--dry-run: print the plan; else submit it and pass sbatch's output (or the job id) through."""
    if dry_run:
        if as_json:
            print_json({"ok": True, "dry_run": True, **plan.to_dict()})
        else:
            click.echo(plan.render(), nl=False)
        return
    for w in plan.warnings:
        click.echo(f"autoheal sbatch: warning: {w}", err=True)
    out = _submit(plan, cfg)
    if as_json:
        print_json({"ok": True, "job_id": _job_id(out), "sbatch_output": out.strip()})
    else:
        click.echo(out, nl=False)


def _overrides(options: Dict[str, Any], late: Dict[str, Any]) -> Dict[str, Any]:
    """The wrapper options of the command line: those before the sbatch options (unset ones left out),
    then those found among the sbatch options (``late``: they win; --notify URLs add up)."""
    overrides = {k: v for k, v in options.items() if v not in (None, [])}
    for key, value in late.items():
        if key == "notify":
            overrides.setdefault("notify", [])
            overrides["notify"] = list(overrides["notify"]) + list(value)
        else:
            overrides[key] = value
    return overrides


def _request(cfg: Config, sbatch_args: List[str], script: Optional[str], script_args: Sequence[str],
             overrides: Dict[str, Any]) -> wrapper.SubmitRequest:
    """What to submit: the script (or --wrap command), the options and the [sbatch] defaults."""
    text, script_path = _script_text(sbatch_args, script, script_args)
    source = os.path.abspath(cfg.source) if cfg.source and os.path.exists(cfg.source) else None
    return wrapper.SubmitRequest(script_path=script_path, script_text=text, script_args=list(script_args),
                                 sbatch_args=sbatch_args, cli_overrides=overrides,
                                 defaults=wrapper.defaults_from_config(cfg.sbatch), python=sys.executable,
                                 config_path=source)


def _script_text(sbatch_args: Sequence[str], script: Optional[str],
                 script_args: Sequence[str]) -> Tuple[str, Optional[str]]:
    wrap = None
    opts, _ = wrapper.parse_sbatch_options(sbatch_args)
    for o in opts:
        if o.name == "wrap":
            wrap = o.value
    if wrap is not None:
        if script:
            raise wrapper.WrapperError(f"give either --wrap or a script, not both (got script {script!r})")
        return wrapper.wrap_script(wrap), None
    if not script:
        raise wrapper.WrapperError("no SCRIPT given (autoheal sbatch [OPTIONS] SCRIPT [ARGS]; see --help)")
    return wrapper.read_script(script), os.path.abspath(script)


def _submit(plan: wrapper.SubmitPlan, cfg: Config) -> str:
    from autoheal.slurm.binaries import find_binary

    binary = cfg.sbatch.sbatch or find_binary("sbatch", cfg.slurm.bin_dir)
    env = dict(os.environ)
    if cfg.slurm.slurm_conf:
        env["SLURM_CONF"] = cfg.slurm.slurm_conf
    argv = [binary, *plan.argv[1:]]
    try:  # bytes: a --wrap command or argument with invalid UTF-8 (kept as surrogate escapes) goes as it was
        res = subprocess.run(argv, input=plan.script.encode("utf-8", "surrogateescape"), capture_output=True,
                             env=env, timeout=cfg.sbatch.submit_timeout)
    except subprocess.TimeoutExpired:
        raise _Refused(f"sbatch did not answer within {cfg.sbatch.submit_timeout:g}s") from None
    except OSError as exc:
        raise _Refused(f"cannot run {binary}: {exc.strerror}") from None
    stdout = res.stdout.decode("utf-8", "replace")
    stderr = res.stderr.decode("utf-8", "replace")
    if res.returncode != 0:
        msg = " ".join((stderr or stdout).split())[:500] or f"exit code {res.returncode}"
        raise _Refused(f"sbatch refused the job: {msg}")
    if stderr:  # sbatch's warnings
        sys.stderr.write(stderr)
    return stdout


def _job_id(out: str) -> Optional[str]:
    import re

    m = re.search(r"(\d+)", out or "")
    return m.group(1) if m else None


class _Refused(SlurmError):
    exit_code = EXIT_PROBLEM


def main() -> None:
    """Console script ``autoheal-sbatch``."""
    sbatch(prog_name="autoheal-sbatch")
