"""The fault proxy's decisions (autoheal_lab.apifaults): which request a rule hits, in which window, and
what an injected answer looks like. The proxy itself runs against the real API server in
tests/integration/test_apifaults_lab.py."""

from __future__ import annotations

import json

import pytest

from autoheal_lab.apifaults import FaultRules, is_watch_request, peer_identity, status_body


def test_rules_match_in_order_count_hits_and_run_out():
    rules = FaultRules()
    first = rules.add(method="PATCH", path_regex=r"/nodes/", status=500, times=1)
    second = rules.add(path_regex=r"^/api", status=503)
    assert rules.match("GET", "/api/v1/nodes", False) is second  # method differs from the first
    assert rules.match("patch", "/api/v1/nodes/gpu1", False) is first
    assert rules.match("PATCH", "/api/v1/nodes/gpu1", False) is second  # the first is spent
    assert (first.hits, second.hits) == (1, 2)
    assert rules.match("GET", "/version", False) is None
    assert rules.remove(second.id) and not rules.remove(second.id)
    assert rules.match("GET", "/api/v1/nodes", False) is None


def test_watch_only_rules_skip_and_windows():
    rules = FaultRules()
    rule = rules.add(watch=True, drop_after_ms=100, skip=1, start=100.0, end=200.0)
    assert rules.match("GET", "/api/v1/nodes", True, now=50.0) is None  # before the window
    assert rules.match("GET", "/api/v1/nodes", False, now=150.0) is None  # not a watch
    assert rules.match("GET", "/api/v1/nodes", True, now=150.0) is None  # the skipped one
    assert rules.match("GET", "/api/v1/nodes", True, now=150.0) is rule
    assert rules.match("GET", "/api/v1/nodes", True, now=200.0) is None  # the window is over
    assert rule.hits == 1


def test_bad_rules_are_refused_with_what_is_wrong():
    rules = FaultRules()
    with pytest.raises(ValueError, match="unknown fault fields: colour"):
        rules.add(colour="red")
    with pytest.raises(ValueError, match="HTTP error code"):
        rules.add(status=200)
    assert rules.rules() == []


@pytest.mark.parametrize("path,query,watch", [
    ("/api/v1/nodes", "watch=1&resourceVersion=5", True),
    ("/api/v1/namespaces/slurm/pods", "labelSelector=a&watch=true", True),
    ("/api/v1/watch/nodes", "", True),
    ("/apis/coordination.k8s.io/v1/watch/namespaces/slurm/leases", "", True),
    ("/api/v1/nodes", "watch=false", False),
    ("/api/v1/nodes", "resourceVersion=5&allowWatchBookmarks=true", False),
    ("/api/v1/nodes/watch", "", False),  # a Node named "watch"
])
def test_watch_requests_are_told_as_the_api_server_tells_them(path, query, watch):
    assert is_watch_request(path, query) is watch


def test_injected_status_is_worded_as_kube_apiserver_words_it():
    body = json.loads(status_body(429, retry_after=1))
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
                    "code": 429, "details": {"retryAfterSeconds": 1}}
    assert json.loads(status_body(503))["reason"] == "ServiceUnavailable"
    assert "details" not in json.loads(status_body(500))


def test_peer_identity_of_a_client_certificate():
    cert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "autoheal-lab-admin"),))}
    assert peer_identity(cert) == ("autoheal-lab-admin", ["system:masters"])
    assert peer_identity({}) == ("", [])
    assert peer_identity(None) == ("", [])
