"""The shared body of the prolog and epilog: a fast, cheap pass, drain on failure, DCGM mapping."""

from __future__ import annotations

import os
import sys
import time

from autoheal.hooks import checks as C


def run(kind: str) -> int:
    """``kind`` is "prolog" or "epilog". Exit 0 ok (or unknown: jobs are not blocked on a guess),
    1 failed (our drain reason is set first, so Slurm keeps it and requeues the job)."""
    from autoheal.errors import AutohealError, SlurmError
    from autoheal.hooks import mapping
    from autoheal.hooks.context import Context
    from autoheal.hooks.engine import drain_for, observe

    try:
        ctx = Context.load(kind)
    except AutohealError as exc:
        print(f"autoheal-{kind}: error: {exc}", file=sys.stderr)
        return 0  # a config problem must not fail every job; the healthcheck reports it
    job = os.environ.get("SLURM_JOB_ID", "")
    job = job if job.isdigit() else ""
    h = ctx.hooks
    mapping_dir = ctx.path(h.dcgm_mapping_dir)
    if kind == "epilog" and job and mapping_dir:
        mapping.remove_job(mapping_dir, job)
    failure = None
    if kind == "prolog":
        last = ctx.store.read().get("last_result") or {}
        if last.get("status") == C.FAIL and time.time() - float(last.get("time", 0)) <= h.prolog_max_age:
            fails = [C.CheckResult.from_dict(r) for r in last.get("results", []) if r.get("status") == C.FAIL]
            failure = C.worst_failure(fails)
    p = None
    if failure is None:
        p = observe(ctx, h.prolog_nvml_timeout, cheap=True)
        failure = C.worst_failure(p.results)
        if p.sample is not None and job:
            _baseline(ctx, kind, job, p.sample)
    if failure is not None:
        print(f"autoheal-{kind}: {ctx.node}: {failure.reason}", file=sys.stderr)
        try:
            drain_for(ctx, failure)
        except SlurmError as exc:
            print(f"autoheal-{kind}: could not drain: {exc}", file=sys.stderr)
        ctx.record("detection", job_ids=[job] if job else [], check=failure.check, action=f"{kind}-fail",
                   message=failure.reason, severity="action", evidence=failure.evidence)
        return 1
    if kind == "prolog" and job and mapping_dir:
        from autoheal.slurm.binaries import find_binary

        env = dict(os.environ)
        if ctx.cfg.slurm.slurm_conf:
            env["SLURM_CONF"] = ctx.cfg.slurm.slurm_conf
        try:
            scontrol = find_binary("scontrol", ctx.cfg.slurm.bin_dir)
        except Exception:
            scontrol = "scontrol"
        gpus = mapping.job_gpus(os.environ, ctx.node, scontrol, h.prolog_slurm_timeout, env)
        if gpus:
            mapping.add_job(mapping_dir, job, gpus)
    return 0


def _baseline(ctx, kind: str, job: str, sample) -> None:
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
                st.setdefault("faults", []).append({"check": "ecc", "gpu": int(rose[0]), "action": C.RESET,
                                                    "reason": f"ecc: gpu {rose[0]}: uncorrectable ECC errors "
                                                    f"during job {job}", "since": time.time()})


def main(kind: str) -> None:
    code = run(kind)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
