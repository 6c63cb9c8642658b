"""The peer-memory checkpoint tier, trainer side (opt-in: ``AUTOHEAL_MEMORY_TIER=1`` at submission).

Every K steps each rank hands its state to :meth:`MemoryTier.save`: one frame (``memtier_wire``) sent
over TCP to its own node's agent and to its peer's (the next node of the step, in a ring), both of
which keep it in node memory. ``save`` returns when both have it, so a node that dies after a save
leaves the copy on its peer. On a restart :meth:`MemoryTier.newest` asks its own node's agent, then its
peer's, then every other agent of the job, and returns the newest copy that verifies (size, HMAC
checksum, owner = this job, this rank); :func:`resume_source` weighs it against the durable checkpoint.

The job runner starts the agents and exports ``AUTOHEAL_MEMTIER_AGENTS`` (``node=addr:port,...``); without
it :meth:`MemoryTier.from_env` is None and the trainer uses the durable tier alone. Nothing imports this
module unless the job asked for the tier.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from autoheal.sbatch_helpers import memtier_wire as wire
from autoheal.sbatch_helpers.memtier_net import Address, parse_address, request

log = logging.getLogger(__name__)

ENABLE_ENV = "AUTOHEAL_MEMORY_TIER"
AGENTS_ENV = "AUTOHEAL_MEMTIER_AGENTS"
TIMEOUT_ENV = "AUTOHEAL_MEMTIER_TIMEOUT"
DEFAULT_TIMEOUT = 10.0


def parse_agents(text: str) -> Dict[str, Address]:
    """``n1=127.0.0.11:4000,n2=...`` -> {node: (addr, port)}; bad entries are skipped with a warning."""
    agents: Dict[str, Address] = {}
    for item in text.split(","):
        node, sep, where = item.strip().partition("=")
        if not sep:
            continue
        try:
            agents[node.strip()] = parse_address(where)
        except ValueError as exc:
            log.warning("%s: %s", AGENTS_ENV, exc)
    return agents


def peer_of(node: str, nodes: Sequence[str]) -> Optional[str]:
    """The node that keeps ``node``'s second copy: the next one of ``nodes`` in a ring (None alone)."""
    ring = sorted(set(nodes))
    if node not in ring or len(ring) < 2:
        return None
    return ring[(ring.index(node) + 1) % len(ring)]


def ask_order(node: str, nodes: Sequence[str], agents: Mapping[str, Address]) -> List[Tuple[str, str]]:
    """(source, node) to ask for a copy: own node, its peer, then every other agent."""
    order = [("own-memory", node)] if node in agents else []
    peer = peer_of(node, nodes)
    if peer and peer in agents:
        order.append(("peer-memory", peer))
    order += [("other-memory", n) for n in sorted(agents) if n not in (node, peer)]
    return order


@dataclass(frozen=True)
class SaveResult:
    step: int
    stored: Tuple[str, ...]  # nodes that acknowledged the copy
    failed: Tuple[str, ...]  # node: why

    @property
    def replicated(self) -> bool:
        return len(self.stored) >= 2


@dataclass(frozen=True)
class MemoryCopy:
    """A verified copy of this rank's state."""

    source: str  # own-memory | peer-memory | other-memory
    node: str
    info: wire.CopyInfo
    payload: bytes
    metadata: Dict[str, Any]

    @property
    def step(self) -> int:
        return self.info.step


class MemoryTier:
    """This rank's view of the tier: where its agents are and the job's key."""

    def __init__(self, node: str, rank: int, world: int, job_id: str, key: bytes, agents: Mapping[str, Address],
                 step_nodes: Sequence[str], timeout: float = DEFAULT_TIMEOUT,
                 max_payload: int = wire.DEFAULT_MAX_PAYLOAD):
        self.node, self.rank, self.world, self.job_id, self.key = node, rank, world, job_id, key
        self.agents = dict(agents)
        self.step_nodes = list(step_nodes) or sorted(self.agents)
        self.timeout, self.max_payload = timeout, max_payload
        self.peer = peer_of(node, self.step_nodes)
        self._down: set = set()

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, rank: Optional[int] = None,
                 world: Optional[int] = None) -> Optional[MemoryTier]:
        """The tier for this process, or None when the job runs without it (no agents exported)."""
        from autoheal.sbatch_helpers.checkpoint import TOKEN_ENV, env_rank, env_world_size
        from autoheal.slurm.hostlist import expand

        env = os.environ if environ is None else environ
        agents = parse_agents(env.get(AGENTS_ENV, ""))
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if not agents or not job_id or not env.get(TOKEN_ENV, "").strip():
            return None  # no submission token (not under autoheal sbatch): no secret to key the frames with
        node = env.get("SLURMD_NODENAME", "").strip()
        try:
            step_nodes = expand(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
        except ValueError:
            step_nodes = []
        return cls(node, env_rank(env) if rank is None else rank, env_world_size(env) if world is None else world,
                   job_id, wire.job_key(env.get(TOKEN_ENV, ""), job_id), agents,
                   [n for n in step_nodes if n in agents],
                   timeout=float(env.get(TIMEOUT_ENV, "") or DEFAULT_TIMEOUT))

    def save(self, step: int, payload: bytes, metadata: Optional[Dict[str, Any]] = None) -> SaveResult:
        """Keep ``payload`` as this rank's state at ``step`` on this node and on its peer."""
        header = wire.copy_header(self.job_id, self.rank, self.world, step, len(payload), time.time(), metadata)
        frame = wire.encode_parts(wire.Kind.STORE, header, payload, self.key)
        targets = [n for n in dict.fromkeys((self.node, self.peer)) if n and n in self.agents]
        outcome: Dict[str, str] = {}

        def send(node: str) -> None:
            try:
                answer = request(self.agents[node], frame, self.key, self.timeout, 0)
                if answer.kind != wire.Kind.ACK or not answer.header.get("ok"):
                    raise wire.FrameError(str(answer.header.get("why", "refused")))
                outcome[node] = ""
            except (OSError, wire.FrameError) as exc:
                outcome[node] = str(exc)

        # both copies at once: the save takes as long as the slower of the two, not their sum
        threads = [threading.Thread(target=send, args=(n,), daemon=True) for n in targets[1:]]
        for t in threads:
            t.start()
        if targets:
            send(targets[0])
        for t in threads:
            t.join()
        stored = [n for n in targets if outcome.get(n) == ""]
        failed = [f"{n}: {outcome.get(n) or 'no answer'}" for n in targets if outcome.get(n) != ""]
        down = {f.split(":")[0] for f in failed}
        if down != self._down:  # say it when it starts and when it ends, not at every step
            if failed:
                log.warning("memory tier: step %d of rank %d not kept on %s", step, self.rank, "; ".join(failed))
            else:
                log.warning("memory tier: step %d of rank %d kept on %s again", step, self.rank, ",".join(stored))
            self._down = down
        return SaveResult(step, tuple(stored), tuple(failed))

    def newest(self, min_step: int = -1, consistent: bool = False) -> Optional[MemoryCopy]:
        """The newest valid copy of this rank any agent still has (own node first), newer than ``min_step``.

        ``consistent``: the newest step that *every* rank of the world has a copy of (data-parallel ranks
        must start from one step); each rank works it out from the same agents' answers.
        """
        if consistent and self.world > 1:
            return self._newest_common(min_step)
        return self._fetch(None, min_step)

    def _fetch(self, step: Optional[int], min_step: int) -> Optional[MemoryCopy]:
        best: Optional[MemoryCopy] = None
        get = wire.encode(wire.Kind.GET, {"rank": self.rank, "step": step}, b"", self.key)
        for source, node in ask_order(self.node, self.step_nodes, self.agents):
            if best is not None and source == "other-memory":
                break  # own node or peer had one; the others are asked only when both are gone
            try:
                answer = request(self.agents[node], get, self.key, self.timeout, self.max_payload)
                if answer.kind != wire.Kind.COPY:
                    continue
                info = wire.copy_info(answer, self.job_id, self.rank)
            except (OSError, wire.FrameError) as exc:
                log.info("memory tier: no copy from %s (%s): %s", node, source, exc)
                continue
            if info.step > min_step and (step is None or info.step == step) and (best is None or info.step > best.step):
                md = answer.header.get("metadata")
                best = MemoryCopy(source, node, info, bytes(answer.payload), md if isinstance(md, dict) else {})
        return best

    def held(self) -> List[Dict[int, List[int]]]:
        """Every reachable agent's steps per rank."""
        ask = wire.encode(wire.Kind.LIST, {}, b"", self.key)
        answers = []
        for _, node in ask_order(self.node, self.step_nodes, self.agents):
            try:
                doc = request(self.agents[node], ask, self.key, self.timeout, 0).header.get("held")
            except (OSError, wire.FrameError):
                continue
            if isinstance(doc, dict):
                answers.append({int(r): [s for s in v if isinstance(s, int)] for r, v in doc.items()
                                if str(r).isdigit() and isinstance(v, list)})
        return answers

    def _newest_common(self, min_step: int) -> Optional[MemoryCopy]:
        for step in wire.common_steps(self.held(), self.world):
            if step <= min_step:
                return None
            found = self._fetch(step, min_step)
            if found is not None:
                return found
        return None


def resume_source(memory: Optional[MemoryCopy], durable_step: Optional[int]) -> Optional[Tuple[str, int]]:
    """("own-memory"|"peer-memory"|"other-memory"|"durable", step) to resume from, or None for a fresh start."""
    candidates = []
    if memory is not None:
        candidates.append((memory.source, memory.step))
    if durable_step is not None:
        candidates.append(("durable", durable_step))
    return wire.choose(candidates)
