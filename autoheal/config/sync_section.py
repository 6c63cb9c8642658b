"""Config of the Slurm <-> Kubernetes sync daemon and node remediation (``autoheal sync``)."""

from __future__ import annotations

import json
import re

from autoheal.config import values as V
from autoheal.config.schema import setting, show
from autoheal.errors import ConfigError
from autoheal.reasons import PREFIX
from autoheal.records import record

TYPE_CHECKING = False  # typing only for mypy: the hooks load this module on every run
if TYPE_CHECKING:
    from typing import Callable, List, Optional


def _list(*items: str) -> Callable[[], List[str]]:
    return lambda: list(items)


def _condition_prefix(value: str) -> str:
    """Pod condition types other than the built-in ones must be qualified names (the API server refuses
    every status update otherwise); check the prefix with a state appended."""
    try:
        V.qualified_name(value + "Idle")
    except ValueError:
        raise ValueError(f"{show(value)} does not make valid pod condition types (<prefix>Idle must be a "
                         "qualified name: letters, digits, '-', '_', '.')") from None
    return value


def _condition_spec(value: str) -> str:
    ctype, _, status = value.partition("=")
    if not ctype.strip():
        raise ValueError(f"{show(value)}: the condition type is empty")
    if "=" in value and status not in ("True", "False", "Unknown"):
        raise ValueError(f"{show(value)}: status must be True, False or Unknown")
    return value


def _remediate_reason(value: str) -> str:
    """Only autoheal drains are ever replaced, so a prefix not starting ``autoheal:`` never matches."""
    if not value.strip().startswith(PREFIX.strip()):
        raise ValueError(f"{show(value)} does not start with {PREFIX.strip()!r}: only autoheal's own drains "
                         "are replaced, so it would never match")
    return value


def _xid(value: int) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"{value} is not an XID (1-65535)")
    return value


def _nonblank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


STEPS = ("slurm-to-pods", "health-to-nodes", "nodes-to-slurm", "remediate")


def _step(value: str) -> str:
    if value not in STEPS:
        raise ValueError(f"unknown step {show(value)}; use some of {', '.join(STEPS)}")
    return value


def _template_problem(text: str) -> str:
    """Why the custom-resource template can never create an object ('' when it can)."""
    try:
        tpl = json.loads(text)
    except (ValueError, RecursionError):
        return "is not JSON"
    if not isinstance(tpl, dict):
        return "must be a JSON object"
    api, kind, meta = tpl.get("apiVersion"), tpl.get("kind"), tpl.get("metadata")
    try:
        if not isinstance(api, str):
            raise ValueError
        V.group_version(api)
    except ValueError:
        return f"apiVersion {show(api, 40)} must be a string group/version (a custom resource's group)"
    if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,62}", kind):
        return f"kind {show(kind, 40)} must be a string like NodeReplacement"
    if not isinstance(meta, dict) or not any(isinstance(meta.get(k), str) and meta.get(k)
                                             for k in ("name", "generateName")):
        return "metadata must hold a name (e.g. \"{node}\") or generateName"
    return ""


@record
class SyncSection:
    """``autoheal sync``: mirroring node states both ways and replacing broken nodes."""

    slurm_resync_seconds: float = setting(1.5, doc="Seconds between full Slurm reads (one call for all "
                                          "nodes); a Slurm change reaches Kubernetes within about this long.",
                                          min=0.5, max=3600)
    namespace: str = setting("slurm", doc="Namespace of the slurmd pods, Events and the leader Lease.",
                             parse=V.dns_label)
    kubeconfig: Optional[str] = setting(None, doc="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config; "
                                        "ignored with in_cluster).", parse=V.path)
    in_cluster: bool = setting(False, doc="Use the pod's ServiceAccount instead of a kubeconfig.")
    request_timeout_seconds: float = setting(10.0, doc="Timeout of each Kubernetes API request.", min=1, max=300)
    watch_timeout_seconds: int = setting(300, doc="Server-side timeout of each watch request before it is "
                                         "re-opened from the last resourceVersion.", min=5, max=3600)

    # ---- mapping Slurm nodes to Kubernetes objects ----------------------------------------------
    mapping: str = setting("pod", doc="How a Slurm node finds its Kubernetes Node: 'pod' (Slinky-style: the "
                           "slurmd pod selected by pod_selector, keyed by pod_key; its spec.nodeName is the "
                           "Node), 'node-name' (Node named like the Slurm node), 'node-label' (Node whose "
                           "node_label value is the Slurm node name).",
                           choices=("pod", "node-name", "node-label"))
    pod_selector: str = setting("app.kubernetes.io/component=slurmd", doc="Label selector of the slurmd pods "
                                "(mapping = 'pod').", parse=V.label_selector)
    pod_key: str = setting("hostname", doc="Which pod field holds the Slurm node name: 'hostname' "
                           "(spec.hostname, Slinky), 'pod-name' (metadata.name) or 'node-name' "
                           "(spec.nodeName).", choices=("hostname", "pod-name", "node-name"))
    node_label: str = setting("autoheal.io/slurm-node", doc="Node label holding the Slurm node name "
                              "(mapping = 'node-label').", parse=V.qualified_name)

    # ---- Slurm -> Kubernetes --------------------------------------------------------------------
    mirror_pod_conditions: bool = setting(True, doc="Write SlurmNodeState* conditions on slurmd pods (turn off "
                                          "where a Slinky operator already writes them).")
    condition_prefix: str = setting("SlurmNodeState", doc="Prefix of the mirrored pod condition types "
                                    "(Slinky's names: SlurmNodeStateIdle, SlurmNodeStateDrain, ...).",
                                    parse=_condition_prefix)
    health_condition: str = setting("GPUHealthy", doc="Node condition set to False while autoheal's hardware "
                                    "drain is on the Slurm node (empty: never write it).")
    taint_unhealthy: bool = setting(True, doc="Also taint Nodes under an autoheal hardware drain, so "
                                    "Kubernetes workloads stay off the bad GPUs.")
    taint_key: str = setting("autoheal.io/gpu-unhealthy", doc="Key of that taint.", parse=V.qualified_name)
    taint_effect: str = setting("NoSchedule", doc="Effect of that taint.",
                                choices=("NoSchedule", "PreferNoSchedule", "NoExecute"))

    # ---- Kubernetes -> Slurm --------------------------------------------------------------------
    drain_on_cordon: bool = setting(True, doc="Drain the Slurm node when its Kubernetes Node is cordoned "
                                    "(spec.unschedulable) by someone else; resume on uncordon.")
    drain_on_taints: List[str] = setting(default_factory=list, doc="Taints written by other tools that take a "
                                         "node out of Slurm: 'key', 'key=value' or 'key:Effect' (e.g. "
                                         "'nvidia.com/gpu-error:NoSchedule').", item=V.taint_spec)
    drain_on_conditions: List[str] = setting(default_factory=list, doc="Node conditions written by other tools "
                                             "(node-problem-detector, NVSentinel) that take a node out of "
                                             "Slurm: 'Type' (bad when True) or 'Type=Status' (e.g. "
                                             "'GpuHealthy=False').", item=_condition_spec)
    cordon_reason_annotation: str = setting("autoheal.io/cordon-reason", doc="Node annotation whose text is "
                                            "appended to the Slurm drain reason of a cordon.",
                                            parse=V.qualified_name)
    annotation_prefix: str = setting("autoheal.io", doc="Prefix of the origin annotations autoheal writes on "
                                     "Nodes (<prefix>/slurm-drain-origin, <prefix>/cordoned-by).",
                                     parse=V.dns_subdomain)
    max_k8s_drain_fraction: float = setting(0.5, doc="Refuse to drain more than this share of mapped nodes "
                                            "in one pass from Kubernetes signals (a fleet-wide glitch is "
                                            "reported, not turned into a mass drain); at least 2 are "
                                            "always allowed.", min=0.0, max=1.0)

    # ---- writes, leadership, serving -----------------------------------------------------------
    api_writes_per_second: float = setting(20.0, doc="Rate limit of Kubernetes writes (token bucket).",
                                           min=0.1, max=10000)
    api_write_burst: int = setting(50, doc="Burst size of Kubernetes writes.", min=1, max=100000)
    api_write_concurrency: int = setting(8, doc="Kubernetes writes in flight at once: independent object "
                                         "patches of one pass (different Nodes and pods) run on this many "
                                         "threads; writes to one object keep their order. 1: one at a time.",
                                         min=1, max=64)
    slurm_writes_per_second: float = setting(5.0, doc="Rate limit of Slurm drains/resumes.", min=0.1,
                                             max=10000)
    slurm_write_burst: int = setting(20, doc="Burst size of Slurm writes.", min=1, max=100000)
    events: bool = setting(True, doc="Post a Kubernetes Event for every drain, resume and taint change.")
    leader_election: bool = setting(True, doc="Only the holder of the Lease writes (run 2 replicas).")
    lease_name: str = setting("autoheal-sync", doc="Name of the coordination.k8s.io Lease.",
                              parse=V.dns_subdomain)
    lease_duration_seconds: float = setting(15.0, doc="Lease duration: a new leader takes over within this "
                                            "long after the old holder's last renewal (plus one request and "
                                            "any clock difference between the hosts).", min=2, max=600)
    metrics_port: int = setting(9464, doc="Port of /metrics, /healthz, /readyz (0: off).", min=0, max=65535)
    metrics_address: str = setting("127.0.0.1", doc="Address the metrics server binds (an IP address or "
                                   "host name; empty: every address). The chart binds the pod's addresses "
                                   "(0.0.0.0: the kubelet's probes and Prometheus) behind its NetworkPolicy.",
                                   parse=V.host_or_address)
    metrics_read_timeout_seconds: float = setting(5.0, doc="How long a client of the metrics server may take to "
                                                  "send its whole request (line and headers), however slowly "
                                                  "it trickles in; then the connection is closed.",
                                                  min=0.5, max=60)
    enabled_steps: List[str] = setting(default_factory=_list("slurm-to-pods", "health-to-nodes",
                                                             "nodes-to-slurm"),
                                       doc="Reconcile steps to run, in order.", item=_step)

    # ---- remediation: replacing broken nodes (step "remediate") ----------------------------------
    remediate_reasons: List[str] = setting(default_factory=_list("autoheal: replace:", "autoheal: lemon:"),
                                           doc="Slurm drain reasons (prefixes) that ask for a replacement; the "
                                           "node side drains with 'autoheal: replace: ...' on the last rung of "
                                           "its recovery ladder (a replace-class XID, or a fault that kept "
                                           "failing after reset and reboot) and with 'autoheal: lemon: ...' "
                                           "for a node that keeps failing after being returned to service. "
                                           "Each must start with 'autoheal:'.",
                                           item=_remediate_reason)
    remediate_xids: List[int] = setting(default_factory=list, doc="Removed (issue 22): ignored. The node "
                                        "side alone decides a replacement (its XID policy and recovery ladder: "
                                        "hooks.xid_policy {\"79\" = \"replace\"}), and the sync acts on the "
                                        "'autoheal: replace: ...' reason it writes. Still accepted so that older "
                                        "configs load; `autoheal config validate` and `autoheal sync` warn "
                                        "when it is set.", item=_xid)
    opt_out_label: str = setting("autoheal.io/auto-replace=false", doc="This label (key=value) on the Node "
                                 "itself or on a pod on it vetoes automatic replacement: Event, journal and "
                                 "notification, no action. Checked on every pass: removing it lets the "
                                 "replacement start.", parse=V.label_pair)
    remediation_grace_seconds: float = setting(300.0, doc="How long the node's Slurm jobs may take to leave "
                                               "(they were signalled and requeued by the hooks) before the "
                                               "remediation fails.", min=0, max=86400)
    remediation_drain_timeout_seconds: float = setting(600.0, doc="How long evictions may stay blocked "
                                                       "(PodDisruptionBudget 429s, retried with backoff) before "
                                                       "the remediation fails.", min=0, max=86400)
    remediation_replace_timeout_seconds: float = setting(1800.0, doc="How long a requested replacement may "
                                                         "take to register before the remediation fails.",
                                                         min=0, max=86400)
    remediation_retry_seconds: float = setting(900.0, doc="A failed remediation whose node still asks for a "
                                               "replacement starts again after this long (`autoheal sync "
                                               "remediation retry NODE` starts it at once).", min=0,
                                               max=7 * 86400)
    remediation_max_attempts: int = setting(3, doc="Attempts (the first included) after which only `autoheal "
                                            "sync remediation retry` starts another; 0: no limit.", min=0,
                                            max=1000)
    replacement_action: str = setting("label", doc="How a replacement is requested: 'label' (label and "
                                      "annotate the Node for an external provider), 'delete-node' (a node "
                                      "pool / autoscaler replaces it), 'custom-resource' (create "
                                      "replacement_template), 'webhook' (POST to replacement_webhook).",
                                      choices=("label", "delete-node", "custom-resource", "webhook"))
    replacement_label: str = setting("autoheal.io/replace=requested", doc="Label (key=value) set on the Node "
                                     "by the 'label' action.", parse=V.label_pair)
    replacement_template: str = setting(
        '{"apiVersion": "autoheal.io/v1alpha1", "kind": "NodeReplacement", "metadata": {"name": "{node}", '
        '"labels": {"app.kubernetes.io/managed-by": "autoheal-sync"}}, "spec": {"nodeName": "{node}", '
        '"slurmNode": "{slurm_node}", "reason": "{reason}"}}',
        doc="JSON of the custom resource the 'custom-resource' action creates (in sync.namespace); {node}, "
            "{slurm_node} and {reason} are filled in (JSON-escaped). The provider reports the new Node in "
            "status.replacementNode (or the <annotation_prefix>/replacement-node annotation on the old Node).",
        multiline=True)
    replacement_webhook: str = setting("", doc="URL the 'webhook' action POSTs {node, slurm_node, reason} to; "
                                       "an answer {\"replacementNode\": ...} or the Node annotation "
                                       "<annotation_prefix>/replacement-node names the new Node.",
                                       parse=V.optional(V.http_url))
    spare_reason_prefix: str = setting("autoheal: spare:", doc="A replacement's Slurm node drained with this "
                                       "reason prefix (a spare held out of service) is resumed when it "
                                       "takes over; other drains on it are left alone (must not be "
                                       "empty: that would resume any drain).", parse=_nonblank)
    breaker_max_concurrent: int = setting(2, doc="Circuit breaker: at most this many remediations at once.",
                                          min=0, max=100000)
    breaker_max_percent: float = setting(25.0, doc="Circuit breaker: trips when more than this share of mapped "
                                         "nodes is in remediation or drained by autoheal, and never lets more "
                                         "than this share start within breaker_window_seconds.", min=0, max=100)
    breaker_rearm_percent: float = setting(10.0, doc="Hysteresis: a tripped breaker re-arms after the cooldown "
                                           "only once the share is below this.", min=0, max=100)
    breaker_window_seconds: float = setting(3600.0, doc="Sliding window of the breaker's share of starts.",
                                            min=1, max=604800)
    breaker_cooldown_seconds: float = setting(900.0, doc="Minimum time a tripped breaker stays tripped "
                                              "(`autoheal sync breaker reset` re-arms it by hand).",
                                              min=0, max=604800)
    expected_failure_percent_per_day: float = setting(
        1.0, doc="The share of the pool expected to need a replacement per day (the fleet's failure rate; "
        "large GPU fleets report about 0.3-0.5 % of nodes interrupted per day, not all of them replace-class). "
        "`autoheal sync` warns at start when the breaker's limits (breaker_max_percent of the pool per "
        "breaker_window_seconds, breaker_max_concurrent at once) let fewer replacements through.",
        min=0, max=100)
    breaker_configmap: str = setting("autoheal-sync-breaker", doc="ConfigMap (in sync.namespace) holding the "
                                     "breaker state, shared by replicas and kept across restarts.",
                                     parse=V.dns_subdomain)

    def deprecations(self) -> List[str]:
        """Keys an older config sets that no longer do anything, each with what to do instead."""
        out = []
        if self.remediate_xids:
            out.append(f"sync.remediate_xids = {self.remediate_xids} is ignored: the node side owns the "
                       "'replace' rung (hooks.xid_policy, e.g. {\"79\" = \"replace\"}; `autoheal xid explain "
                       "79`); delete the key")
        return out

    def validate(self) -> None:
        """Cross-field checks: our own taint/condition must never count as an external signal; the chosen
        replacement action must have what it needs."""
        for spec in self.drain_on_taints:
            if spec.split(":")[0].split("=")[0] == self.taint_key:
                raise ConfigError(f"sync.drain_on_taints: {spec!r} is autoheal's own taint (sync.taint_key); "
                                  "it would drain nodes in a loop")
        for spec in self.drain_on_conditions:
            if self.health_condition and spec.split("=")[0] == self.health_condition:
                raise ConfigError(f"sync.drain_on_conditions: {spec!r} is autoheal's own condition "
                                  "(sync.health_condition); it would drain nodes in a loop")
        if self.replacement_action == "webhook" and not self.replacement_webhook:
            raise ConfigError("sync.replacement_webhook: the 'webhook' action needs an http(s) URL")
        if self.replacement_action == "custom-resource":
            problem = _template_problem(self.replacement_template)
            if problem:
                raise ConfigError(f"sync.replacement_template: {problem}")
        if self.breaker_rearm_percent > self.breaker_max_percent:
            raise ConfigError("sync.breaker_rearm_percent must not exceed sync.breaker_max_percent")

    def replacement_capacity(self, pool: int) -> ReplacementCapacity:
        """What the breaker's limits let through on a pool of ``pool`` nodes, against the expected rate."""
        import math

        per_window = math.floor(self.breaker_max_percent * pool / 100.0 + 1e-9)
        per_day = per_window * 86400.0 / self.breaker_window_seconds
        expected = pool * self.expected_failure_percent_per_day / 100.0
        arithmetic = (f"{self.breaker_max_percent:g}% x {pool} nodes = {per_window} start(s) per "
                      f"{self.breaker_window_seconds:.0f}s window = {per_day:.1f} per day; expected "
                      f"{self.expected_failure_percent_per_day:g}% x {pool} = {expected:.2f} per day")
        warning = ""
        if pool and (per_window == 0 or self.breaker_max_concurrent == 0):
            warning = (f"the breaker lets no replacement start at all on this pool ({arithmetic}, "
                       f"{self.breaker_max_concurrent} at once): raise sync.breaker_max_percent (or "
                       f"breaker_max_concurrent), or replace nodes by hand")
        elif pool and per_day < expected:
            warning = (f"the breaker lets fewer replacements through than the fleet is expected to need "
                       f"({arithmetic}): nodes will queue in state waiting; raise sync.breaker_max_percent or "
                       f"shorten sync.breaker_window_seconds")
        return ReplacementCapacity(pool, per_window, per_day, expected, arithmetic, warning)


@record(frozen=True)
class ReplacementCapacity:
    """The breaker's arithmetic on one pool (``SyncSection.replacement_capacity``); ``warning`` "" when the
    limits let at least the expected rate through."""

    pool: int
    per_window: int
    per_day: float
    expected_per_day: float
    arithmetic: str
    warning: str
