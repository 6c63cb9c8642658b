"""API errors as the real server reports them: a ``Status`` object with reason, code and details.

Messages follow k8s.io/apimachinery/pkg/api/errors so that clients which look at
``reason`` or match on messages behave as they would against a real cluster.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .resources import ResourceType

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

CONFLICT_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def status_object(status: str, code: int, reason: str = "", message: str = "",
                  details: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out: Dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status}
    if message:
        out["message"] = message
    if reason:
        out["reason"] = reason
    if details:
        out["details"] = details
    out["code"] = code
    return out


class ApiError(Exception):
    """An error answer; ``to_status()`` gives the body, ``code`` the HTTP status."""

    def __init__(self, code: int, reason: str, message: str, details: Optional[Dict[str, Any]] = None,
                 retry_after: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after

    def to_status(self) -> Dict[str, Any]:
        return status_object("Failure", self.code, self.reason, self.message, self.details)

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def _qualified(rt: ResourceType) -> str:
    return rt.key


def _details(rt: ResourceType, name: str, kind: Optional[str] = None) -> Dict[str, Any]:
    d: Dict[str, Any] = {"name": name}
    if rt.group:
        d["group"] = rt.group
    d["kind"] = kind or rt.plural
    return d


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(rt)} "{name}" not found', _details(rt, name))


def namespace_not_found(name: str) -> ApiError:
    return ApiError(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{_qualified(rt)} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str = CONFLICT_MODIFIED) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(rt)} "{name}": {why}',
                    _details(rt, name))


FieldError = Tuple[str, str, str]  # (field path, cause reason, message)


def field_error(path: str, kind: str, value: Any = None, detail: str = "") -> FieldError:
    """One validation error, worded like k8s.io/apimachinery/pkg/util/validation/field."""
    import json
    words = {
        "FieldValueRequired": "Required value",
        "FieldValueInvalid": "Invalid value",
        "FieldValueNotSupported": "Unsupported value",
        "FieldValueDuplicate": "Duplicate value",
        "FieldValueForbidden": "Forbidden",
    }
    msg = words[kind]
    if kind in ("FieldValueInvalid", "FieldValueNotSupported", "FieldValueDuplicate"):
        msg += ": " + (json.dumps(value) if isinstance(value, str) else json.dumps(value, default=str))
    if detail:
        msg += ": " + detail
    return (path, kind, msg)


def invalid(rt: ResourceType, name: str, errors: Sequence[FieldError]) -> ApiError:
    parts = [f"{path}: {msg}" for path, _, msg in errors]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    causes: List[Dict[str, str]] = [{"reason": kind, "message": msg, "field": path} for path, kind, msg in errors]
    details = _details(rt, name, kind=rt.kind)
    details["causes"] = causes
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message,
                    {})


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: "
                    f"{', '.join(accepted)}")


def too_many_requests(message: str, retry_after: int = 0,
                      causes: Optional[List[Dict[str, str]]] = None) -> ApiError:
    details: Dict[str, Any] = {}
    if causes:
        details["causes"] = causes
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return ApiError(429, "TooManyRequests", message, details, retry_after=retry_after or None)


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}",
                    {"causes": [{"message": message}]})


def generic(code: int, message: str, reason: Optional[str] = None, retry_after: Optional[int] = None) -> ApiError:
    """Any status code, with the reason the real server pairs with it."""
    details: Dict[str, Any] = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return ApiError(code, reason if reason is not None else REASONS.get(code, ""), message, details,
                    retry_after=retry_after)
