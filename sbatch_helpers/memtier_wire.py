"""The peer-memory tier's frames: one format on the wire and in ``/dev/shm``, verified the same way.

A frame is::

    "AHMT" | version u8 | kind u8 | header length u32 | payload length u64    (18 bytes, big-endian)
    header (UTF-8 JSON object) | payload | HMAC-SHA256(key, header | payload)  (32 bytes)

The key is derived from the job's submission token and job id (``job_key``), both the same for every
run of the job (requeues, hot-spare restarts) and known only to the job's user and root. So the MAC is
the checksum (a torn or flipped copy fails it) and the owner check at once: a copy made by another
job, or by another user writing into our folder or our agent's socket, fails it too. The header also
names the key (``key_id``) so that "another job's copy" is told apart from "corrupt". The kind is not
under the MAC: a STORE frame becomes the stored copy byte for byte.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

MAGIC = b"AHMT"
VERSION = 1
PREFIX = struct.Struct(">4sBBIQ")
MAC_BYTES = 32
MAX_HEADER = 64 * 1024
DEFAULT_MAX_PAYLOAD = 4 << 30


class Kind(IntEnum):
    STORE = 1  # a copy to keep (trainer -> its own agent and its peer's agent)
    GET = 2  # "the newest copy of rank R" (header: rank)
    COPY = 3  # the answer to GET: a stored copy
    NONE = 4  # the answer to GET when there is none (header: why)
    ACK = 5  # the answer to STORE and LIST (header: ok, why; for LIST: held)
    LIST = 6  # "which steps do you hold, per rank"


class FrameError(Exception):
    """A frame that must not be used; ``str()`` is one line saying why."""


@dataclass(frozen=True)
class Frame:
    kind: Kind
    header: Dict[str, Any]
    payload: Union[bytes, memoryview]  # a view into the received frame when read from memory
    raw_size: int  # bytes on the wire / on disk


@dataclass(frozen=True)
class CopyInfo:
    """What a verified copy says about itself."""

    job_id: str
    rank: int
    step: int
    world: int
    saved_at: float
    size: int


def job_key(token: str, job_id: str) -> bytes:
    """The job's frame key; the same for every run of one submission."""
    return hashlib.sha256(b"autoheal-memtier/1\0" + token.encode() + b"\0" + job_id.encode()).digest()


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"key-id\0" + key).hexdigest()[:16]


def encode_parts(kind: Kind, header: Dict[str, Any], payload: bytes, key: bytes) -> Tuple[bytes, bytes, bytes, bytes]:
    """One frame as (prefix, header, payload, MAC): sent part by part, a large payload is never copied."""
    head = json.dumps(dict(header, key_id=key_id(key)), sort_keys=True, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER:
        raise ValueError(f"frame header of {len(head)} bytes is over {MAX_HEADER}")
    mac = hmac.new(key, head, hashlib.sha256)
    mac.update(payload)
    return PREFIX.pack(MAGIC, VERSION, int(kind), len(head), len(payload)), head, payload, mac.digest()


def encode(kind: Kind, header: Dict[str, Any], payload: bytes, key: bytes) -> bytes:
    """One frame (``key_id`` is added to the header)."""
    return b"".join(encode_parts(kind, header, payload, key))


def frame_size(prefix: Union[bytes, memoryview]) -> int:
    """The whole frame's length from its 18-byte prefix (FrameError when it is no prefix of ours)."""
    if len(prefix) != PREFIX.size:
        raise FrameError(f"truncated: {len(prefix)} of {PREFIX.size} prefix bytes")
    magic, _, _, hlen, plen = PREFIX.unpack(bytes(prefix))
    if magic != MAGIC:
        raise FrameError("not a memory-tier frame (bad magic)")
    return PREFIX.size + hlen + plen + MAC_BYTES


def with_kind(frame: Union[bytes, bytearray], kind: Kind) -> bytes:
    """The same frame with another kind (a stored STORE frame goes out as the COPY answer)."""
    return bytes(frame[:5]) + bytes([int(kind)]) + bytes(frame[6:])


Bytes = Union[bytes, memoryview]
ReadExact = Callable[[int], Bytes]


def read_frame(read: ReadExact, key: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
    """Read one frame with ``read(n)`` (returns exactly n bytes, or fewer at the end) and verify it."""
    prefix = read(PREFIX.size)
    if len(prefix) != PREFIX.size:
        raise FrameError(f"truncated: {len(prefix)} of {PREFIX.size} prefix bytes")
    magic, version, kind, hlen, plen = PREFIX.unpack(bytes(prefix))
    if magic != MAGIC:
        raise FrameError("not a memory-tier frame (bad magic)")
    if version != VERSION:
        raise FrameError(f"frame version {version}, this reader knows {VERSION}")
    try:
        kind_ = Kind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None
    if hlen > MAX_HEADER or plen > max_payload:
        raise FrameError(f"frame too large (header {hlen}, payload {plen} bytes; limit {max_payload})")
    body = read(hlen + plen + MAC_BYTES)
    if len(body) != hlen + plen + MAC_BYTES:
        raise FrameError(f"truncated: {len(body)} of {hlen + plen + MAC_BYTES} bytes after the prefix (torn copy)")
    head, payload, mac = bytes(body[:hlen]), body[hlen:hlen + plen], bytes(body[hlen + plen:])
    header = _header(head)
    if header.get("key_id") != key_id(key):
        raise FrameError("made with another job's key (another job's copy, or another submission with this id)")
    want = hmac.new(key, head, hashlib.sha256)
    want.update(payload)
    if not hmac.compare_digest(want.digest(), mac):
        raise FrameError("checksum (HMAC-SHA256) mismatch: corrupt or forged")
    return Frame(kind_, header, payload, PREFIX.size + len(body))


def _header(raw: bytes) -> Dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise FrameError("header is not JSON") from None
    if not isinstance(doc, dict):
        raise FrameError("header is not a JSON object")
    return doc


def reader_of(data: Union[bytes, bytearray]) -> ReadExact:
    """``read(n)`` over a bytes object (a copy read from memory); the pieces are views, not copies."""
    pos = [0]
    view = memoryview(data)

    def read(n: int) -> Bytes:
        chunk = view[pos[0]:pos[0] + n]
        pos[0] += len(chunk)
        return chunk

    return read


def _int(header: Dict[str, Any], name: str) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FrameError(f"header {name} {value!r} is not a non-negative integer")
    return value


def copy_info(frame: Frame, job_id: str, rank: Optional[int] = None) -> CopyInfo:
    """Check that a verified frame is a copy of this job (and of ``rank``); FrameError if not."""
    h = frame.header
    if h.get("job_id") != job_id:
        raise FrameError(f"a copy of job {h.get('job_id')!r}, not of this job {job_id}")
    info = CopyInfo(job_id=job_id, rank=_int(h, "rank"), step=_int(h, "step"), world=_int(h, "world"),
                    saved_at=float(h.get("time") or 0.0), size=len(frame.payload))
    if _int(h, "size") != info.size:
        raise FrameError(f"header size {h.get('size')} != payload {info.size} bytes")
    if rank is not None and info.rank != rank:
        raise FrameError(f"a copy of rank {info.rank}, not of rank {rank}")
    return info


def copy_header(job_id: str, rank: int, world: int, step: int, size: int, saved_at: float,
                metadata: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"job_id": job_id, "rank": rank, "world": world, "step": step, "size": size, "time": saved_at,
            "metadata": metadata or {}}


# ---- choosing what to resume from (pure) ------------------------------------------------------------

#: Where a copy came from, cheapest first: on an equal step the cheaper one wins.
SOURCES = ("own-memory", "peer-memory", "other-memory", "durable")


def choose(candidates: Iterable[Tuple[str, int]]) -> Optional[Tuple[str, int]]:
    """The (source, step) to resume from: the newest step; on a tie the cheapest source."""
    best: Optional[Tuple[str, int]] = None
    for source, step in candidates:
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        if best is None or step > best[1] or (step == best[1] and SOURCES.index(source) < SOURCES.index(best[0])):
            best = (source, step)
    return best


def common_steps(held: Iterable[Mapping[int, Iterable[int]]], world: int) -> List[int]:
    """The steps for which every rank 0..world-1 has a copy on some agent, newest first: what data-parallel
    ranks may resume from together (each rank alone taking its newest would start them at different steps)."""
    union: Dict[int, set] = {}
    for answer in held:
        for rank, steps in answer.items():
            union.setdefault(rank, set()).update(steps)
    if world < 1 or any(r not in union for r in range(world)):
        return []
    return sorted(set.intersection(*(union[r] for r in range(world))), reverse=True)


def surplus(steps: Iterable[int], keep: int) -> List[int]:
    """The steps to delete so that the newest ``keep`` remain (``keep`` >= 1)."""
    ordered = sorted(set(steps), reverse=True)
    return sorted(ordered[max(1, keep):])
