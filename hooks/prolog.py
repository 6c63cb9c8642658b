"""``autoheal-prolog``: fast pre-job validation (Slurm Prolog, best with PrologFlags=Alloc).

Reuses a fresh failing healthcheck result, else reads the cheap GPU state live (count, lost GPUs,
uncorrectable ECC, row remapping) and new kernel-log XIDs. On a node we drained that someone else
resumed, it forgets the faults behind that drain and runs the full check live instead (a resume by an
admin is authoritative; a GPU still bad fails it). On failure it sets our drain reason and exits 1, so
Slurm requeues the job elsewhere and keeps our reason. On success it writes the DCGM exporter
job-mapping files for the job's GPUs.
"""

from __future__ import annotations


def main() -> None:
    from autoheal.hooks.jobhook import main as run

    run("prolog", __doc__)


if __name__ == "__main__":
    main()
