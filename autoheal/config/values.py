"""Value checkers for config settings (``setting(parse=...)`` / ``setting(item=...)``).

Each takes the already type-checked value and returns it (possibly normalised), or raises
``ValueError`` with a message that names the value; ``schema`` prefixes the key path. They refuse
only values that can never work: a path longer than the kernel accepts, a URL without a host, a
Kubernetes name the API server will always reject, an environment variable name no environment can
hold.
"""

from __future__ import annotations

from autoheal.config.schema import show
from autoheal.lazyre import LazyPattern
from autoheal.signals import signal_name

TYPE_CHECKING = False  # typing only for mypy: the hooks load this module on every run
if TYPE_CHECKING:
    from typing import Callable, Optional

#: Linux PATH_MAX (bytes, with the terminating NUL) and NAME_MAX (bytes per path component).
PATH_MAX = 4096
NAME_MAX = 255


def optional(check: Callable[[str], str]) -> Callable[[str], str]:
    """``check``, but the empty string (= "not set") is fine."""
    def run(value: str) -> str:
        return value if value == "" else check(value)
    return run


def path(value: str) -> str:
    """A file or directory name the kernel can accept (it may contain ``{node}``, ``%j``...)."""
    if len(value.encode("utf-8")) >= PATH_MAX:
        raise ValueError(f"{show(value)} is {len(value.encode('utf-8'))} bytes long; paths stop at "
                         f"{PATH_MAX - 1}")
    for part in value.split("/"):
        if len(part.encode("utf-8")) > NAME_MAX:
            raise ValueError(f"{show(value)}: the component {show(part, 30)} is longer than {NAME_MAX} bytes")
    return value


def nonempty_path(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a file path, not empty")
    if value.endswith("/"):
        raise ValueError(f"{show(value)} names a directory; give a file path")
    return path(value)


def http_url(value: str) -> str:
    """An ``http://`` or ``https://`` URL with a host (and a valid port, if any)."""
    if any(ch.isspace() for ch in value):
        raise ValueError(f"{show(value)} holds white space; not a URL")
    if not value.isascii():  # urllib cannot send it; Slack and friends hand out ASCII URLs
        raise ValueError(f"{show(value)} is not ASCII; percent-encode the path, write the host in punycode")
    from urllib.parse import urlsplit  # here, not at the top: the hooks load the config on every run

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{show(value)} must start with http:// or https://")
    try:
        _ = parts.port  # raises for a port out of range or not a number
        host = parts.hostname
    except ValueError as exc:
        raise ValueError(f"{show(value)}: {exc}") from None
    if not host:
        raise ValueError(f"{show(value)} has no host")
    return value


def rest_url(value: str) -> str:
    """slurmrestd: ``http(s)://host[:port]`` or ``unix:/path/to/socket``."""
    if value.startswith("unix:"):
        sock = value[len("unix:"):]
        if not sock.startswith("/"):
            raise ValueError(f"{show(value)}: the socket must be an absolute path (unix:/run/slurmrestd.sock)")
        path(sock)
        return value
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{show(value)} must start with http://, https:// or unix:")
    return http_url(value)


def plain_http_off_host(url: str) -> bool:
    """True for an ``http://`` URL whose host is not this machine (loopback): what crosses a network
    unencrypted."""
    if not url.startswith("http://"):
        return False
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


_API_VERSION = LazyPattern(r"v\d{1,3}\.\d{1,3}\.\d{1,3}")


def rest_api_version(value: str) -> str:
    if value != "auto" and not _API_VERSION.fullmatch(value):
        raise ValueError(f"{show(value)} is not 'auto' or an OpenAPI plugin version like v0.0.40")
    return value


_ENV_NAME = LazyPattern(r"[A-Za-z_][A-Za-z0-9_]*")


def env_var_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{show(value)} is not an environment variable name (letters, digits, _)")
    return value


def http_header_value(value: str) -> str:
    """Sent as an HTTP header (a user name): printable ASCII without white space."""
    if len(value) > 256 or not all(33 <= ord(ch) < 127 for ch in value):
        raise ValueError(f"{show(value)} must be printable ASCII without spaces (it travels in an HTTP header)")
    return value


def grace_signal(value: str) -> str:
    """A signal name Slurm knows and a job can catch, normalised (``sigusr2`` -> ``USR2``)."""
    return signal_name(value, catchable=True)


def host_or_address(value: str) -> str:
    """An IP address or a host name to bind (empty: every address)."""
    if value == "":
        return value
    import ipaddress

    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not all(_HOST_LABEL.fullmatch(p) for p in value.rstrip(".").split(".")):
        raise ValueError(f"{show(value)} is neither an IP address nor a host name")
    return value


_HOST_LABEL = LazyPattern(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


# ---- Kubernetes names: what the API server accepts (k8s.io/apimachinery/pkg/util/validation) ------------

_DNS_LABEL = LazyPattern(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_PART = LazyPattern(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def dns_label(value: str) -> str:
    """A namespace (RFC 1123 label): lower-case letters, digits and '-', at most 63."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{show(value)} is not a valid Kubernetes namespace (lower-case letters, digits "
                         "and '-', at most 63, starting and ending alphanumeric)")
    return value


def _is_subdomain(value: str) -> bool:
    return 0 < len(value) <= 253 and all(_DNS_LABEL.fullmatch(p) for p in value.split("."))


def dns_subdomain(value: str) -> str:
    """An object name (RFC 1123 subdomain): lower-case labels joined by '.', at most 253."""
    if not _is_subdomain(value):
        raise ValueError(f"{show(value)} is not a valid Kubernetes object name (lower-case letters, digits, "
                         "'-' and '.', at most 253)")
    return value


def group_version(value: str) -> str:
    """A custom resource's ``apiVersion``: ``group/version`` (the group a DNS subdomain)."""
    group, slash, version = value.partition("/")
    if not slash or not _DNS_LABEL.fullmatch(version) or not _is_subdomain(group):
        raise ValueError(f"{show(value, 40)} is not group/version (e.g. autoheal.io/v1alpha1)")
    return value


def _qualified_problem(value: str) -> Optional[str]:
    prefix, slash, name = value.rpartition("/")
    if slash and not _is_subdomain(prefix):
        return f"the prefix {show(prefix, 30)} is not a DNS subdomain"
    if len(name) > 63 or not _NAME_PART.fullmatch(name):
        return "the name must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return None


def qualified_name(value: str) -> str:
    """A label, annotation or taint key: ``[prefix/]name``."""
    problem = _qualified_problem(value)
    if problem:
        raise ValueError(f"{show(value)} is not a valid Kubernetes key: {problem}")
    return value


def label_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME_PART.fullmatch(value)):
        raise ValueError(f"{show(value)} is not a valid label value (at most 63 letters, digits, '-', '_', "
                         "'.', starting and ending alphanumeric)")
    return value


def label_pair(value: str) -> str:
    """``key=value`` (a label to set or match)."""
    key, eq, val = value.partition("=")
    if not eq or not key:
        raise ValueError(f"{show(value)} must be key=value")
    qualified_name(key)
    label_value(val)
    return value


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def taint_spec(value: str) -> str:
    """``key``, ``key=value``, ``key:Effect`` or ``key=value:Effect`` (parsed as k8s_sync does)."""
    spec, effect = value, None
    if ":" in spec:
        spec, effect = spec.rsplit(":", 1)
    key, _, val = spec.partition("=")
    qualified_name(key)
    label_value(val)
    if effect is not None and effect not in TAINT_EFFECTS:
        raise ValueError(f"{show(value)}: effect {show(effect, 30)} is not one of {', '.join(TAINT_EFFECTS)}")
    return value


_SELECTOR_VALUE = r"(?:(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_SELECTOR_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_REQUIREMENT = LazyPattern(
    rf"\s*(?:!\s*{_SELECTOR_KEY}"                                  # !key
    rf"|{_SELECTOR_KEY}\s*(?:(?:==|=|!=)\s*{_SELECTOR_VALUE})?"      # key, key=v, key==v, key!=v
    rf"|{_SELECTOR_KEY}\s+(?:in|notin)\s*\(\s*{_SELECTOR_VALUE}(?:\s*,\s*{_SELECTOR_VALUE})*\s*\))\s*")


def label_selector(value: str) -> str:
    """A Kubernetes label selector (``a=b,c!=d,e in (f,g),!h``); empty selects everything."""
    if not value.strip():
        return value
    depth, start, parts = 0, 0, []
    for i, ch in enumerate(value):  # split on commas outside parentheses
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    parts.append(value[start:])
    for part in parts:
        if not _REQUIREMENT.fullmatch(part):
            raise ValueError(f"{show(value)}: {show(part.strip(), 40)} is not a label selector requirement "
                             "(key, !key, key=value, key!=value, key in (a,b), key notin (a,b))")
    return value
