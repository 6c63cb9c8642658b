"""The three PATCH formats of the API server.

* JSON merge patch (RFC 7386): maps merge, ``null`` deletes, everything else replaces.
* Strategic merge patch: like merge patch, but lists declared with a merge key
  merge element by element (``status.conditions`` by ``type``), primitive lists
  declared ``merge`` are unions, other lists are replaced whole (``spec.taints``).
  Directives: ``$patch: replace|delete|merge`` (maps and list elements),
  ``$deleteFromPrimitiveList/<field>``, ``$setElementOrder/<field>``, ``$retainKeys``.
* JSON patch (RFC 6902): add, remove, replace, move, copy, test, with JSON pointers.

The schema for strategic merge is a mapping from a dotted field path (list
elements add no path component) to ``key:<name>``, ``primitive`` or ``replace``.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping, Optional

from .resources import PRIMITIVE, REPLACE


class PatchError(ValueError):
    """The patch could not be applied; ``code`` is the HTTP status the real server uses."""

    def __init__(self, message: str, code: int = 422):
        super().__init__(message)
        self.code = code


# -- JSON merge patch (RFC 7386) ---------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """Apply ``patch`` to ``target`` and return the result; the inputs are not modified."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def create_merge_patch(original: Any, modified: Any) -> Any:
    """The merge patch that turns ``original`` into ``modified`` (``modified`` must hold no nulls)."""
    if not isinstance(original, dict) or not isinstance(modified, dict):
        return copy.deepcopy(modified)
    out: Dict[str, Any] = {}
    for key in original:
        if key not in modified:
            out[key] = None
    for key, value in modified.items():
        if key not in original:
            out[key] = copy.deepcopy(value)
        elif original[key] != value:
            if isinstance(value, dict) and isinstance(original[key], dict):
                out[key] = create_merge_patch(original[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


# -- strategic merge patch ---------------------------------------------------------------------

_DELETE = object()  # a map asked to delete itself with $patch: delete
DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
SET_ORDER = "$setElementOrder/"


def strategic_merge_patch(original: Any, patch: Any, schema: Mapping[str, str]) -> Any:
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object", code=400)
    result = _merge_map(original if isinstance(original, dict) else {}, patch, schema, "")
    return {} if result is _DELETE else result


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _strip(value: Any, schema: Mapping[str, str], path: str) -> Any:
    """A patch value placed where nothing was: apply it to an empty value to drop directives."""
    if isinstance(value, dict):
        merged = _merge_map({}, value, schema, path)
        return None if merged is _DELETE else merged
    if isinstance(value, list):
        strategy = schema.get(path, "")
        if strategy.startswith("key:") or strategy == PRIMITIVE:
            return _merge_list([], value, schema, path, strategy)
        return copy.deepcopy(value)
    return value


def _merge_map(original: Dict[str, Any], patch: Dict[str, Any], schema: Mapping[str, str],
               path: str) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        body = {k: v for k, v in patch.items() if k != "$patch"}
        return _strip(body, schema, path)
    if directive not in (None, "merge"):
        raise PatchError(f"Unknown patch type: {directive!r}", code=400)

    result = copy.deepcopy(original)
    orders: Dict[str, list] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith(SET_ORDER):
            if not isinstance(value, list):
                raise PatchError("invalid patch: $setElementOrder list expected", code=400)
            orders[key[len(SET_ORDER):]] = value
            continue
        if key.startswith(DELETE_PRIMITIVE):
            name = key[len(DELETE_PRIMITIVE):]
            if not isinstance(value, list):
                raise PatchError("invalid patch: $deleteFromPrimitiveList list expected", code=400)
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        sub = _join(path, key)
        if value is None:
            result.pop(key, None)
            continue
        strategy = schema.get(sub, "")
        current = result.get(key)
        if isinstance(value, dict):
            if strategy == REPLACE:
                merged = _strip({k: v for k, v in value.items() if k != "$patch"}, schema, sub)
            else:
                merged = _merge_map(current if isinstance(current, dict) else {}, value, schema, sub)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            if strategy.startswith("key:") or strategy == PRIMITIVE:
                result[key] = _merge_list(current if isinstance(current, list) else [], value, schema,
                                          sub, strategy)
            else:
                result[key] = copy.deepcopy(value)
        else:
            result[key] = value
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            result[name] = _apply_order(result[name], order, schema.get(_join(path, name), ""))
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: List[Any], patch: List[Any], schema: Mapping[str, str], path: str,
                strategy: str) -> List[Any]:
    if strategy == PRIMITIVE:
        result = list(original)
        for item in patch:
            if item not in result:
                result.append(item)
        return result
    key = strategy[len("key:"):]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" and len(item) == 1 for item in patch):
        rest = [item for item in patch if not (isinstance(item, dict) and item.get("$patch") == "replace")]
        return [_strip(item, schema, path) for item in rest]
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict):
            raise PatchError(f"invalid patch: list of maps expected at {path}, found {item!r}", code=400)
        if key not in item:
            raise PatchError(f"map: {_go_map(item)} does not contain declared merge key: {key}", code=500)
        idx = next((i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(key) == item[key]),
                   None)
        if item.get("$patch") == "delete":
            result = [cur for cur in result if not (isinstance(cur, dict) and cur.get(key) == item[key])]
            continue
        if idx is None:
            result.append(_strip(item, schema, path))
        else:
            merged = _merge_map(result[idx], item, schema, path)
            if merged is _DELETE:
                del result[idx]
            else:
                result[idx] = merged
    return result


def _apply_order(items: List[Any], order: List[Any], strategy: str) -> List[Any]:
    """Put the elements named by ``order`` in that order, in the slots they occupy."""
    if strategy.startswith("key:"):
        key = strategy[len("key:"):]
        wanted = [o.get(key) for o in order if isinstance(o, dict)]
        ident = lambda item: item.get(key) if isinstance(item, dict) else None  # noqa: E731
    else:
        wanted = list(order)
        ident = lambda item: item  # noqa: E731
    rank = {w: i for i, w in enumerate(wanted) if isinstance(w, (str, int, float, bool))}
    slots = [i for i, item in enumerate(items) if ident(item) in rank]
    ordered = sorted((items[i] for i in slots), key=lambda item: rank[ident(item)])
    out = list(items)
    for slot, item in zip(slots, ordered):
        out[slot] = item
    return out


def _go_map(item: Mapping[str, Any]) -> str:
    return "map[" + " ".join(f"{k}:{v}" for k, v in sorted(item.items())) + "]"


# -- JSON patch (RFC 6902) ---------------------------------------------------------------------

def _parse_pointer(pointer: str) -> List[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {pointer!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _index(container: list, token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    idx = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if idx > limit:
        raise PatchError(f"array index out of bounds: {idx}")
    return idx


def _parent(doc: Any, parts: List[str], pointer: str) -> Any:
    cur = doc
    for token in parts[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise PatchError(f"doc is missing path: {pointer!r}: missing value")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, allow_end=False)]
        else:
            raise PatchError(f"doc is missing path: {pointer!r}: missing value")
    return cur


def _get(doc: Any, pointer: str) -> Any:
    parts = _parse_pointer(pointer)
    if not parts:
        return doc
    parent = _parent(doc, parts, pointer)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"doc is missing path: {pointer!r}: missing value")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, allow_end=False)]
    raise PatchError(f"doc is missing path: {pointer!r}: missing value")


def _add(doc: Any, pointer: str, value: Any) -> Any:
    parts = _parse_pointer(pointer)
    if not parts:
        return copy.deepcopy(value)
    parent = _parent(doc, parts, pointer)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), copy.deepcopy(value))
    else:
        raise PatchError(f"doc is missing path: {pointer!r}: missing value")
    return doc


def _remove(doc: Any, pointer: str) -> Any:
    parts = _parse_pointer(pointer)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts, pointer)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"Unable to remove nonexistent key: {last}: missing value")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, allow_end=False)]
    else:
        raise PatchError(f"doc is missing path: {pointer!r}: missing value")
    return doc


def json_patch(document: Any, operations: Any) -> Any:
    """Apply an RFC 6902 operation list to a copy of ``document``."""
    if not isinstance(operations, list):
        raise PatchError("json patch must be a list of operations", code=400)
    doc = copy.deepcopy(document)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError(f"invalid JSON patch operation: {op!r}", code=400)
        kind = op["op"]
        path = op.get("path")
        if not isinstance(path, str):
            raise PatchError(f"operation {kind!r} missing 'path'", code=400)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {kind!r} missing 'value'", code=400)
        if kind == "add":
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            if path == "":
                doc = copy.deepcopy(op["value"])
            else:
                doc = _add(_remove(doc, path), path, op["value"])
        elif kind in ("move", "copy"):
            src = op.get("from")
            if not isinstance(src, str):
                raise PatchError(f"operation {kind!r} missing 'from'", code=400)
            if kind == "move" and path.startswith(src + "/"):
                raise PatchError("cannot move a value into one of its children")
            value = copy.deepcopy(_get(doc, src))
            if kind == "move":
                doc = _remove(doc, src)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}", code=400)
    return doc


def apply_patch(patch_type: str, original: Dict[str, Any], body: Any,
                schema: Optional[Mapping[str, str]] = None) -> Any:
    """Dispatch on patch type: ``json``, ``merge`` or ``strategic``."""
    if patch_type == "json":
        return json_patch(original, body)
    if patch_type == "merge":
        if not isinstance(body, dict):
            raise PatchError("merge patch must be a JSON object", code=400)
        return merge_patch(original, body)
    if patch_type == "strategic":
        return strategic_merge_patch(original, body, schema or {})
    raise ValueError(patch_type)
