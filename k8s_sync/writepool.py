"""Which of a step's writes may run at the same time, and a bounded pool that runs them.

A pass's mirror writes are independent but for two orders the planner expresses by position: the writes
to one object (a Node's health condition, then its taint list, then its fault-history annotation: each
re-bases its resourceVersion guard on the one before) and the writes of one ``group`` (after one fails
the rest are skipped). ``lanes`` cuts a run of such writes into lanes that keep both orders: writes that
share an object or a group land in one lane, in plan order; different lanes share neither, so they may
run in parallel. ``run_lanes`` runs the lanes on at most ``concurrency`` threads (``sync.
api_write_concurrency``), so the API server's concurrency is used but never more than configured; the
rate limiter, leadership and error handling stay per write (``engine.Reconciler``).

Only plain object patches are pooled (``POOLED_KINDS``); every other write (Slurm, evictions, deletes,
custom resources, the breaker) runs alone, in plan order, between pooled runs (``segments``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from autoheal.k8s_sync.plan import NODE_PATCH, NODE_STATUS, POD_STATUS, Action

#: Write kinds a pool may run side by side (one object each; nothing after them reads their answer but
#: the next write to the same object, which is in the same lane).
POOLED_KINDS = frozenset((POD_STATUS, NODE_STATUS, NODE_PATCH))

Indexed = Tuple[int, Action]  # an action and its position in the step's plan


def object_key(action: Action) -> Tuple[str, ...]:
    """The Kubernetes object an action writes (a pod's status and a Node's status/spec/metadata)."""
    if action.kind == POD_STATUS:
        return ("pod", action.namespace, action.target)
    return ("node", action.target)


def segments(actions: Sequence[Action], pooled: bool = True) -> List[Tuple[bool, List[Indexed]]]:
    """Consecutive runs of ``actions`` as (poolable, [(index, action)]), in plan order. A later run
    starts only when the one before it has finished (a barrier), so every order between a pooled write
    and a lone one (a Slurm drain, then the annotation that records it) is kept."""
    out: List[Tuple[bool, List[Indexed]]] = []
    for i, action in enumerate(actions):
        can = pooled and action.kind in POOLED_KINDS
        if out and out[-1][0] == can:
            out[-1][1].append((i, action))
        else:
            out.append((can, [(i, action)]))
    return out


def lanes(run: Sequence[Indexed]) -> List[List[Indexed]]:
    """Split a run of pooled writes into lanes: two writes share a lane when they write one object or
    belong to one group (transitively). Each lane is in plan order; lanes are ordered by their first
    write."""
    parent: Dict[Hashable, Hashable] = {}

    def find(x: Hashable) -> Hashable:
        root = x
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    def keys(action: Action) -> List[Hashable]:
        out: List[Hashable] = [object_key(action)]
        if action.group:
            out.append(("group", action.group))
        return out

    for _, action in run:
        ks = keys(action)
        for k in ks[1:]:
            ra, rb = find(ks[0]), find(k)
            if ra != rb:
                parent[rb] = ra
    by_root: Dict[Hashable, List[Indexed]] = {}
    for item in run:
        by_root.setdefault(find(object_key(item[1])), []).append(item)
    return sorted(by_root.values(), key=lambda lane: lane[0][0])


def run_lanes(work: Sequence[List[Indexed]], worker: Callable[[List[Indexed]], None], concurrency: int) -> None:
    """``worker(lane)`` for every lane, on at most ``concurrency`` threads at once (inline when one
    thread is all that is allowed or needed). Returns when every lane is done; an exception a worker
    raised (a bug: writes catch their API errors) is raised here after the others finished."""
    if concurrency <= 1 or len(work) <= 1:
        for lane in work:
            worker(lane)
        return
    with ThreadPoolExecutor(max_workers=min(concurrency, len(work)), thread_name_prefix="sync-write") as pool:
        futures = [pool.submit(worker, lane) for lane in work]
    for f in futures:
        f.result()


# ---- one request for consecutive patches of one object ---------------------------------------------------
def _has_list(value: Any) -> bool:
    if isinstance(value, list):
        return True
    return isinstance(value, dict) and any(_has_list(v) for v in value.values())


def _merge_into(out: Dict[str, Any], body: Dict[str, Any]) -> bool:
    """Deep-merge ``body`` into ``out``; False when both set one field (other than equal scalars)."""
    for key, value in body.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            inner = dict(out[key])
            if not _merge_into(inner, value):
                return False
            out[key] = inner
        elif out[key] != value:
            return False
    return True


def combined_patch(first: Action, second: Action) -> Optional[Dict[str, Any]]:
    """One strategic merge patch doing what ``first`` then ``second`` do to one Node, or None.

    Only Node patches of the main resource (a taint list, then the fault-history annotation), and only
    when the two touch different fields and any JSON merge patch among them holds no list: for maps and
    scalars a strategic merge patch means what a JSON merge patch means (null deletes), lists are where
    they differ. A resourceVersion guard of either guards both (one 409 fails both, retried next pass)."""
    if first.kind != NODE_PATCH or second.kind != NODE_PATCH or first.target != second.target:
        return None
    for a in (first, second):
        if a.patch_type not in ("strategic", "merge") or (a.patch_type == "merge" and _has_list(a.body)):
            return None
    out: Dict[str, Any] = {}
    if not (_merge_into(out, first.body) and _merge_into(out, second.body)):
        return None
    return out


def as_one(actions: Sequence[Action]) -> Action:
    """The request doing ``actions`` (one, or several ``coalesce`` joined): the first with the combined body."""
    request = actions[0]
    for action in actions[1:]:
        body = combined_patch(request, action)
        if body is None:
            raise ValueError(f"{action.describe()} cannot join {request.describe()} in one request")
        request = replace(request, body=body, patch_type="strategic")
    return request


def coalesce(lane: Sequence[Indexed]) -> List[List[Indexed]]:
    """A lane as requests: runs of consecutive writes one request can do together (``combined_patch``),
    in order. Writes of a group never join (after one fails, the rest of its group must be skipped)."""
    out: List[List[Indexed]] = []
    for item in lane:
        if out and not item[1].group and not any(a.group for _, a in out[-1]) \
                and combined_patch(as_one([a for _, a in out[-1]]), item[1]) is not None:
            out[-1].append(item)
        else:
            out.append([item])
    return out
