"""The node state's one load and save (hooks/state.py): today's files, the older layout xid-watch wrote
before its job side, and a file that is not JSON (kept aside, said once, never silently overwritten)."""

from __future__ import annotations

import json
import re

import pytest

from autoheal.hooks import jobside
from autoheal.hooks import state as S

#: A file as today's hooks write it (keys a healthcheck, an epilog and xid-watch left), trimmed.
TODAY = {
    "version": 1, "passes": 2, "kmsg": {"path": "/dev/kmsg", "seq": 41},
    "drain": {"reason": "autoheal: xid 79 on GPU 1 of gpu1", "time": 1700000000.0, "source": "healthcheck",
              "check": "xid", "action": "reset-gpu", "gpu": 1},
    "faults": [{"check": "xid", "gpu": 1, "action": "reset-gpu", "reason": "xid 79 on GPU 1 of gpu1",
                "since": 1700000000.0, "evidence": {"xid": 79}, "count": 3}],
    "ladder": {"gpu1": {"reset": [1700000100.0]}},
    "job_actions": {"7@drain-1700000000.000": {"job": "7", "fault": "drain-1700000000.000", "stage": "grace",
                                               "deadline": 1700000300.0, "hot_spare": True}},
    "a_key_a_newer_hook_wrote": {"kept": True},
}


def test_todays_file_reads_back_with_every_key_and_keeps_unknown_ones(tmp_path):
    (tmp_path / S.STATE_FILE).write_text(json.dumps(TODAY))
    st = S.NodeState(str(tmp_path)).read()
    assert st["drain"] == TODAY["drain"] and st["faults"] == TODAY["faults"] and st["passes"] == 2
    assert st["job_actions"] == TODAY["job_actions"]
    # keys this file predates are there, empty: readers index them without a default
    assert st["reboot_requested"] is None and st["app_jobs"] == {} and st["requeue_faults"] == []
    assert set(S.empty()) <= set(st)
    with S.NodeState(str(tmp_path)).locked() as st2:
        st2["passes"] += 1
    disk = json.loads((tmp_path / S.STATE_FILE).read_text())
    assert disk["passes"] == 3 and disk["a_key_a_newer_hook_wrote"] == {"kept": True}  # a downgrade loses nothing
    assert S.load(S.dump(st)) == st  # the one load reads what the one save wrote


def test_the_old_requeues_layout_becomes_job_actions_in_their_grace(tmp_path):
    """Before the job side, xid-watch kept pending requeues in ``requeues``: after an upgrade each job is
    still requeued at its deadline (a grace-stage job action under a fault of its own), and never twice."""
    old = {"passes": 0, "requeues": {"12": {"xid": 79, "gpu": 3, "note": "autoheal: xid 79 on GPU 3 of gpu1",
                                            "deadline": 1700000500.0}}}
    (tmp_path / S.STATE_FILE).write_text(json.dumps(old))
    st = S.NodeState(str(tmp_path)).read()
    assert "requeues" not in st
    action = st["job_actions"]["12@legacy-79-3"]
    assert action["stage"] == jobside.GRACE and action["deadline"] == 1700000500.0 and action["job"] == "12"
    assert action["note"] == "autoheal: requeued after xid 79 on GPU 3 of gpu1"  # the comment the job gets
    assert st["requeue_faults"] == [{"id": "legacy-79-3", "reason": "", "since": 0, "jobs": ["12"]}]
    with S.NodeState(str(tmp_path)).locked() as st2:
        st2["job_actions"]["12@legacy-79-3"]["stage"] = jobside.DONE
    disk = json.loads((tmp_path / S.STATE_FILE).read_text())
    assert "requeues" not in disk and disk["job_actions"]["12@legacy-79-3"]["stage"] == "done"
    assert len(disk["requeue_faults"]) == 1  # upgraded once: the saved file is today's layout


@pytest.mark.parametrize("raw", [json.dumps(TODAY)[:57].encode(), b"", b"\xff\xfe garbage", b"[1, 2]", b"null"],
                         ids=["torn", "empty", "not-utf8", "a-list", "null"])
def test_a_corrupt_file_is_a_clear_error_and_its_bytes_are_kept(tmp_path, raw):
    path = tmp_path / S.STATE_FILE
    path.write_bytes(raw)
    with pytest.raises(S.StateCorrupt, match="state.json"):
        S.load(raw, str(path))
    with pytest.raises(S.StateCorrupt):  # a reader (autoheal node history) is told, not shown an empty state
        S.NodeState(str(tmp_path)).read()
    # the hooks (fallback) go on from an empty state, say so, and keep the bytes before replacing the file
    store = S.NodeState(str(tmp_path), fallback=True)
    assert store.read() == S.empty() and "is corrupt (" in store.trouble
    with store.locked() as st:
        assert st == S.empty()
        st["passes"] = 1
    assert (tmp_path / S.CORRUPT_FILE).read_bytes() == raw
    assert "kept as" in store.trouble and str(tmp_path / S.CORRUPT_FILE) in store.trouble
    assert S.load(path.read_bytes())["passes"] == 1
    with store.locked() as st:  # told by this run's report however many writes it makes
        st["passes"] += 1
    assert "kept as" in store.trouble and S.load(path.read_bytes())["passes"] == 2
    later = S.NodeState(str(tmp_path), fallback=True)  # the next hook's run: the file is today's again
    with later.locked() as st:
        st["passes"] += 1
    assert later.trouble == "" and (tmp_path / S.CORRUPT_FILE).read_bytes() == raw


def test_a_corrupt_file_is_kept_even_when_the_replacing_write_fails(tmp_path, monkeypatch):
    """No data loss: the corrupt bytes are saved before the new file, and a write that fails leaves both
    the old file and the in-memory copy (today's fallback)."""
    path = tmp_path / S.STATE_FILE
    path.write_bytes(b"{not json")
    store = S.NodeState(str(tmp_path), fallback=True)
    calls = []

    def failing(self, name, data, mode):
        calls.append(name)
        if name == S.STATE_FILE:
            raise OSError(28, "No space left on device")
        real(self, name, data, mode)

    real = S.NodeState._write_file
    monkeypatch.setattr(S.NodeState, "_write_file", failing)
    with store.locked() as st:
        st["passes"] = 5
    assert calls == [S.CORRUPT_FILE, S.STATE_FILE] and "No space left" in store.trouble
    assert path.read_bytes() == b"{not json" and (tmp_path / S.CORRUPT_FILE).read_bytes() == b"{not json"
    assert store.read()["passes"] == 5  # kept in memory until the disk takes it


def test_the_prolog_on_a_corrupt_state_lets_the_job_start_and_journals_it(tmp_path, monkeypatch):
    """Through a hook's entry point: the job starts (exit 0), the journal says where the bytes went."""
    from autoheal.config import Config
    from autoheal.config.hooks_section import HooksSection
    from autoheal.hooks import context, jobhook

    state_dir, journal = tmp_path / "state", tmp_path / "journal.jsonl"
    state_dir.mkdir()
    (state_dir / S.STATE_FILE).write_bytes(b'{"passes": 3, "drain": {"reas')  # torn by hand: not by our writes

    def ctx(cls, source, *a, **k):
        cfg = Config()
        cfg.hooks = HooksSection(state_dir=str(state_dir), kernel_log="", expected_gpus=0, dcgm_mapping_dir="")
        cfg.journal.path = str(journal)
        return context.Context(cfg, "n1", source)

    monkeypatch.setattr(context.Context, "load", classmethod(ctx))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert jobhook.run("prolog") == 0
    assert (state_dir / S.CORRUPT_FILE).read_bytes() == b'{"passes": 3, "drain": {"reas'
    assert S.load((state_dir / S.STATE_FILE).read_bytes())["drain"] is None
    recs = [json.loads(x) for x in journal.read_text().splitlines()]
    trouble = [r for r in recs if r["event"] == "error" and r["action"] == "hook-trouble"]
    assert trouble and S.CORRUPT_FILE in trouble[-1]["message"], recs


def test_node_history_on_a_corrupt_state_says_so_and_exits_2(tmp_path):
    from click.testing import CliRunner

    from autoheal.cli.main import cli

    (tmp_path / "gpu2").mkdir()
    (tmp_path / "gpu2" / S.STATE_FILE).write_text('{"history": [')
    conf = tmp_path / "autoheal.toml"
    conf.write_text(f'[hooks]\nstate_dir = "{tmp_path}/{{node}}"\n')
    res = CliRunner().invoke(cli, ["node", "history", "gpu2", "--config", str(conf)])
    assert res.exit_code == 2 and "not JSON" in res.output and "Traceback" not in res.output, res.output
    assert (tmp_path / "gpu2" / S.STATE_FILE).read_text() == '{"history": ['  # a reader never rewrites it


def test_a_symlink_planted_as_the_state_is_never_read_nor_kept(tmp_path):
    """Its target (another user's link to a root-only file) is not state: not read, not copied aside."""
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / S.STATE_FILE).symlink_to(target)
    store = S.NodeState(str(tmp_path / "node"), fallback=True)
    with store.locked() as st:
        assert st == S.empty()
        st["passes"] = 1
    assert store.trouble == "" and not (tmp_path / "node" / S.CORRUPT_FILE).exists()
    assert not (tmp_path / "node" / S.STATE_FILE).is_symlink() and target.read_text() == "root's file\n"


def _entry(**fields):
    return {"xid": 79, "gpu": 3, "note": "autoheal: xid 79 on GPU 3 of gpu1", "deadline": 1700000500.0, **fields}


#: Old-layout files with odd values: each was a ValueError, TypeError, OverflowError or AttributeError out
#: of ``_upgrade`` (a traceback in every hook, the file never replaced), or silently dropped.
ODD_OLD = {
    "deadline-a-string": {"requeues": {"12": _entry(deadline="1700000500")}},
    "deadline-a-word": {"requeues": {"12": _entry(deadline="soon")}},
    "deadline-a-list": {"requeues": {"12": _entry(deadline=[1700000500])}},
    "deadline-huge-int": {"requeues": {"12": _entry(deadline=10 ** 400)}},
    "deadline-infinite": {"requeues": {"12": _entry(deadline=float("inf"))}},
    "deadline-nan": {"requeues": {"12": _entry(deadline=float("nan"))}},
    "deadline-a-bool": {"requeues": {"12": _entry(deadline=True)}},
    "xid-a-dict": {"requeues": {"12": _entry(xid={"a": [1, {"b": None}]})}},
    "xid-a-float": {"requeues": {"12": _entry(xid=79.5)}},
    "gpu-a-string": {"requeues": {"12": _entry(gpu="3; rm -rf /")}},
    "note-a-number": {"requeues": {"12": _entry(note=12)}},
    "note-nested": {"requeues": {"12": _entry(note=[["x"], {"y": [None]}])}},
    "entry-a-list": {"requeues": {"12": [79, 3]}},
    "entry-none": {"requeues": {"12": None}},
    "job-not-a-job-id": {"requeues": {"12; scancel -u root": _entry()}},
    "job-with-a-newline": {"requeues": {"12\n": _entry()}},
    "requeues-a-list": {"requeues": [{"12": _entry()}]},
    "requeues-a-string": {"requeues": "12"},
    "job-actions-a-list": {"requeues": {"12": _entry()}, "job_actions": [1, 2]},
    "requeue-faults-a-dict": {"requeues": {"12": _entry()}, "requeue_faults": {"a": {}}},
}


@pytest.mark.parametrize("data", list(ODD_OLD.values()), ids=list(ODD_OLD))
def test_an_old_layout_with_odd_values_is_a_corrupt_state_never_a_traceback(tmp_path, data):
    raw = json.dumps(data).encode()  # inf and nan as json writes them (Infinity, NaN)
    with pytest.raises(S.StateCorrupt, match="state.json"):
        S.load(raw, str(tmp_path / S.STATE_FILE))
    (tmp_path / S.STATE_FILE).write_bytes(raw)
    store = S.NodeState(str(tmp_path), fallback=True)  # the hooks: the documented corrupt-file path
    assert store.read() == S.empty()
    assert re.search(r"is corrupt \((old requeues|job_actions is|requeue_faults is) ", store.trouble), store.trouble
    with store.locked() as st:
        assert st == S.empty()
    assert (tmp_path / S.CORRUPT_FILE).read_bytes() == raw
    assert S.load((tmp_path / S.STATE_FILE).read_bytes()) == S.empty()


#: Today's layout with a key of the wrong kind: the hooks read these with .get() and iterate or index
#: them, so each was a TypeError/AttributeError in a later hook, on every run.
ODD_TODAY = {
    "faults-a-dict": {"faults": {"check": "xid"}},
    "faults-of-strings": {"faults": ["xid 79"]},
    "drain-a-string": {"drain": "autoheal: xid 79"},
    "drain-a-list": {"drain": [1]},
    "job-actions-of-numbers": {"job_actions": {"7@x": 3}},
    "ladder-of-lists": {"ladder": {"gpu1": [1.0]}},
    "recent-xids-a-string": {"recent_xids": "79"},
    "passes-a-string": {"passes": "2"},
    "passes-none": {"passes": None},
    "passes-huge": {"passes": 10 ** 400},
    "version-a-list": {"version": [1]},
    "episode-a-number": {"episode": 5},
    "kmsg-a-list": {"kmsg": [["seq", 41]]},
    # one level down: fields the hooks read with float()/int() on every run
    "kmsg-seq-a-word": {"kmsg": {"boot_id": "b", "max_seq": "forty-one"}},
    "drain-time-a-word": {"drain": {"reason": "autoheal: xid 79", "time": "yesterday"}},
    "fault-since-a-list": {"faults": [{"check": "xid", "since": [1]}]},
    "action-deadline-huge": {"job_actions": {"7@x": {"job": "7", "deadline": 10 ** 400}}},
    "recent-xid-time-nested": {"recent_xids": [{"xid": 79, "time": {"a": {"b": [None]}}}]},
}


@pytest.mark.parametrize("data", list(ODD_TODAY.values()), ids=list(ODD_TODAY))
def test_a_key_of_the_wrong_kind_is_a_corrupt_state(tmp_path, data):
    raw = json.dumps(data).encode()
    with pytest.raises(S.StateCorrupt, match=r"state.json: \w+"):
        S.load(raw, str(tmp_path / S.STATE_FILE))
    (tmp_path / S.STATE_FILE).write_bytes(raw)
    store = S.NodeState(str(tmp_path), fallback=True)
    with store.locked() as st:
        st["passes"] = 1
    assert (tmp_path / S.CORRUPT_FILE).read_bytes() == raw and "kept as" in store.trouble
    assert f"was corrupt ({next(iter(data))}" in store.trouble  # the one line names what was wrong


def test_null_lists_and_maps_read_as_empty_and_good_old_values_still_upgrade():
    """What is not odd stays readable: a null list or map (an older hook wrote None) is empty, an old
    entry with null fields, an array task's id and an integer deadline upgrade as before."""
    st = S.load(json.dumps({"faults": None, "job_actions": None, "requeue_faults": None, "counters": None,
                            "drain": None, "passes": 0,
                            "requeues": {"12_3": _entry(xid=None, gpu=None, note=None, deadline=1700000500)}}))
    assert st["faults"] == [] and st["counters"] == {} and st["drain"] is None
    action = st["job_actions"]["12_3@legacy-None-None"]
    assert action["deadline"] == 1700000500.0 and action["job"] == "12_3"
    assert st["requeue_faults"] == [{"id": "legacy-None-None", "reason": "", "since": 0, "jobs": ["12_3"]}]
