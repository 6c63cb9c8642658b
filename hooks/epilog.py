"""``autoheal-epilog``: post-job check (XIDs raised during the job, ECC counts that rose), removes the
job from the DCGM mapping files, drains the node (with our reason) and exits 1 on failure."""

from __future__ import annotations


def main() -> None:
    from autoheal.hooks.jobhook import main as run

    run("epilog", __doc__)


if __name__ == "__main__":
    main()
