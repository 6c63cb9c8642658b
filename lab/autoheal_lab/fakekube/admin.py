"""The ``/_fake`` admin endpoints: fault injection, reset, compaction, seeding and the request log.

* ``GET|POST|DELETE /_fake/faults`` list, add (one JSON object or a list), clear rules;
  ``DELETE /_fake/faults/<id>`` removes one (see faults.py for the fields);
* ``POST /_fake/reset`` drops faults and objects, recreating the default namespaces;
* ``POST /_fake/compact`` forgets watch history (older resourceVersions get 410);
* ``GET /_fake/objects`` dumps every object; ``POST /_fake/objects`` seeds objects
  (one, a list or ``{"items": [...]}``) keeping their status;
* ``GET|DELETE /_fake/requests`` the request log (method, path, query, types, status).
"""

from __future__ import annotations

import json
from typing import Any

from . import errors


def handle_admin(handler: Any, method: str, path: str, body: bytes) -> None:
    """``/_fake/faults``, ``/_fake/reset``, ``/_fake/compact``, ``/_fake/objects``, ``/_fake/requests``."""
    app = handler.app
    try:
        payload = json.loads(body.decode("utf-8")) if body.strip() else None
    except ValueError as exc:
        raise errors.bad_request(f"bad JSON: {exc}") from None
    if path == "/_fake/faults":
        if method == "GET":
            handler._send_json(200, {"faults": [f.to_dict() for f in app.faults.rules()]})
        elif method == "POST":
            specs = payload if isinstance(payload, list) else [payload]
            try:
                added = [app.faults.add_dict(s) for s in specs]
            except (ValueError, TypeError) as exc:
                raise errors.bad_request(str(exc)) from None
            handler._send_json(201, {"faults": [f.to_dict() for f in added]})
        elif method == "DELETE":
            app.faults.clear()
            handler._send_json(200, {"faults": []})
        else:
            raise errors.method_not_allowed()
    elif path.startswith("/_fake/faults/") and method == "DELETE":
        ok = path.rsplit("/", 1)[1].isdigit() and app.faults.remove(int(path.rsplit("/", 1)[1]))
        handler._send_json(200 if ok else 404, {"removed": bool(ok)})
    elif path == "/_fake/reset" and method == "POST":
        app.reset()
        handler._send_json(200, {"reset": True, "resourceVersion": str(app.store.store.current_rv)})
    elif path == "/_fake/compact" and method == "POST":
        handler._send_json(200, {"compactedResourceVersion": str(app.store.store.compact())})
    elif path == "/_fake/objects" and method == "GET":
        handler._send_json(200, {"items": app.store.dump()})
    elif path == "/_fake/objects" and method == "POST":
        objs = payload.get("items", []) if isinstance(payload, dict) and "items" in payload else (
            payload if isinstance(payload, list) else [payload])
        created = []
        for obj in objs:
            try:
                created.append(app.store.add(obj))
            except KeyError as exc:
                raise errors.bad_request(str(exc)) from None
        handler._send_json(201, {"items": created})
    elif path == "/_fake/requests" and method == "GET":
        handler._send_json(200, {"requests": list(app.requests)})
    elif path == "/_fake/requests" and method == "DELETE":
        app.requests.clear()
        handler._send_json(200, {"requests": []})
    else:
        handler._send_json(404, errors.ApiError(404, "NotFound", f"no admin endpoint {method} {path}").to_status())
