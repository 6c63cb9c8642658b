"""``autoheal-epilog``: post-job check (XIDs raised during the job, ECC counts that rose), removes the
job from the DCGM mapping files, drains the node (with our reason) on failure. Exits 1 only when that
drain could not be made (Slurm then drains the node "Epilog error" as a fallback); see ``jobhook``."""

from __future__ import annotations


def main() -> None:
    from autoheal.hooks.jobhook import main as run

    run("epilog", __doc__)


if __name__ == "__main__":
    main()
