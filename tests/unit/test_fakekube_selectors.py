"""Label and field selector parsing and matching of the fake API server."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoheal_lab.fakekube.selectors import (
    SelectorError,
    field_selector_matches,
    field_value,
    label_selector_from_dict,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "slurmd", "tier": "gpu", "zone": "a", "count": "3"}


@pytest.mark.parametrize("text,expected", [
    ("", True),
    ("app=slurmd", True),
    ("app==slurmd", True),
    ("app!=slurmd", False),
    ("app!=other", True),
    ("missing!=x", True),
    ("tier in (gpu,cpu)", True),
    ("tier in (cpu)", False),
    ("tier notin (cpu)", True),
    ("missing notin (cpu)", True),
    ("missing in (cpu)", False),
    ("zone", True),
    ("!zone", False),
    ("!missing", True),
    ("count>2", True),
    ("count<2", False),
    ("app=slurmd, tier in (gpu), !missing", True),
    ("app=slurmd,tier=cpu", False),
    ("example.com/owner", False),
])
def test_label_selector_matching(text, expected):
    assert parse_label_selector(text).matches(LABELS) is expected


@pytest.mark.parametrize("bad", ["a b", "x in ()", "=b", "a=b,", "k>x", "a in (b", "bad key=1", "a=b c"])
def test_label_selector_syntax_errors(bad):
    with pytest.raises(SelectorError):
        parse_label_selector(bad)


def test_label_selector_from_dict():
    sel = label_selector_from_dict({"matchLabels": {"app": "slurmd"},
                                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]},
                                                         {"key": "gone", "operator": "DoesNotExist"}]})
    assert sel.matches(LABELS)
    assert not sel.matches({"app": "slurmd"})
    assert label_selector_from_dict({}).matches({})
    assert not label_selector_from_dict(None).matches(LABELS)
    with pytest.raises(SelectorError):
        label_selector_from_dict({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]})


label_values = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,6}[a-z0-9])?", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), label_values, max_size=3),
       st.sampled_from(["a", "b", "c"]), label_values)
def test_equality_and_inequality_partition_objects(labels, key, value):
    eq = parse_label_selector(f"{key}={value}").matches(labels)
    ne = parse_label_selector(f"{key}!={value}").matches(labels)
    assert eq != ne
    assert parse_label_selector(f"{key} in ({value})").matches(labels) == eq
    assert parse_label_selector(f"{key} notin ({value})").matches(labels) == ne


def test_field_selectors():
    pod = {"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "gpu-1", "hostNetwork": True},
           "status": {"phase": "Running"}}
    assert field_selector_matches(parse_field_selector("spec.nodeName=gpu-1"), pod)
    assert field_selector_matches(parse_field_selector("spec.nodeName==gpu-1,status.phase!=Failed"), pod)
    assert not field_selector_matches(parse_field_selector("spec.nodeName!=gpu-1"), pod)
    assert field_value(pod, "spec.hostNetwork") == "true"
    assert field_selector_matches(parse_field_selector("spec.schedulerName="), pod)
    assert parse_field_selector(r"metadata.name=a\,b") == [("metadata.name", "=", "a,b")]
    with pytest.raises(SelectorError):
        parse_field_selector("nonsense")
