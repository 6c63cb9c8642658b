"""Patch formats of the fake API server, on plain dicts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoheal_lab.fakekube.patch import PatchError, create_merge_patch, json_patch, merge_patch, strategic_merge_patch
from autoheal_lab.fakekube.resources import builtin_types

NODE_SCHEMA = next(t for t in builtin_types() if t.kind == "Node").schema()
POD_SCHEMA = next(t for t in builtin_types() if t.kind == "Pod").schema()
PDB_SCHEMA = next(t for t in builtin_types() if t.kind == "PodDisruptionBudget").schema()

# -- JSON merge patch --------------------------------------------------------------------------

scalars = st.one_of(st.integers(), st.text(max_size=3), st.booleans())
keys = st.sampled_from(["a", "b", "c", "d"])
docs = st.recursive(scalars | st.lists(scalars, max_size=3),
                    lambda children: st.dictionaries(keys, children, max_size=4), max_leaves=12)
objects = st.dictionaries(keys, docs, max_size=4)
patches = st.recursive(st.one_of(scalars, st.none()),
                       lambda children: st.dictionaries(keys, children, max_size=4), max_leaves=12)


def test_merge_patch_rfc7386_examples():
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": "b", "b": "c"}, {"a": None}) == {"b": "c"}
    assert merge_patch({"a": ["b"]}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "c"}, {"a": ["b"]}) == {"a": ["b"]}
    assert merge_patch({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}


@settings(max_examples=150, deadline=None)
@given(objects, st.dictionaries(keys, patches, max_size=4))
def test_merge_patch_is_idempotent_and_pure(target, patch):
    before = repr(target)
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    assert repr(target) == before  # inputs untouched


@settings(max_examples=150, deadline=None)
@given(objects, objects)
def test_diff_then_merge_gives_the_target(original, modified):
    assert merge_patch(original, create_merge_patch(original, modified)) == modified


@settings(max_examples=100, deadline=None)
@given(objects)
def test_empty_merge_patch_is_identity(target):
    assert merge_patch(target, {}) == target


# -- strategic merge patch ---------------------------------------------------------------------

def test_conditions_merge_by_type():
    node = {"status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "MemoryPressure", "status": "False"}]}}
    patch = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"},
                                       {"type": "GpuHealthy", "status": "False"}]}}
    out = strategic_merge_patch(node, patch, NODE_SCHEMA)
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "False", "reason": "KubeletDown"},
        {"type": "MemoryPressure", "status": "False"},
        {"type": "GpuHealthy", "status": "False"},
    ]


def test_taints_replace_as_a_whole():
    node = {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]}}
    out = strategic_merge_patch(node, {"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}}, NODE_SCHEMA)
    assert out["spec"]["taints"] == [{"key": "c", "effect": "NoSchedule"}]
    assert "taints" not in strategic_merge_patch(node, {"spec": {"taints": None}}, NODE_SCHEMA)["spec"]


def test_containers_merge_by_name_and_env_by_name():
    pod = {"spec": {"containers": [{"name": "a", "image": "x:1", "env": [{"name": "E", "value": "1"}]},
                                   {"name": "b", "image": "y:1"}]}}
    patch = {"spec": {"containers": [{"name": "a", "image": "x:2", "env": [{"name": "F", "value": "2"}]}]}}
    out = strategic_merge_patch(pod, patch, POD_SCHEMA)
    assert out["spec"]["containers"][0] == {"name": "a", "image": "x:2",
                                            "env": [{"name": "E", "value": "1"}, {"name": "F", "value": "2"}]}
    assert out["spec"]["containers"][1] == {"name": "b", "image": "y:1"}


def test_patch_delete_directive_in_list_and_map():
    node = {"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]},
            "metadata": {"labels": {"x": "1"}}}
    out = strategic_merge_patch(node, {"status": {"conditions": [{"type": "A", "$patch": "delete"}]},
                                       "metadata": {"labels": {"$patch": "delete"}}}, NODE_SCHEMA)
    assert out["status"]["conditions"] == [{"type": "B", "status": "True"}]
    assert "labels" not in out["metadata"]


def test_patch_replace_directive_on_map_and_list():
    obj = {"metadata": {"labels": {"a": "1", "b": "2"}},
           "status": {"conditions": [{"type": "A", "status": "True"}]}}
    out = strategic_merge_patch(obj, {"metadata": {"labels": {"$patch": "replace", "c": "3"}},
                                      "status": {"conditions": [{"$patch": "replace"}, {"type": "Z", "status": "x"}]}},
                                NODE_SCHEMA)
    assert out["metadata"]["labels"] == {"c": "3"}
    assert out["status"]["conditions"] == [{"type": "Z", "status": "x"}]


def test_finalizers_are_a_merged_set_and_delete_from_primitive_list():
    obj = {"metadata": {"finalizers": ["a", "b"]}}
    out = strategic_merge_patch(obj, {"metadata": {"finalizers": ["b", "c"]}}, NODE_SCHEMA)
    assert out["metadata"]["finalizers"] == ["a", "b", "c"]
    out = strategic_merge_patch(out, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, NODE_SCHEMA)
    assert out["metadata"]["finalizers"] == ["b", "c"]


def test_set_element_order_reorders_named_elements():
    node = {"status": {"conditions": [{"type": "A"}, {"type": "B"}, {"type": "C"}]}}
    patch = {"status": {"$setElementOrder/conditions": [{"type": "C"}, {"type": "A"}],
                        "conditions": [{"type": "A", "status": "x"}]}}
    out = strategic_merge_patch(node, patch, NODE_SCHEMA)
    assert [c["type"] for c in out["status"]["conditions"]] == ["C", "B", "A"]


def test_replace_strategy_map_pdb_selector():
    pdb = {"spec": {"selector": {"matchLabels": {"a": "1"}}}}
    out = strategic_merge_patch(pdb, {"spec": {"selector": {"matchExpressions": []}}}, PDB_SCHEMA)
    assert out["spec"]["selector"] == {"matchExpressions": []}


def test_missing_merge_key_is_an_error():
    with pytest.raises(PatchError) as exc:
        strategic_merge_patch({}, {"status": {"conditions": [{"status": "True"}]}}, NODE_SCHEMA)
    assert "does not contain declared merge key: type" in str(exc.value)


def test_new_list_element_has_its_directives_stripped():
    out = strategic_merge_patch({}, {"status": {"conditions": [{"type": "A", "status": "True"}]}}, NODE_SCHEMA)
    assert out == {"status": {"conditions": [{"type": "A", "status": "True"}]}}


# -- JSON patch (RFC 6902) ---------------------------------------------------------------------

def test_json_patch_operations():
    doc = {"metadata": {"labels": {"a/b": "1", "m~n": "2"}}, "spec": {"taints": [{"key": "x"}]}}
    out = json_patch(doc, [
        {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
        {"op": "replace", "path": "/metadata/labels/m~0n", "value": "3"},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "y"}},
        {"op": "add", "path": "/spec/taints/0", "value": {"key": "w"}},
        {"op": "copy", "from": "/spec/taints/0", "path": "/spec/first"},
        {"op": "move", "from": "/metadata/labels/a~1b", "path": "/metadata/labels/moved"},
        {"op": "remove", "path": "/spec/taints/1"},
    ])
    assert out["metadata"]["labels"] == {"m~n": "3", "moved": "1"}
    assert out["spec"]["taints"] == [{"key": "w"}, {"key": "y"}]
    assert out["spec"]["first"] == {"key": "w"}
    assert doc["spec"]["taints"] == [{"key": "x"}]


@pytest.mark.parametrize("ops", [
    [{"op": "test", "path": "/a", "value": 2}],
    [{"op": "remove", "path": "/missing"}],
    [{"op": "replace", "path": "/missing", "value": 1}],
    [{"op": "add", "path": "/l/5", "value": 1}],
    [{"op": "add", "path": "/x/y", "value": 1}],
])
def test_json_patch_failures(ops):
    with pytest.raises(PatchError):
        json_patch({"a": 1, "l": []}, ops)


def test_json_patch_bad_documents_are_400():
    for bad in ({"op": "add"}, [{"op": "frobnicate", "path": "/a"}], [{"path": "/a"}]):
        with pytest.raises(PatchError) as exc:
            json_patch({}, bad)
        assert exc.value.code == 400
