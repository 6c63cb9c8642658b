"""What the shipped Xid catalog costs the hooks: the import time of what a healthcheck imports (with the
catalog module in it), and the catalog's first read and a lookup (only when an XID is judged). Prints
figures; nothing is asserted (issue 22).

    python bench/bench_xid_catalog.py [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

HOOK_IMPORTS = "import autoheal.config, autoheal.hooks.context, autoheal.hooks.healthcheck, autoheal.hooks.engine"


def import_us(runs: int) -> dict:
    """Smallest of ``runs`` fresh interpreters: the sum of self import times (us) of what a healthcheck
    imports, and the catalog module's own self time."""
    best_total, best_catalog = None, None
    for _ in range(runs):
        res = subprocess.run([sys.executable, "-X", "importtime", "-c", HOOK_IMPORTS], capture_output=True,
                             text=True, timeout=60)
        total, catalog = 0, 0
        for line in res.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, _cum, name = (p.strip() for p in line[len("import time:"):].split("|"))
            total += int(self_us)
            if name.strip() == "autoheal.hooks.xid_catalog":
                catalog = int(self_us)
        best_total = total if best_total is None else min(best_total, total)
        best_catalog = catalog if best_catalog is None else min(best_catalog, catalog)
    return {"healthcheck_imports_us": best_total, "xid_catalog_module_us": best_catalog}


def load_us(runs: int) -> dict:
    code = ("import time\nfrom autoheal.hooks import xid_catalog as X\nt=time.perf_counter(); X.load(); "
            "t1=time.perf_counter()\nfor x in range(1, 200): X.verdict(x)\nt2=time.perf_counter()\n"
            "print(int((t1-t)*1e6), int((t2-t1)*1e6/199))")
    first, lookup = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
        first.append(int(out[0]))
        lookup.append(int(out[1]))
    return {"first_load_us": min(first), "lookup_us": min(lookup)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    print(json.dumps({**import_us(args.runs), **load_us(args.runs), "runs": args.runs}, indent=2))


if __name__ == "__main__":
    main()
