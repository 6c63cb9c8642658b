"""The soak's fault schedule: a pure function of a seed, so a failing soak can be replayed exactly.

``make_schedule(seed, ...)`` returns the same list of :class:`Fault` for the same arguments. Each fault
has a kind (``KINDS``), a start offset in seconds from the soak's start, a target (a node, a node and a
GPU, a lab process, the API server, a job role) and, for faults that end by themselves or by someone's
hand (a thermal event, an admin's maintenance, a cordon, an API outage, a killed daemon that systemd
restarts), how long they last. Overlaps are part of the plan: a second fault on another node at the same
moment, a fault during the recovery of the previous one on the same node, and a fault on the spare that
replaced a node (target ``@replacement``, resolved by the runner to the newest spare in service). With
a hot-spare job in the workload, a few faults that drain target the node of that job a spare can replace
(``@hot-spare``), so every soak swaps.

The schedule also plans the on-call admin: ``oncall`` holds, for the 1st, 2nd, ... time the remediation
circuit breaker trips, how many seconds the person on call takes to be paged, look and reset it
(``ONCALL_DELAY``, drawn from a random stream of its own, so the faults of a seed are the same with or
without it), and ``repair`` how long a technician takes to repair in place a node that waits for a
replacement the spare pool can no longer give (``REPAIR_DELAY``; a stream of its own too).

Nothing here touches the lab; the runner (``autoheal_lab.soak``) carries the schedule out.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

#: Target of a fault on "the spare that replaced a node": the runner picks the newest spare in service
#: (or, when none has taken over yet, the node the schedule names in ``fallback``).
REPLACEMENT = "@replacement"
#: Target of a fault on "the hot-spare job's node that a spare can replace": the runner picks the
#: hot-spare trainer's second active node (the first is its batch host, which cannot leave the allocation),
#: or, when the job does not run on two active nodes then, the node the schedule names in ``fallback``.
HOT_SPARE = "@hot-spare"
#: Seconds the on-call admin takes from the breaker's page to `autoheal sync breaker reset` (min, max).
ONCALL_DELAY = (30.0, 90.0)
#: Seconds a technician takes to swap the broken part of a node waiting for a replacement when the spare
#: pool is empty, then hand it back (min, max).
REPAIR_DELAY = (60.0, 120.0)


@dataclass(frozen=True)
class Kind:
    """One kind of fault. ``group``: gpu, process, api or people. ``gpu_inject``/``xid``: what
    ``autoheal_lab.gpus.inject`` is given. ``clears_after``: (min, max) seconds after which the
    condition goes away by itself or is undone by its author (None: stays until autoheal repairs or
    replaces). ``needs_kube``: only with the Kubernetes side. ``drains``: a fault autoheal is expected to
    drain the node for (a warn-only XID or a process kill is not)."""

    name: str
    group: str
    gpu_inject: str = ""
    xid: Optional[int] = None
    clears_after: Optional[tuple] = None
    needs_kube: bool = False
    drains: bool = False
    doc: str = ""
    bucket: str = ""  # NVIDIA Xid-catalog bucket the XID is drawn from, per fault (xid None)


def bucket_xids(bucket: str) -> List[int]:
    """The H100 XIDs of one catalog bucket whose default follows the bucket rule (no deliberate
    difference): what a bucket kind draws its XID from."""
    from autoheal.hooks.xid_catalog import DIFFERENCES, xids_in_bucket

    return [x for x in xids_in_bucket(bucket, "H100") if x not in DIFFERENCES]


_KINDS: List[Kind] = [
    Kind("xid79", "gpu", "xid", 79, drains=True, doc="GPU fell off the bus (replace)"),
    Kind("xid48", "gpu", "xid", 48, drains=True, doc="double-bit ECC XID (reset)"),
    Kind("xid63", "gpu", "xid", 63, doc="row remapping event (warn only)"),
    Kind("xid64", "gpu", "xid", 64, drains=True, doc="row remapping failure XID (replace)"),
    Kind("xid74", "gpu", "xid", 74, drains=True, doc="NVLink error XID (reset)"),
    Kind("xid94", "gpu", "xid", 94, doc="contained ECC error (requeue the job, no drain)"),
    Kind("xid95", "gpu", "xid", 95, drains=True, doc="uncontained ECC error (reset)"),
    # drawn from NVIDIA's catalog buckets (issue 22): any XID of the bucket, chosen per fault by the seed
    Kind("xid-app", "gpu", "xid", bucket="RESTART_APP", doc="an application XID of the catalog (never a drain)"),
    Kind("xid-ignore", "gpu", "xid", bucket="IGNORE", doc="an XID the catalog says to ignore (no drain)"),
    Kind("xid-reset", "gpu", "xid", bucket="RESET_GPU", drains=True, doc="a RESET_GPU XID of the catalog (reset)"),
    Kind("bad-repair", "gpu", "xid", 95, drains=True, doc="a defect the repairs do not fix: XID 95 again each "
         "time the node is back, 3 times (it must end a lemon)"),
    Kind("ecc-dbe", "gpu", "ecc-dbe", drains=True, doc="double-bit ECC count (NVML)"),
    Kind("remap-failure", "gpu", "remap-failure", drains=True, doc="row-remap failure (NVML)"),
    Kind("gpu-lost", "gpu", "lost", drains=True, doc="GPU lost (NVML_ERROR_GPU_IS_LOST)"),
    Kind("thermal", "gpu", "thermal", clears_after=(20.0, 40.0), drains=True, doc="HW thermal slowdown, cools down"),
    Kind("nvlink-down", "gpu", "nvlink-down", clears_after=(30.0, 50.0), drains=True,
         doc="an NVLink link down, fixed by a technician"),
    Kind("pcie-degraded", "gpu", "pcie-degraded", clears_after=(30.0, 50.0), drains=True,
         doc="PCIe link below its max, reseated by a technician"),
    Kind("flapping", "gpu", "thermal", clears_after=(12.0, 12.0), drains=True,
         doc="thermal slowdown injected and cleared 3 times, 2 s apart"),
    Kind("kill-slurmd", "process", clears_after=(3.0, 8.0), doc="kill -9 a node's slurmd; restarted"),
    Kind("kill-slurmctld", "process", clears_after=(2.0, 5.0), doc="kill -9 slurmctld; restarted"),
    Kind("kill-xid-watch", "process", clears_after=(2.0, 6.0), doc="kill -9 a node's xid-watch; restarted"),
    Kind("kill-sync", "process", clears_after=(2.0, 6.0), needs_kube=True, doc="kill -9 the sync leader; restarted"),
    Kind("api-5xx", "api", clears_after=(5.0, 15.0), needs_kube=True, doc="the API answers 503 for a while"),
    Kind("api-429", "api", clears_after=(5.0, 15.0), needs_kube=True, doc="the API answers 429 for a while"),
    Kind("api-slow", "api", clears_after=(5.0, 15.0), needs_kube=True, doc="the API answers after 1.5 s"),
    Kind("admin-drain", "people", clears_after=(15.0, 40.0), doc="an admin drains a node with their reason"),
    Kind("kubectl-cordon", "people", clears_after=(15.0, 40.0), needs_kube=True,
         doc="someone cordons a Node, uncordons later"),
    Kind("user-cancel", "people", doc="a user cancels one of their jobs"),
    Kind("user-hold", "people", clears_after=(5.0, 15.0), doc="a user holds a pending job, releases it later"),
    Kind("time-limit", "people", doc="a job submitted with a 1-minute limit runs into it"),
    Kind("job-storm", "job", bucket="RESTART_APP", doc="one job's processes raise an application XID on every "
         "node it runs on (no node may drain for it)"),
]
KINDS: Dict[str, Kind] = {k.name: k for k in _KINDS}
GPU_KINDS = tuple(k.name for k in _KINDS if k.group == "gpu")
#: Kinds that need a node of their own as target.
NODE_KINDS = GPU_KINDS + ("kill-slurmd", "kill-xid-watch", "admin-drain", "kubectl-cordon")


@dataclass
class Fault:
    """One planned fault. ``at``: seconds after the soak's start; ``duration``: seconds until it clears
    (0: never by itself). ``node``/``gpu``: the target (node may be ``REPLACEMENT``, then ``fallback``
    names a node to use when no spare is in service; or ``HOT_SPARE``, the same). ``overlap``: why it was
    placed where it is
    (``single``, ``pair`` with the fault before, ``during-recovery`` of the fault before on its node,
    ``on-replacement``, ``on-hot-spare-job``)."""

    id: int
    kind: str
    at: float
    node: str = ""
    gpu: Optional[int] = None
    duration: float = 0.0
    overlap: str = "single"
    fallback: str = ""
    xid: Optional[int] = None  # a bucket kind's XID, drawn at planning (else the kind's own)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def group(self) -> str:
        return KINDS[self.kind].group


@dataclass
class Schedule:
    seed: int
    faults: List[Fault] = field(default_factory=list)
    oncall: List[float] = field(default_factory=list)  # seconds to reset the breaker, per trip (cycled)
    repair: List[float] = field(default_factory=list)  # seconds to repair a node in place, per repair (cycled)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "faults": [f.to_dict() for f in self.faults], "oncall": list(self.oncall),
                "repair": list(self.repair)}

    def oncall_delay(self, trip: int) -> float:
        """Seconds the on-call admin takes to reset the ``trip``-th trip of the breaker (0-based; the
        planned delays are reused in order when there are more trips than delays)."""
        return self.oncall[trip % len(self.oncall)] if self.oncall else ONCALL_DELAY[0]

    @property
    def span(self) -> float:
        """Seconds from the start to the last fault's end."""
        return max((f.at + f.duration for f in self.faults), default=0.0)


def kinds_for(kube: bool, include: Optional[Sequence[str]] = None, exclude: Sequence[str] = ()) -> List[str]:
    """The kinds a soak draws from: all (or ``include``), less those needing Kubernetes without it,
    less ``exclude``. Unknown names raise ValueError (a typo must not shrink the soak silently)."""
    for name in list(include or []) + list(exclude):
        if name not in KINDS:
            raise ValueError(f"unknown fault kind {name!r}; known: {', '.join(KINDS)}")
    names = list(include) if include else list(KINDS)
    return [n for n in names if n not in exclude and (kube or not KINDS[n].needs_kube)]


def make_schedule(seed: int, count: int, nodes: Sequence[str], gpus: int, kube: bool = True,
                  gap: tuple = (4.0, 10.0), include: Optional[Sequence[str]] = None, exclude: Sequence[str] = (),
                  overlap_rate: float = 0.3, spares: int = 0, oncall: tuple = ONCALL_DELAY,
                  repair: tuple = REPAIR_DELAY, hot_spare: bool = False) -> Schedule:
    """``count`` faults drawn with ``random.Random(seed)``: every kind in the pool once before any
    repeats (so a short soak covers the kinds it can), in a seeded order, ``gap`` seconds apart; with
    probability ``overlap_rate`` a fault is placed instead at the same moment as the one before on
    another node (``pair``) or 1-3 s after it on the same node (``during-recovery``). With ``spares``, one
    GPU fault in every eight (after the first) targets the replacement spare. With ``hot_spare`` (a
    hot-spare job in the workload), the first GPU fault that drains and the 4th, 12th, 20th, ... GPU fault
    when it drains target ``HOT_SPARE`` (each when placed alone); only their targets differ, the kinds,
    times and GPUs of a seed are the same with or without it. Process kills and API
    windows never overlap each other (one daemon restart at a time keeps the evidence readable).
    ``oncall``: (min, max) seconds the on-call admin takes to reset a tripped breaker; one delay per
    possible trip (at most one per fault), from ``random.Random(f"{seed}/on-call")``; ``repair``: (min,
    max) seconds a technician takes to repair a node in place, from ``random.Random(f"{seed}/technician")``."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if not nodes:
        raise ValueError("a schedule needs at least one node")
    rng = random.Random(seed)
    xid_rng = random.Random(f"{seed}/xid")
    pool = kinds_for(kube, include, exclude)
    if not pool:
        raise ValueError("no fault kind left to draw from")
    order: List[str] = []
    while len(order) < count:
        batch = list(pool)
        rng.shuffle(batch)
        order.extend(batch)
    order = order[:count]
    faults: List[Fault] = []
    t = 0.0
    gpu_faults = 0
    hot_done = False
    for i, kind in enumerate(order):
        spec = KINDS[kind]
        prev = faults[-1] if faults else None
        overlap = "single"
        node = rng.choice(list(nodes)) if kind in NODE_KINDS else ""
        if prev is not None and rng.random() < overlap_rate and kind in NODE_KINDS and prev.node \
                and prev.group in ("gpu", "people") and spec.group in ("gpu", "people"):
            if rng.random() < 0.5 and len(nodes) > 1:
                overlap, at = "pair", prev.at
                # the planned node of a fault aimed at the hot-spare job: the same draws as without it
                prev_node = prev.fallback if prev.node == HOT_SPARE else prev.node
                node = rng.choice([n for n in nodes if n != prev_node])
            else:
                overlap, at = "during-recovery", prev.at + round(rng.uniform(1.0, 3.0), 2)
                node = prev.node
            inherited = prev.fallback
        else:
            inherited = ""
            t += round(rng.uniform(*gap), 2)
            at = t
        t = max(t, at)
        fallback = inherited if node in (REPLACEMENT, HOT_SPARE) else ""
        if spec.group == "gpu":
            gpu_faults += 1
            if spares and gpu_faults > 1 and gpu_faults % 8 == 0 and overlap == "single":
                fallback, node, overlap = node, REPLACEMENT, "on-replacement"
            elif hot_spare and spec.drains and overlap == "single" and (not hot_done or gpu_faults % 8 == 4):
                fallback, node, overlap = node, HOT_SPARE, "on-hot-spare-job"
                hot_done = True
        gpu = rng.randrange(gpus) if spec.group == "gpu" else None
        dur = round(rng.uniform(*spec.clears_after), 2) if spec.clears_after else 0.0
        # a separate stream: drawing a bucket's XID leaves every other draw of the seed as it was
        xid = xid_rng.choice(bucket_xids(spec.bucket)) if spec.bucket else None
        faults.append(Fault(id=i + 1, kind=kind, at=round(at, 2), node=node, gpu=gpu, duration=dur,
                            overlap=overlap, fallback=fallback, xid=xid))
    people = []
    for name, bounds in (("on-call", oncall), ("technician", repair)):
        lo, hi = bounds
        if not 0 <= lo <= hi:
            raise ValueError(f"{name} delay must be (min, max) seconds with 0 <= min <= max")
        r = random.Random(f"{seed}/{name}")
        people.append([round(r.uniform(lo, hi), 1) for _ in range(max(1, count))])
    return Schedule(seed=seed, faults=faults, oncall=people[0], repair=people[1])
