"""Just enough Kubernetes protobuf decoding for the bodies kubectl's typed clients send.

kubectl's imperative generators (``kubectl create namespace|configmap|secret|serviceaccount``)
POST ``application/vnd.kubernetes.protobuf``. The fake decodes those four kinds into their JSON
form; any other protobuf body gets 415, as from a server that cannot read it. Responses are
always JSON (kubectl accepts both).
"""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Optional, Tuple

MAGIC = b"k8s\x00"
Schema = Dict[int, Tuple[str, Any]]


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> List[Tuple[int, Any]]:
    """(field number, value) pairs; length-delimited values stay bytes."""
    out: List[Tuple[int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        out.append((number, value))
    return out


def _scalar(kind: str, raw: Any) -> Any:
    if kind == "string":
        return raw.decode("utf-8")
    if kind == "bytes":
        return base64.b64encode(raw).decode()
    if kind == "bool":
        return bool(raw)
    if kind == "int":
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    raise AssertionError(kind)


def decode_message(data: bytes, schema: Schema) -> Dict[str, Any]:
    """Decode with ``schema``: number -> (json name, type); zero values are left out (omitempty)."""
    out: Dict[str, Any] = {}
    for number, raw in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = dict(_fields(raw))
            key = entry.get(1, b"").decode("utf-8")
            out.setdefault(name, {})[key] = _scalar(kind[1], entry.get(2, b""))
        elif isinstance(kind, tuple) and kind[0] == "repeated":
            item = decode_message(raw, kind[1]) if isinstance(kind[1], dict) else _scalar(kind[1], raw)
            out.setdefault(name, []).append(item)
        elif isinstance(kind, dict):
            value = decode_message(raw, kind)
            if value:
                out[name] = value
        else:
            value = _scalar(kind, raw)
            if value not in ("", 0, False):
                out[name] = value
    return out


OWNER_REFERENCE: Schema = {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"),
                           5: ("apiVersion", "string"), 6: ("controller", "bool"),
                           7: ("blockOwnerDeletion", "bool")}
OBJECT_META: Schema = {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
                       5: ("uid", "string"), 6: ("resourceVersion", "string"),
                       11: ("labels", ("map", "string")), 12: ("annotations", ("map", "string")),
                       13: ("ownerReferences", ("repeated", OWNER_REFERENCE)),
                       14: ("finalizers", ("repeated", "string"))}
KINDS: Dict[Tuple[str, str], Schema] = {
    ("v1", "Namespace"): {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("finalizers", ("repeated", "string"))})},
    ("v1", "ConfigMap"): {1: ("metadata", OBJECT_META), 2: ("data", ("map", "string")),
                          3: ("binaryData", ("map", "bytes")), 4: ("immutable", "bool")},
    ("v1", "Secret"): {1: ("metadata", OBJECT_META), 2: ("data", ("map", "bytes")), 3: ("type", "string"),
                       4: ("stringData", ("map", "string")), 5: ("immutable", "bool")},
    ("v1", "ServiceAccount"): {1: ("metadata", OBJECT_META),
                               3: ("imagePullSecrets", ("repeated", {1: ("name", "string")})),
                               4: ("automountServiceAccountToken", "bool")},
}


def decode_object(body: bytes) -> Optional[Dict[str, Any]]:
    """The JSON form of a protobuf-encoded object, or None when its kind is not one we decode."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf magic prefix")
    envelope = dict(_fields(body[len(MAGIC):]))
    type_meta = decode_message(envelope.get(1, b""), {1: ("apiVersion", "string"), 2: ("kind", "string")})
    schema = KINDS.get((type_meta.get("apiVersion", ""), type_meta.get("kind", "")))
    if schema is None:
        return None
    obj: Dict[str, Any] = dict(type_meta)
    obj.update(decode_message(envelope.get(2, b""), schema))
    return obj
