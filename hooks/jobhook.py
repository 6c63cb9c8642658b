"""The shared body of the prolog and epilog: a fast, cheap pass, drain on failure, DCGM mapping.

Exit codes are what Slurm acts on, so they follow one rule: 1 only for a GPU fault found on this node
(our drain reason is set first, so Slurm keeps it and requeues the job; the epilog, whose job has
ended, exits 1 only when our drain could not be set); 0 for everything else, our own trouble
included (a config that does not load or crashes the loader, a state dir that is read-only or full,
a lock held by a stuck hook, a bug): that is journalled (stderr when the journal cannot be
written), never a traceback, and never a "Prolog error" drain autoheal would not own.
"""

from __future__ import annotations

import os
import sys
import time

from autoheal.events import Event
from autoheal.hooks import checks as C

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Optional

    from autoheal.hooks.context import Context
    from autoheal.hooks.gather import NodeSample


def run(kind: str) -> int:
    """``kind`` is "prolog" or "epilog". Exit 0 ok (or unknown, or our own trouble), 1 a GPU fault."""
    from autoheal.hooks.context import Context, report_own_trouble

    try:
        ctx = Context.load(kind)
    except Exception as exc:  # ConfigError, and whatever a broken config makes the loader raise
        report_own_trouble(kind, None, "config", exc)
        return 0  # a config problem must not fail every job; the healthcheck reports it too (exit 2)
    try:
        code = _run(ctx, kind)
        if ctx.store.trouble:
            report_own_trouble(kind, ctx, "node state", ctx.store.trouble)
        return code
    except Exception as exc:
        report_own_trouble(kind, ctx, "internal error", exc)
        return 0
    finally:
        ctx.close()


def _run(ctx: Context, kind: str) -> int:
    from autoheal.hooks import mapping
    from autoheal.hooks.context import report_own_trouble
    from autoheal.hooks.engine import observe

    job = os.environ.get("SLURM_JOB_ID", "")
    job = job if job.isdigit() else ""
    h = ctx.hooks
    mapping_dir = ctx.path(h.dcgm_mapping_dir)
    if kind == "epilog" and job and mapping_dir:
        try:
            trouble = mapping.remove_job(mapping_dir, job, str(ctx.store.dir))
        except (OSError, ValueError) as exc:  # a read-only or full mapping dir: the job's end goes on
            trouble = f"{type(exc).__name__}: {exc}"
        if trouble:
            report_own_trouble(kind, ctx, f"dcgm mapping {mapping_dir}", trouble)
    if kind == "epilog" and job:
        _job_records(ctx)
        _memory_tier(ctx, job)
    failure = None
    # Our drain on record while Slurm has the node in service: someone resumed it. That resume ends the
    # faults behind our drain; the GPUs are then checked in full, live (engine.accept_resume).
    resumed = _accept_resume(ctx, kind)
    if kind == "prolog" and not resumed:
        last = ctx.store.read().get("last_result") or {}
        if last.get("status") == C.FAIL and time.time() - float(last.get("time", 0)) <= h.prolog_max_age:
            fails = [C.CheckResult.from_dict(r) for r in last.get("results", []) if r.get("status") == C.FAIL]
            failure = C.worst_failure(fails)
    if failure is None:
        p = observe(ctx, h.prolog_nvml_timeout, cheap=not resumed)
        failure = C.worst_failure(p.results)
        if p.sample is not None and job:
            _baseline(ctx, kind, job, p.sample)
    if failure is not None:
        drained = _fail(ctx, kind, job, failure)
        # A failed prolog is how Slurm requeues the job off this node: always 1. A failed epilog only makes
        # Slurm drain the node "Epilog error" (the job has ended), which is worth it only as a fallback when
        # our own drain is not in place. Once it is, exit 0: an admin who resumes the node in the moment
        # before this epilog ends would otherwise get an "Epilog error" drain that autoheal never owns.
        return 1 if kind == "prolog" or not drained else 0
    if kind == "prolog" and job and mapping_dir:
        _write_mapping(ctx, job, mapping_dir)
    if kind == "prolog" and job:  # after the checks: trouble of its own never keeps a GPU fault unseen
        sweep_memory_tier(ctx, kind, job)
    return 0


def _job_records(ctx: Context) -> None:
    """Move the records the job's runner left in the node's spool (as the job's user) into the journal
    and the webhooks, as that user's text (``autoheal/job_records.py``). Never fails the epilog."""
    if _spool_is_empty(ctx.cfg.journal.job_spool):
        return  # the common case: the job left nothing (and job_records, pathlib are not imported)
    from autoheal import job_records

    notifier = None
    try:
        ident = job_records.JobIdentity.from_env(dict(os.environ))
        if ident is None:
            return
        found = job_records.collect(ctx.cfg.journal.job_spool, ident, ctx.node)
        for problem in found.problems:
            print(f"autoheal: warning: job {ident.job_id}'s records: {problem}", file=sys.stderr)
        for rec in found.records:
            ctx.journal.append(rec)  # JournalError: the files stay for the next epilog (at least once)
            if rec.severity != "info" and ctx.cfg.notify.webhooks:
                if notifier is None:
                    from autoheal.notify import Notifier

                    notifier = Notifier.from_config(ctx.cfg, ctx.journal)
                notifier.send(rec)
        job_records.remove(found.files)
    except Exception as exc:  # the job's records are worth a warning, never an epilog failure
        print(f"autoheal: warning: job records: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        if notifier is not None:
            notifier.flush(min(5.0, ctx.cfg.notify.timeout))


def _spool_is_empty(spool: str) -> bool:
    """True only for a spool that is root's folder and holds nothing: nothing to move. Missing (collect
    creates it), another owner's, not a folder, or any error: False, and collect says why."""
    import stat

    try:
        st = os.lstat(spool)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            return False
        with os.scandir(spool) as entries:
            return next(entries, None) is None
    except (OSError, ValueError):
        return False


def _memory_tier(ctx: Context, job: str, kind: str = "epilog") -> None:
    """The epilog: kill the job's memory-tier agent and free its copies in node memory unless Slurm
    requeued it; the prolog (and the healthcheck, ``job`` ""): free the copies of jobs that are over and
    left them here, so that no job starts beside them and an idle node does not hold them
    (``autoheal/memtier_files.py``). Costs one listing of the memory folder when no user has one here:
    the cleanup's module is imported only when some user does."""
    from autoheal import memtier_base

    uid = os.environ.get("SLURM_JOB_UID", "") if kind == "epilog" else ""
    if (kind == "epilog" and not uid.isdigit()) or not memtier_base.user_ids(ctx.node):
        return
    from autoheal import memtier_files
    from autoheal.errors import SlurmError, SlurmNotFound

    def facts_of(job_id: str) -> Optional[memtier_files.JobFacts]:
        try:
            found = ctx.slurm.get_job(job_id)
        except SlurmNotFound:
            return ("GONE", 0)
        except SlurmError:
            return None
        return (found.state, found.restart_count)

    try:
        if kind == "epilog":
            lines = memtier_files.epilog_cleanup(ctx.node, int(uid), job, facts_of)
        else:
            lines = memtier_files.sweep_over(ctx.node, facts_of, job)
        for line in lines:
            print(f"autoheal-{kind}: {line}", file=sys.stderr)
    except OSError as exc:  # a hostile or broken folder: the job's start or end goes on
        print(f"autoheal-{kind}: warning: memory tier cleanup: {exc}", file=sys.stderr)


def sweep_memory_tier(ctx: Context, kind: str, job: str = "") -> None:
    """The prolog's and the healthcheck's part (``job``: the prolog's own, kept): free the copies of jobs
    that are over on this node, before a job starts beside them and on an idle or drained node
    (HealthCheckProgram runs there too). Never fails the hook: its trouble is reported."""
    from autoheal.hooks.context import report_own_trouble

    try:
        _memory_tier(ctx, job, kind)
    except Exception as exc:  # our own trouble: reported, the hook's verdict on the GPUs stands
        report_own_trouble(kind, ctx, "memory tier sweep", exc)


def _accept_resume(ctx: Context, kind: str) -> bool:
    """``engine.accept_resume``: True when the record of an earlier drain of ours was forgotten because
    the node was resumed since. Slurm not answering is "could not tell": the record stands."""
    from autoheal.errors import SlurmError
    from autoheal.hooks.engine import accept_resume

    try:
        return accept_resume(ctx) is not None
    except SlurmError as exc:
        print(f"autoheal-{kind}: could not tell whether {ctx.node} was resumed: {exc}", file=sys.stderr)
        return False


def _fail(ctx: Context, kind: str, job: str, failure: C.CheckResult) -> bool:
    """A GPU fault: drain first (healing never waits for a record or a webhook), then journal. True when
    the node is drained now (by this call, an earlier drain of ours, or someone else's drain)."""
    from autoheal import nodeops
    from autoheal.errors import SlurmError
    from autoheal.hooks.engine import drain_for

    print(f"autoheal-{kind}: {ctx.node}: {failure.text}", file=sys.stderr)
    drained = False
    try:
        act = drain_for(ctx, failure)
        drained = act.outcome in (nodeops.DRAINED, nodeops.REASON_UPDATED, nodeops.SKIPPED_SAME,
                                         nodeops.SKIPPED_FOREIGN)
    except SlurmError as exc:
        print(f"autoheal-{kind}: could not drain: {exc}", file=sys.stderr)
    except Exception as exc:  # the fault stands: exit 1 all the same, and say what went wrong
        print(f"autoheal-{kind}: could not drain: {type(exc).__name__}: {exc}", file=sys.stderr)
    ctx.record(Event.DETECTION, job_ids=[job] if job else [], check=failure.check, action=f"{kind}-fail",
               message=failure.text, severity="action", evidence=failure.evidence)
    return drained


def _write_mapping(ctx: Context, job: str, mapping_dir: str) -> None:
    from autoheal.hooks import mapping
    from autoheal.hooks.context import report_own_trouble

    gpus = mapping.job_gpus(os.environ, ctx.node, ctx.slurm, ctx.hooks.prolog_slurm_timeout)
    if gpus:
        try:
            trouble = mapping.add_job(mapping_dir, job, gpus, str(ctx.store.dir))
        except (OSError, ValueError) as exc:  # a read-only or full mapping dir: the job starts all the same
            trouble = f"{type(exc).__name__}: {exc}"
        if trouble:  # the lock's trouble (the mapping was written without it), or the write's
            report_own_trouble("prolog", ctx, f"dcgm mapping {mapping_dir}", trouble)


def _baseline(ctx: Context, kind: str, job: str, sample: NodeSample) -> None:
    """Prolog stores the job's starting ECC counts; epilog fails a GPU whose count rose during the job."""
    counts = {str(g.index): g.ecc_dbe_volatile for g in sample.gpus if g.ecc_dbe_volatile is not None}
    with ctx.store.locked() as st:
        base = st.setdefault("job_baseline", {})
        if kind == "prolog":
            base[job] = counts
            if len(base) > 500:
                for old in list(base)[:-500]:
                    base.pop(old, None)
        else:
            before = base.pop(job, None) or {}
            rose = [i for i, n in counts.items() if i in before and n is not None and n > (before[i] or 0)]
            if rose:
                where = C.gpu_label(None, int(rose[0]), node=ctx.node)
                st.setdefault("faults", []).append({"check": "ecc", "gpu": int(rose[0]), "action": C.RESET,
                                                    "reason": f"ecc: {where}: uncorrectable ECC errors "
                                                    f"during job {job}", "since": time.time()})


def main(kind: str, doc: Optional[str] = None) -> None:
    from autoheal.hooks.hookargs import early_exit

    asked = early_exit(f"autoheal-{kind}", doc, sys.argv[1:])
    if asked is not None:
        sys.exit(asked)
    try:
        code = run(kind)
    except BaseException as exc:  # last line of defence: Slurm must see 0, never a traceback
        print(f"autoheal-{kind}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
