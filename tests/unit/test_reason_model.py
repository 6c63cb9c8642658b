"""The typed reason model (autoheal.reasons.Reason): render/parse round trips, and every reason string the
current release writes (or wrote) still parses to what the other side needs (sites upgrade with nodes
drained)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoheal.reasons import MAX_REASON_LEN, Origin, Reason, make_reason, parse_body, sanitize, strip_reason_suffix

_NODE = st.from_regex(r"\A[a-z][a-z0-9-]{0,12}\Z")
_PCI = st.from_regex(r"\A0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_TEXT = st.text(min_size=1, max_size=60).map(sanitize).filter(bool)
_KIND = st.sampled_from(["ecc", "nvlink", "temperature", "recovery-action", "clocks", "remapped-rows"])
_FAULT_ORIGINS = st.sampled_from([Origin.HEALTH, Origin.REBOOT, Origin.REPLACE, Origin.REQUEUED])


@st.composite
def faults(draw):
    kind = draw(st.sampled_from(["xid", "other"]))
    return Reason(origin=draw(_FAULT_ORIGINS), kind="xid" if kind == "xid" else draw(_KIND),
                  xid=draw(st.integers(1, 100000)) if kind == "xid" else None,
                  gpu=draw(st.none() | st.integers(0, 15)), node=draw(st.just("") | _NODE),
                  pci=draw(st.just("") | _PCI), detail=draw(st.just("") | _TEXT))


@st.composite
def free_texts(draw):
    origin = draw(st.sampled_from(list(Origin)))
    detail = draw(_TEXT)
    # free text that reads as a fault or starts with an origin tag is parsed as such: not free text
    if origin is Origin.HEALTH and Reason.parse(make_reason(detail)).origin is not Origin.HEALTH:
        detail = "note " + detail
    if parse_body(detail).kind:
        detail = "note " + detail
    return Reason(origin=origin, detail=detail)


@given(faults())
def test_a_fault_round_trips(r):
    assert Reason.parse(r.render()) == r


@given(free_texts())
def test_free_text_round_trips(r):
    assert Reason.parse(r.render()) == r


@given(st.text(max_size=120))
def test_any_reason_of_ours_renders_back_byte_identical(text):
    written = make_reason(text)
    parsed = Reason.parse(written)
    assert parsed is not None
    assert parsed.render() == written


@given(faults(), st.from_regex(r"\A[a-z]{1,8}@2026-0[1-9]-1[0-9]T0[0-9]:[0-5][0-9]:[0-5][0-9]\Z"))
def test_scontrol_user_time_suffix_is_ignored(r, stamp):
    assert Reason.parse(f"{r.render()} [{stamp}]") == r


def test_not_ours_is_none():
    assert Reason.parse("Not responding") is None
    assert Reason.parse("") is None
    assert Reason.parse(None) is None
    assert Reason.parse("autoheal-runner key=1") is None


def test_render_is_bounded_and_sanitised():
    r = Reason(kind="xid", xid=79, gpu=1, node="n1", detail="a\nb " + "x" * 400)
    out = r.render()
    assert len(out) <= MAX_REASON_LEN and "\n" not in out and out.endswith("...")
    assert len(r.with_origin(Origin.REQUEUED).render(max_len=1000)) > MAX_REASON_LEN


# Strings written by the current release (taken from the hooks' and sync's code paths, the tests, the docs
# and the drill), and by older releases, admins and tools: (string, origin, named xid, gpu, node).
CORPUS = [
    ("autoheal: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus", Origin.HEALTH, 79, 3, "gpu2"),
    ("autoheal: xid 79 on GPU 1 of gpu1 (0000:3b:00.0): fallen off the bus", Origin.HEALTH, 79, 1, "gpu1"),
    ("autoheal: xid 79 on GPU 0 of n1: fallen off the bus", Origin.HEALTH, 79, 0, "n1"),
    ("autoheal: xid 48 on GPU 1 of n1", Origin.HEALTH, 48, 1, "n1"),
    ("autoheal: xid 79 on a GPU of n1: fallen off the bus", Origin.HEALTH, 79, None, "n1"),
    ("autoheal: xid 79 on GPU 3 of gpu2 (0000:5d:00.0): fallen off the bus repeated 3 times", Origin.HEALTH,
     79, 3, "gpu2"),
    ("autoheal: ecc: GPU 2 of n1 (0000:5d:00.0): 1 uncorrectable ECC errors", Origin.HEALTH, None, 2, "n1"),
    ("autoheal: temperature: GPU 0 of gpu2: 92 C (limit 90)", Origin.HEALTH, None, 0, "gpu2"),
    ("autoheal: nvlink: GPU 1 of n1 (0000:3b:00.0): link 2 down", Origin.HEALTH, None, 1, "n1"),
    ("autoheal: driver: NVML unavailable: Driver Not Loaded", Origin.HEALTH, None, None, ""),
    ("autoheal: reboot: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus", Origin.REBOOT, 79, 3, "gpu2"),
    ("autoheal: replace: xid 79 on GPU 1 of n1", Origin.REPLACE, 79, 1, "n1"),
    ("autoheal: replace: xid 79 on gpu1 kept failing after reset and reboot", Origin.REPLACE, 79, None, ""),
    ("autoheal: replace: ecc-dbe on gpu 1 [root@2026-01-01T00:00:00]", Origin.REPLACE, None, None, ""),
    ("autoheal: replace", Origin.REPLACE, None, None, ""),
    ("autoheal: pre-emptive swap: row remap pending on GPU 0 of gpu2", Origin.PRESWAP, None, None, ""),
    ("autoheal: pre-emptive swap: high correctable ECC rate (xid 92) on GPU 0 of n1", Origin.PRESWAP, 92, None, ""),
    ("autoheal: k8s: node cordoned", Origin.K8S, None, None, ""),
    ("autoheal: k8s: node cordoned: lent to inference", Origin.K8S, None, None, ""),
    ("autoheal: k8s: taint nvidia.com/gpu-error=xid79:NoSchedule", Origin.K8S, 79, None, ""),
    ("autoheal: retired: replaced by spare1", Origin.RETIRED, None, None, ""),
    ("autoheal: retired: Node deleted for replacement", Origin.RETIRED, None, None, ""),
    ("autoheal: spare: held in the spare pool", Origin.SPARE, None, None, ""),
    ("autoheal: spare pool: held out of service until a replacement is requested", Origin.SPARE_POOL, None,
     None, ""),
    ("autoheal: requeued after xid 79 on GPU 1 of gpu1 (0000:3b:00.0): fallen off the bus", Origin.REQUEUED, 79,
     1, "gpu1"),
    ("autoheal: requeued after a GPU fault", Origin.REQUEUED, None, None, ""),
    # older releases, admins (``autoheal node drain --reason``) and other tools
    ("autoheal: xid 79 gpu 3 (0000:5d:00.0): fallen off the bus [root@2026-11-30T09:31:56]", Origin.HEALTH, 79,
     None, ""),
    ("autoheal: xid=79 gpu=3", Origin.HEALTH, 79, None, ""),
    ("autoheal: xid 79: gpu 3 fell off the bus", Origin.HEALTH, 79, None, ""),
    ("autoheal: XID 48 on gpu2: DBE", Origin.HEALTH, 48, None, ""),
    ("autoheal: ecc-dbe on gpu 3", Origin.HEALTH, None, None, ""),
    ("autoheal: test: drain via adapter with newline", Origin.HEALTH, None, None, ""),
    ("autoheal: x [root@2026-11-30T08:19:06]", Origin.HEALTH, None, None, ""),
]


@pytest.mark.parametrize("text,origin,xid,gpu,node", CORPUS)
def test_todays_strings_parse(text, origin, xid, gpu, node):
    r = Reason.parse(text)
    assert r is not None
    assert (r.origin, r.named_xid, r.gpu, r.node) == (origin, xid, gpu, node)
    assert r.render() == strip_reason_suffix(text)  # rewriting a parsed reason never changes it
    assert r.rung == (origin if origin in (Origin.REBOOT, Origin.REPLACE) else None)


def test_fault_fields():
    r = Reason.parse("autoheal: replace: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus")
    assert r == Reason(Origin.REPLACE, "xid", 79, 3, "gpu2", "0000:3b:00.0", "fallen off the bus")
    assert r.with_origin(Origin.HEALTH).render() == \
        "autoheal: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus"
    assert Reason.parse("autoheal: nvlink: GPU 1 of n1: link 2 down").kind == "nvlink"


@given(st.text(max_size=120), st.sampled_from([Origin.HEALTH, Origin.REBOOT, Origin.REPLACE]))
def test_hooks_render_what_they_wrote_before(text, origin):
    # hooks/engine.py used to write make_reason(<rung>, <check text>): the model must write the same bytes
    assert parse_body(text, origin).render() == make_reason(origin.value, text)


@given(st.text(max_size=120))
def test_requeue_comment_is_what_it_was(text):
    assert parse_body(text, Origin.REQUEUED).render(max_len=1000) == make_reason(f"requeued after {text}",
                                                                                 max_len=1000)


def test_runner_marker_is_defined_once():
    from autoheal.config.hooks_section import HooksSection
    from autoheal.reasons import RUNNER_MARKER
    from autoheal.sbatch_helpers import comment, wrapper

    assert wrapper.MARKER is RUNNER_MARKER and comment.MARKER is RUNNER_MARKER
    assert HooksSection().runner_comment == RUNNER_MARKER
    assert comment.is_runner_comment(comment.CommentState().render())


@given(st.text(max_size=80), st.text(max_size=300))
def test_k8s_reasons_parse_as_k8s(what, detail):
    from autoheal.k8s_sync.names import is_health_reason, is_k8s_reason, k8s_reason

    written = k8s_reason(what, detail)
    assert Reason.parse(written).origin is Origin.K8S
    assert is_k8s_reason(written) and not is_health_reason(written)


@given(st.text(max_size=100))
def test_preswap_reason_is_what_it_was(text):
    assert Reason(Origin.PRESWAP, detail=text).render() == make_reason("pre-emptive swap", text)


def test_requeued_fault_is_the_drain_reason_a_requeue_note_carries():
    note = Reason.parse("autoheal: requeued after replace: xid 79 on GPU 0 of gpu1 (0000:3b:00.0): fallen off the bus")
    fault = note.requeued_fault()
    assert (fault.origin, fault.kind, fault.xid, fault.gpu, fault.node) == (Origin.REPLACE, "xid", 79, 0, "gpu1")
    plain = Reason.parse("autoheal: requeued after xid 48 on GPU 2 of n7").requeued_fault()
    assert (plain.origin, plain.xid, plain.node) == (Origin.HEALTH, 48, "n7")
    assert Reason.parse("autoheal: xid 79 on GPU 0 of n1").requeued_fault() is None  # a drain, not a note
    assert Reason.parse("autoheal: requeued after something we never wrote").requeued_fault().node == ""
