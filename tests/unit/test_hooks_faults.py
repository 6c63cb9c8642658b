"""The hooks' own trouble never fails Slurm (issue 16 finding 3), healing never waits for a webhook
(finding 6), a repair ends the XID dedupe window (finding 11, issue 17 item 3), wording and journal
noise (issue 15), config validation of hooks (finding 15)."""

from __future__ import annotations

import errno
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest
from test_hooks_jobside import FakeCtld

from autoheal.config import Config, parse_config
from autoheal.config.hooks_section import HooksSection
from autoheal.errors import ConfigError
from autoheal.hooks import checks as C
from autoheal.hooks import engine, jobhook
from autoheal.hooks import state as S
from autoheal.hooks.xids import XidEvent
from autoheal.reasons import parse_body
from autoheal.slurm.model import Node
from autoheal_lab.testing.hooks import hook_context

# ---- the node state: read-only, full, locked -------------------------------------------------------

def test_full_disk_leaves_no_tmp_file_and_the_hook_goes_on_in_memory(tmp_path, monkeypatch):
    store = S.NodeState(str(tmp_path), fallback=True)
    with store.locked() as st:
        st["passes"] = 1

    def enospc(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", enospc)
    with store.locked() as st:
        st["passes"] = 2
    assert store.trouble.endswith("No space left on device")
    assert store.read()["passes"] == 2  # the hook keeps its own view
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no .state.json.PID.tmp
    monkeypatch.undo()
    with store.locked() as st:  # the disk takes it again: the in-memory copy is written back
        st["passes"] += 1
    assert store.trouble == "" and json.loads((tmp_path / "state.json").read_text())["passes"] == 3


def test_without_fallback_the_error_is_raised_and_still_no_tmp_file(tmp_path, monkeypatch):
    store = S.NodeState(str(tmp_path))
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))
    with pytest.raises(OSError):
        with store.locked() as st:
            st["passes"] = 1
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_lock_held_by_a_stuck_hook_falls_back_after_the_timeout(tmp_path):
    holder = S.NodeState(str(tmp_path))
    store = S.NodeState(str(tmp_path), lock_timeout=0.2, fallback=True)
    entered = threading.Event()
    release = threading.Event()

    def hold():
        with holder.locked():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert entered.wait(5)
        with store.locked() as st:
            st["passes"] = 5
        assert "held" in store.trouble and store.read()["passes"] == 5
    finally:
        release.set()
        t.join()


@pytest.mark.parametrize("state_dir", ["{file}/sub", "/tmp/nul\0dir"])
def test_unusable_state_dir_path_is_trouble_not_a_crash(tmp_path, state_dir):
    f = tmp_path / "file"
    f.write_text("x")
    store = S.NodeState(state_dir.format(file=f), fallback=True)
    with store.locked() as st:
        st["passes"] = 1
    assert store.trouble and store.read()["passes"] == 1


# ---- entry points: exit codes, one line, no traceback ----------------------------------------------

def _hook(module, tmp_path, conf_text, extra_env=None):
    conf = tmp_path / "autoheal.toml"
    conf.write_text(conf_text)
    env = dict(os.environ, AUTOHEAL_CONFIG=str(conf), SLURMD_NODENAME="n1", SLURM_JOB_ID="42",
               **(extra_env or {}))
    env.pop("LD_LIBRARY_PATH", None)
    return subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)


BROKEN_CONFIGS = {
    "nested": "a = " + "[" * 5000 + "]" * 5000 + "\n",  # RecursionError in the TOML parser
    "syntax": "[hooks\nstate_dir = 1\n",
    "type": "[hooks]\nresume_after_passes = \"two\"\n",
}


@pytest.mark.parametrize("name", sorted(BROKEN_CONFIGS))
@pytest.mark.parametrize("module,code", [("autoheal.hooks.prolog", 0), ("autoheal.hooks.epilog", 0),
                                         ("autoheal.hooks.healthcheck", 2)])
def test_a_config_that_breaks_the_loader_never_fails_slurm(tmp_path, name, module, code):
    res = _hook(module, tmp_path, BROKEN_CONFIGS[name])
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "error: config" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_loader_crashes_are_caught_at_the_entry_points(monkeypatch, capsys):
    from autoheal.hooks import context, healthcheck, xid_watch

    for exc in (RecursionError("maximum recursion depth exceeded"), TypeError("'int' object is not subscriptable"),
                ValueError("embedded null byte")):
        monkeypatch.setattr(context.Context, "load",
                            classmethod(lambda cls, *a, exc=exc, **k: (_ for _ in ()).throw(exc)))
        monkeypatch.setattr(context, "_salvage_journal_path", lambda: "/nonexistent-dir/\0/journal")
        assert jobhook.run("prolog") == 0
        assert jobhook.run("epilog") == 0
        assert healthcheck.run() == 2
        assert xid_watch.main("n1") == 2
        err = capsys.readouterr().err
        assert type(exc).__name__ in err and "Traceback" not in err


def _ctx(tmp_path, state_dir, journal):
    cfg = Config()
    cfg.hooks = HooksSection(state_dir=str(state_dir), kernel_log="", expected_gpus=0, dcgm_mapping_dir="")
    cfg.journal.path = str(journal)
    from autoheal.hooks.context import Context

    return Context(cfg, "n1", "prolog")


def test_prolog_with_an_unwritable_state_dir_exits_0_and_journals_it(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    journal = tmp_path / "journal.jsonl"
    from autoheal.hooks import context

    monkeypatch.setattr(context.Context, "load", classmethod(
        lambda cls, source, *a, **k: _ctx(tmp_path, blocker / "state", journal)))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert jobhook.run("prolog") == 0  # NVML is not there either: unknown, never a failure
    recs = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [r["action"] for r in recs if r["event"] == "error"] == ["hook-trouble"], recs
    assert "node state" in recs[-1]["message"]


def test_prolog_still_fails_on_a_gpu_fault_with_a_broken_state_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    journal = tmp_path / "journal.jsonl"
    from autoheal.hooks import context

    ctx = _ctx(tmp_path, blocker / "state", journal)
    ctx.slurm = FakeCtld()
    monkeypatch.setattr(context.Context, "load", classmethod(lambda cls, source, *a, **k: ctx))
    lost = C.CheckResult("gpu-lost", C.FAIL, parse_body("gpu-lost: GPU 1 of n1: GPU is lost"), C.REBOOT, 1)
    monkeypatch.setattr(engine, "observe", lambda *a, **k: engine.Pass(node="n1", results=[lost]))
    assert jobhook.run("prolog") == 1  # a GPU fault found: the one reason to fail a job
    assert ctx.slurm.get_node("n1").reason == "autoheal: gpu-lost: GPU 1 of n1: GPU is lost"


def test_healthcheck_exit_2_when_healthy_but_the_state_cannot_be_saved(tmp_path):
    ctx = _ctx(tmp_path, tmp_path / "x" / "state", tmp_path / "journal.jsonl")
    (tmp_path / "x").write_text("")  # state dir under a regular file
    ctx.slurm = FakeCtld()
    ctx.source = "healthcheck"
    p = engine.health_pass(ctx, budget=0.5)
    assert p.exit_code == 2 and ctx.store.trouble, p.to_dict()


# ---- notifications never hold healing up -----------------------------------------------------------

class _HangingHook:
    def __init__(self):
        self.release = threading.Event()
        self.got = threading.Event()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.got.set()
                hook.release.wait(30)
                try:
                    self.send_response(200)
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()


def test_record_returns_while_the_webhook_still_hangs(tmp_path):
    hook = _HangingHook()
    try:
        ctx = _ctx(tmp_path, tmp_path / "state", tmp_path / "journal.jsonl")
        ctx.cfg.notify.webhooks = [hook.url]
        ctx.cfg.notify.timeout = 30.0
        done = threading.Event()
        t = threading.Thread(target=lambda: (ctx.record("drain", message="xid 79", severity="action"), done.set()))
        t.start()
        assert hook.got.wait(10)  # the webhook has the request and does not answer (for 30 s) ...
        assert done.wait(10), "record() waited for the webhook"  # ... and record() returned all the same
        hook.release.set()
        ctx.close(10)
        t.join(10)
    finally:
        hook.close()


def test_xid_watch_drains_before_it_journals(tmp_path):
    from autoheal.hooks.xid_watch import XidWatch

    slurm = FakeCtld()
    h = HooksSection(kernel_log="", textfile_dir="", dcgm_mapping_dir="")
    ctx = hook_context(h, source="xid-watch", state_dir=str(tmp_path), slurm=slurm)
    recorded_before_drain = []
    drain = slurm.drain
    slurm.drain = lambda n, r: (recorded_before_drain.extend(ev for ev, _ in ctx.records), drain(n, r))
    XidWatch(ctx).handle([XidEvent(xid=79, gpu=1, source="nvml")], now=100.0)
    assert slurm.node.drain and "detection" not in recorded_before_drain, recorded_before_drain
    assert "detection" in [ev for ev, _ in ctx.records], ctx.records


# ---- a repair ends the dedupe window; repeats are journalled, rate-limited -------------------------

def _xctx(tmp_path):
    return hook_context(HooksSection(), node="gpu2", state_dir=str(tmp_path))


def test_a_fault_back_after_a_reset_is_new_and_the_storm_is_journalled(tmp_path):
    ctx = _xctx(tmp_path)
    st = S.empty()
    ev = XidEvent(xid=48, gpu=3, source="nvml")
    first = engine.xid_results(ctx, st, [ev], {}, 1000.0)
    assert [r.status for r in first] == [C.FAIL]
    assert first[0].text == "xid 48 on GPU 3 of gpu2: double-bit ECC error"
    notes = []
    twin = XidEvent(xid=48, gpu=3, source="kmsg")
    assert engine.xid_results(ctx, st, [twin], {}, 1015.0, notes) == [] and notes == []  # the other source: silent
    S.mark_repaired(st, 3, 1010.0)  # the reset rung
    again = engine.xid_results(ctx, st, [ev], {}, 1011.0, notes)
    assert [r.status for r in again] == [C.FAIL] and again[0].evidence["after_repair"] == 1010.0
    # 19 more within the dedupe window: one fault, but the storm is journalled once a minute
    for i in range(19):
        assert engine.xid_results(ctx, st, [ev], {}, 1020.0 + 2 * i, notes) == []
    assert len(notes) == 1 and "seen again" in notes[0]["message"] and notes[0]["outcome"] == "repeat"
    assert engine.xid_results(ctx, st, [ev], {}, 1085.0, notes) == [] and len(notes) == 2
    # another GPU's repair does not end this window
    S.mark_repaired(st, 5, 1090.0)
    assert engine.xid_results(ctx, st, [ev], {}, 1091.0) == []


def test_the_other_sources_copy_of_an_xid_judged_just_before_a_repair_is_not_a_new_fault(tmp_path):
    """Soak seed 3: NVML's XID 48 at .800, the healthcheck reset that GPU (for an earlier fault) at .953, the
    kernel log's copy of the same XID at .972 was judged "back after a repair" and the ladder climbed."""
    ctx = _xctx(tmp_path)
    st = S.empty()
    assert [r.status for r in engine.xid_results(ctx, st, [XidEvent(xid=48, gpu=2, source="nvml")], {}, 1000.8)] \
        == [C.FAIL]
    S.mark_repaired(st, 2, 1000.953)
    assert engine.xid_results(ctx, st, [XidEvent(xid=48, gpu=2, source="file")], {}, 1000.972) == []
    # the same source again after the repair, or the other source long after it: the fault is back
    again = engine.xid_results(ctx, st, [XidEvent(xid=48, gpu=2, source="nvml")], {}, 1002.0)
    assert [r.status for r in again] == [C.FAIL] and again[0].evidence["after_repair"] == 1000.953
    st2 = S.empty()
    engine.xid_results(ctx, st2, [XidEvent(xid=48, gpu=2, source="nvml")], {}, 1000.0)
    S.mark_repaired(st2, 2, 1001.0)
    late = engine.xid_results(ctx, st2, [XidEvent(xid=48, gpu=2, source="file")], {}, 1000.0 + 60)
    assert [r.status for r in late] == [C.FAIL]


def test_node_repair_ends_every_gpus_window(tmp_path):
    st = S.empty()
    S.remember_xid(st, 79, 1, "0000:3b:00", 100.0)
    assert S.seen_recently(st, 79, 1, "", 110.0, 120.0)
    S.mark_repaired(st, None, 105.0)
    assert not S.seen_recently(st, 79, 1, "", 110.0, 120.0)


class _Slurm:
    def __init__(self, reason):
        self.node = Node("n1", "IDLE", frozenset({"DRAIN"}), reason)

    def get_node(self, name):
        return self.node


def test_skipped_foreign_drain_is_journalled_once_per_fault(tmp_path):
    ctx = _xctx(tmp_path)
    ctx.node, ctx.slurm = "n1", _Slurm("admin: bios update")
    fault = C.CheckResult("ecc", C.FAIL, parse_body("ecc: GPU 2 of n1: 1 uncorrectable ECC errors"), C.RESET, 2)
    for _ in range(5):  # five health checks while the admin's drain lasts
        engine.drain_for(ctx, fault)
    assert len([r for r in ctx.records if r[0] == "detection"]) == 1
    other = C.CheckResult("ecc", C.FAIL, parse_body("ecc: GPU 5 of n1: 1 uncorrectable ECC errors"), C.RESET, 5)
    engine.drain_for(ctx, other)
    assert len([r for r in ctx.records if r[0] == "detection"]) == 2


# ---- config validation ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,words", [
    ('xid_policy = {"079" = "warn"}', "is not an XID number"),
    ('xid_policy = {"²" = "warn"}', "is not an XID number"),
    ('xid_policy = {" 79" = "warn"}', "is not an XID number"),
    ('grace_signal = "FOO"', "hooks.grace_signal: 'FOO' is not a signal"),
    ('runner_signal = "USR2; rm -rf /"', "hooks.runner_signal"),
    ('grace_signal = "KILL"', "hooks.grace_signal"),
])
def test_config_rejects_values_that_can_never_work(text, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        parse_config("[hooks]\n" + text + "\n")


@pytest.mark.parametrize("sig", ["USR2", "SIGUSR2", "usr1", "TERM", "SIGTERM", "INT"])
def test_config_accepts_real_signal_names(sig):
    assert parse_config(f'[hooks]\ngrace_signal = "{sig}"\nrunner_signal = "{sig}"\n').hooks.grace_signal == sig
    assert parse_config('[hooks]\nxid_policy = {"13" = "warn", "109" = "reset"}\n').hooks.xid_policy["109"] == "reset"


def test_xid_watch_puts_a_failed_batch_back_instead_of_dropping_it(tmp_path, monkeypatch):
    from autoheal.hooks.xid_watch import XidWatch

    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir="", dcgm_mapping_dir="")
    ctx = hook_context(h, source="xid-watch", slurm=FakeCtld())
    watch = XidWatch(ctx)
    calls = []
    real = watch.handle

    def flaky(batch, now=None):
        calls.append(len(batch))
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        out = real(batch, now)
        watch.stop()
        return out

    monkeypatch.setattr(watch, "handle", flaky)
    monkeypatch.setattr(watch._stop, "wait", lambda *_: False)  # no pause after the error in a test
    watch.q.put(XidEvent(xid=79, gpu=1, source="nvml"))
    watch.run(nvml=False, kernel_log=False)
    assert calls == [1, 1]  # handled on the second try
    assert ctx.slurm.node.drain
    assert S.seen_recently(ctx.store.read(), 79, 1, "", __import__("time").time(), 120.0)


def test_xid_back_right_after_a_reboot_is_acted_on_by_xid_watch(tmp_path):
    """Issue 17 item 3: after the lab's 2.5 s reboot (Slurm resumed the node: nextstate=resume) the
    returning XID 48 was taken for the one before the reboot and ignored."""
    from autoheal.hooks.xid_watch import XidWatch

    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir="", dcgm_mapping_dir="")
    ctx = hook_context(h, source="xid-watch", slurm=FakeCtld())
    recs = ctx.records
    watch = XidWatch(ctx)
    ev = XidEvent(xid=48, gpu=1, source="nvml")
    assert [r.status for r in watch.handle([ev], now=100.0)] == [C.FAIL]
    assert ctx.slurm.node.drain
    with ctx.store.locked() as st:  # the healthcheck asked for the reboot rung
        st["reboot_requested"] = {"boot_id": "same-boot-in-the-lab", "time": 110.0}
    ctx.slurm.resume("n1")  # rebooted; Slurm put it back into service
    again = watch.handle([ev], now=130.0)  # well inside the 120 s dedupe window of the first
    assert [r.status for r in again] == [C.FAIL] and again[0].evidence.get("after_repair")
    assert ctx.slurm.node.drain and ctx.slurm.node.reason.startswith("autoheal: xid 48 on GPU 1 of n1")
    assert [kw["message"] for ev_, kw in recs if ev_ == "detection"][-1].endswith("(back after a repair)")


def test_writing_back_after_a_lock_timeout_keeps_what_others_wrote_meanwhile(tmp_path):
    other = S.NodeState(str(tmp_path))
    watch = S.NodeState(str(tmp_path), lock_timeout=0.1, fallback=True)
    with other.locked() as st:
        st["passes"] = 1
    entered, release = threading.Event(), threading.Event()

    def stuck():
        with other.locked() as st:
            entered.set()
            release.wait(10)
            st["ladder"] = {"gpu2": {"reset": [5.0]}}  # the stuck hook's own change, written at the end

    t = threading.Thread(target=stuck)
    t.start()
    try:
        assert entered.wait(5)
        with watch.locked() as st:  # times out: goes on in memory
            S.remember_xid(st, 79, 1, "", 10.0)
        assert watch.trouble and watch.read()["recent_xids"]
    finally:
        release.set()
        t.join()
    with watch.locked() as st:
        st["counters"] = {"x": 1}
    disk = json.loads((tmp_path / "state.json").read_text())
    assert disk["ladder"] == {"gpu2": {"reset": [5.0]}}  # the other hook's write survived
    assert [r["xid"] for r in disk["recent_xids"]] == [79] and disk["counters"] == {"x": 1}  # and ours
    assert disk["passes"] == 1 and watch.trouble == ""


@pytest.mark.parametrize("backend,cls", [("cli", "CliSlurm"), ("rest", "RestSlurm")])
def test_hooks_build_the_backend_the_config_chooses_with_their_own_timeout(tmp_path, backend, cls):
    from autoheal.hooks.context import Context

    cfg = parse_config(f'[slurm]\nbackend = "{backend}"\ntimeout = 30\nretries = 4\nrest_url = "http://127.0.0.1:1"\n'
                       f'[hooks]\nstate_dir = "{tmp_path}"\nslurm_timeout = 3\n')
    slurm = Context(cfg, "gpu1", "healthcheck").slurm
    assert type(slurm).__name__ == cls
    assert (slurm.timeout, slurm.retries) == (3, 1)
