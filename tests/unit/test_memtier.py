"""The peer-memory checkpoint tier: frames, verification, selection, the node store, agents over real TCP
between two loopback addresses, and root's cleanup against hostile folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Optional

import pytest

from autoheal import memtier_files
from autoheal.sbatch_helpers import memtier, memtier_launch
from autoheal.sbatch_helpers import memtier_wire as wire
from autoheal.sbatch_helpers.memtier_agent import Agent, _handler, _Server
from autoheal.sbatch_helpers.memtier_store import CopyStore, StoreError, copy_name

#: one epilog's memory-tier step in a fresh interpreter (a module mypy checks, not a -c string)
PROBE = Path(__file__).resolve().parent.parent / "epilog_memtier_probe.py"

KEY = wire.job_key("tok-a", "42")


def _copy(step: int, rank: int = 0, payload: bytes = b"state", job: str = "42", key: bytes = KEY) -> bytes:
    return wire.encode(wire.Kind.STORE, wire.copy_header(job, rank, 2, step, len(payload), 1.0), payload, key)


def _read(data: bytes, key: bytes = KEY, limit: int = wire.DEFAULT_MAX_PAYLOAD) -> wire.Frame:
    return wire.read_frame(wire.reader_of(data), key, limit)


# ---- frames -------------------------------------------------------------------------------------------

def test_frame_round_trip_and_copy_info():
    frame = _read(_copy(7, rank=1, payload=b"x" * 1000))
    assert frame.kind == wire.Kind.STORE and frame.payload == b"x" * 1000
    info = wire.copy_info(frame, "42", 1)
    assert (info.step, info.rank, info.size) == (7, 1, 1000)
    assert wire.with_kind(_copy(7), wire.Kind.COPY)[5] == wire.Kind.COPY
    assert _read(wire.with_kind(_copy(7), wire.Kind.COPY)).kind == wire.Kind.COPY  # kind is not under the MAC


@pytest.mark.parametrize("cut", [1, 17, 18, 40, -1])
def test_torn_copy_is_rejected(cut):
    data = _copy(3, payload=b"y" * 100)
    with pytest.raises(wire.FrameError, match="truncated"):
        _read(data[:cut])


def test_flipped_payload_bit_fails_the_checksum():
    data = bytearray(_copy(3, payload=b"z" * 100))
    data[-40] ^= 1  # inside the payload
    with pytest.raises(wire.FrameError, match="checksum"):
        _read(bytes(data))


def test_another_jobs_copy_is_named_as_such():
    other = wire.job_key("tok-b", "42")  # the same job id, another submission
    with pytest.raises(wire.FrameError, match="another job"):
        _read(_copy(3, key=other))


def test_bad_magic_and_oversized_frames():
    with pytest.raises(wire.FrameError, match="magic"):
        _read(b"XXXX" + _copy(1)[4:])
    with pytest.raises(wire.FrameError, match="too large"):
        _read(_copy(1, payload=b"a" * 100), limit=10)


def test_copy_info_checks_job_rank_and_size():
    with pytest.raises(wire.FrameError, match="not of this job"):
        wire.copy_info(_read(_copy(1)), "43")
    with pytest.raises(wire.FrameError, match="rank 0, not of rank 1"):
        wire.copy_info(_read(_copy(1)), "42", 1)
    lying = wire.encode(wire.Kind.STORE, dict(wire.copy_header("42", 0, 1, 1, 99, 0.0)), b"abc", KEY)
    with pytest.raises(wire.FrameError, match="size"):
        wire.copy_info(_read(lying), "42")


def test_choose_newest_then_cheapest_source():
    assert wire.choose([]) is None
    assert wire.choose([("durable", 10), ("peer-memory", 12)]) == ("peer-memory", 12)
    assert wire.choose([("durable", 12), ("peer-memory", 12), ("own-memory", 12)]) == ("own-memory", 12)
    assert wire.choose([("durable", 20), ("own-memory", 12)]) == ("durable", 20)
    assert wire.surplus([5, 1, 3, 4], 2) == [1, 3]
    assert wire.surplus([5], 2) == []


def test_peer_ring_and_ask_order():
    assert memtier.peer_of("n1", ["n2", "n1", "n3"]) == "n2"
    assert memtier.peer_of("n3", ["n1", "n2", "n3"]) == "n1"
    assert memtier.peer_of("n1", ["n1"]) is None
    agents = dict.fromkeys(("n1", "n2", "n3"), ("127.0.0.1", 1))
    assert memtier.ask_order("n3", ["n1", "n3"], agents) == [
        ("own-memory", "n3"), ("peer-memory", "n1"), ("other-memory", "n2")]
    assert memtier.parse_agents("n1=127.0.0.11:4000, bad=x, n2=127.0.0.12:4001") == {
        "n1": ("127.0.0.11", 4000), "n2": ("127.0.0.12", 4001)}


def test_resume_source_prefers_newer_durable():
    info = wire.CopyInfo("42", 0, 30, 1, 0.0, 1)
    copy = memtier.MemoryCopy("peer-memory", "n2", info, b"x", {})
    assert memtier.resume_source(copy, 20) == ("peer-memory", 30)
    assert memtier.resume_source(copy, 40) == ("durable", 40)
    assert memtier.resume_source(None, None) is None


def test_parse_ready_lines():
    lines = ["autoheal-memtier-agent: ready node=n1 addr=127.0.0.11 port=4000",
             "autoheal-memtier-agent: unavailable node=n2 why=x", "noise"]
    assert memtier_launch.parse_ready(lines) == {"n1": "127.0.0.11:4000"}
    argv = memtier_launch.agent_argv("/usr/bin/srun", ["n1", "n2"])
    assert "--overlap" in argv and "--nodelist=n1,n2" in argv and argv[-1].endswith("memtier_agent")


# ---- the node store -----------------------------------------------------------------------------------

def _env(tmp_path):
    return {memtier_files.BASE_ENV: str(tmp_path / "{node}")}


def _store(tmp_path, node="n1", keep=2):
    env = _env(tmp_path)
    memtier_files.base_dir(node, env).mkdir(parents=True, exist_ok=True)
    return CopyStore(memtier_files.job_dir(node, os.geteuid(), "42", env), keep=keep)


def test_store_keeps_the_newest_copies_per_rank(tmp_path):
    store = _store(tmp_path, keep=2)
    for step in (1, 2, 3):
        store.put(0, step, _copy(step))
    store.put(1, 3, _copy(3, rank=1))
    assert store.steps() == {0: [2, 3], 1: [3]}
    frame, _ = store.newest(0, KEY, "42", 1 << 20)
    assert wire.copy_info(frame, "42").step == 3
    assert oct(os.stat(store.directory).st_mode & 0o777) == "0o700"


def test_store_skips_and_removes_a_torn_newest_copy(tmp_path):
    store = _store(tmp_path)
    store.put(0, 1, _copy(1))
    (store.directory / copy_name(0, 2)).write_bytes(_copy(2)[:-5])  # torn: a writer outside the protocol
    frame, _ = store.newest(0, KEY, "42", 1 << 20)
    assert wire.copy_info(frame, "42").step == 1
    assert store.steps() == {0: [1]}


def test_store_refuses_a_symlinked_or_shared_folder(tmp_path):
    env = _env(tmp_path)
    base = memtier_files.base_dir("n1", env)
    base.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (base / f"autoheal-memtier-{os.geteuid()}").symlink_to(elsewhere)
    with pytest.raises(StoreError, match="symlink"):
        CopyStore(memtier_files.job_dir("n1", os.geteuid(), "42", env))
    (base / f"autoheal-memtier-{os.geteuid()}").unlink()
    (base / f"autoheal-memtier-{os.geteuid()}").mkdir(mode=0o777)
    os.chmod(base / f"autoheal-memtier-{os.geteuid()}", 0o777)
    with pytest.raises(StoreError, match="private"):
        CopyStore(memtier_files.job_dir("n1", os.geteuid(), "42", env))


# ---- agents over TCP ----------------------------------------------------------------------------------

class _RunningAgent:
    def __init__(self, tmp_path, node, addr):
        self.store = _store(tmp_path, node)
        self.server = _Server((addr, 0), _handler(Agent(self.store, KEY, "42", 1 << 24)))
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.address = f"{addr}:{self.server.server_address[1]}"

    def kill(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def two_nodes(tmp_path):
    agents = {"n1": _RunningAgent(tmp_path, "n1", "127.0.0.21"), "n2": _RunningAgent(tmp_path, "n2", "127.0.0.22")}
    yield agents
    for a in agents.values():
        a.kill()


def _tier(agents, node, rank):
    env = {"SLURM_JOB_ID": "42", "AUTOHEAL_SUBMIT_TOKEN": "tok-a", "SLURMD_NODENAME": node, "SLURM_PROCID": str(rank),
           "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
           memtier.AGENTS_ENV: ",".join(f"{n}={a.address}" for n, a in agents.items())}
    tier = memtier.MemoryTier.from_env(env)
    assert tier is not None
    return tier


def test_save_reaches_own_node_and_peer_and_a_dead_node_is_served_by_its_peer(two_nodes, tmp_path):
    t1 = _tier(two_nodes, "n1", 0)
    for step in (5, 10):
        result = t1.save(step, f"s{step}".encode())
        assert result.replicated and result.stored == ("n1", "n2"), result
    assert two_nodes["n2"].store.steps() == {0: [5, 10]}
    # node n1 dies: its agent and its memory go
    two_nodes["n1"].kill()
    memtier_files.remove_job("n1", os.geteuid(), "42", _env(tmp_path))
    t_restart = _tier(two_nodes, "n2", 0)  # rank 0 restarted on n2 (e.g. a hot spare took n1's place)
    copy = t_restart.newest()
    assert copy is not None and (copy.step, copy.source, copy.node, copy.payload) == (10, "own-memory", "n2", b"s10")
    assert t_restart.newest(min_step=10) is None


def test_restart_on_a_fresh_node_fetches_from_the_peer(two_nodes):
    _tier(two_nodes, "n1", 1).save(7, b"rank1")
    two_nodes["n2"].kill()  # the node the rank ran on is gone; it restarts on n1, n2's peer
    copy = _tier({"n1": two_nodes["n1"]}, "n1", 1).newest()
    assert copy is not None and copy.step == 7 and copy.payload == b"rank1"


def test_agent_refuses_forged_and_foreign_frames(two_nodes):
    from autoheal.sbatch_helpers.memtier_net import parse_address, request

    addr = parse_address(two_nodes["n1"].address)
    forged = _copy(99, key=wire.job_key("guessed", "42"))
    answer = request(addr, forged, KEY, 5, 0)
    assert answer.kind == wire.Kind.ACK and not answer.header["ok"] and "another job" in answer.header["why"]
    wrong_job = wire.encode(wire.Kind.STORE, wire.copy_header("43", 0, 1, 99, 1, 0.0), b"x", KEY)
    assert not request(addr, wrong_job, KEY, 5, 0).header["ok"]
    assert two_nodes["n1"].store.steps() == {}
    # a GET made with another key gets nothing back
    get = wire.encode(wire.Kind.GET, {"rank": 0}, b"", wire.job_key("other", "42"))
    with pytest.raises(wire.FrameError):
        request(addr, get, wire.job_key("other", "42"), 5, 1 << 20)


def test_no_tier_without_agents_or_token(two_nodes):
    assert memtier.MemoryTier.from_env({"SLURM_JOB_ID": "42"}) is None
    agents = ",".join(f"{n}={a.address}" for n, a in two_nodes.items())
    assert memtier.MemoryTier.from_env({"SLURM_JOB_ID": "42", memtier.AGENTS_ENV: agents}) is None
    assert not memtier_launch.wanted({}) and memtier_launch.wanted({"AUTOHEAL_MEMORY_TIER": "1"})


# ---- root's cleanup -----------------------------------------------------------------------------------

def test_cleanup_never_follows_symlinks(tmp_path):
    env = _env(tmp_path)
    store = _store(tmp_path)
    store.put(0, 1, _copy(1))
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("root must not delete this")
    (store.directory / "link").symlink_to(victim)
    (store.directory / "sub").mkdir()
    (store.directory / "sub" / "link2").symlink_to(victim / "keep.txt")
    assert memtier_files.remove_job("n1", os.geteuid(), "42", env)
    assert not store.directory.exists() and (victim / "keep.txt").exists()
    # the job folder itself replaced by a symlink: the link goes, the target stays
    (store.directory.parent / "42").symlink_to(victim)
    assert memtier_files.remove_job("n1", os.geteuid(), "42", env)
    assert (victim / "keep.txt").exists()


def test_stop_agent_kills_only_the_jobs_process(tmp_path):
    env = _env(tmp_path)
    store = _store(tmp_path)
    # each child says it runs before the test goes on: until its exec, /proc/<pid>/environ is still
    # pytest's (no SLURM_JOB_ID), and stop_agent rightly refuses it (a flake on a loaded machine)
    sleeper = "import time; print('up', flush=True); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", sleeper], env={"SLURM_JOB_ID": "7"}, stdout=subprocess.PIPE)
    ours = subprocess.Popen([sys.executable, "-c", sleeper], env={"SLURM_JOB_ID": "42"}, stdout=subprocess.PIPE)
    try:
        for p in (other, ours):
            assert p.stdout is not None and p.stdout.readline() == b"up\n"
        (store.directory / memtier_files.PIDFILE).write_text(f"{other.pid} 0\n")  # a hostile pidfile
        assert memtier_files.stop_agent("n1", os.geteuid(), "42", env) is None
        assert other.poll() is None
        (store.directory / memtier_files.PIDFILE).write_text(f"{ours.pid} 0\n")
        assert memtier_files.stop_agent("n1", os.geteuid(), "42", env) == ours.pid
        assert ours.wait(10) == -signal.SIGKILL
    finally:
        for p in (other, ours):
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


ATTACKER, VICTIM = 65534, 65533  # nobody, and a second unprivileged uid (no passwd entry needed)


@pytest.mark.skipif(os.geteuid() != 0, reason="other users' folders and processes need root")
def test_a_folder_another_user_named_for_a_victim_is_never_believed(tmp_path):
    """/dev/shm is world-writable: the attacker makes autoheal-memtier-<victim>/<job>/agent.pid naming a
    process of the victim's that carries SLURM_JOB_ID=<job> (a job Slurm has forgotten). Before the fix
    the next epilog of any job on the node swept it as the victim's leftover and SIGKILLed that process
    on the attacker's word (found as nobody against the real code, 2026-12-07)."""
    env = _env(tmp_path)
    base = memtier_files.base_dir("n1", env)
    base.mkdir(parents=True)
    base.chmod(0o1777)
    victim = subprocess.Popen(["/bin/sh", "-c", "echo up; exec sleep 60"], user=VICTIM, group=VICTIM,
                              extra_groups=[], env={"SLURM_JOB_ID": "777", "PATH": "/usr/bin:/bin"}, cwd="/",
                              stdout=subprocess.PIPE)
    try:
        assert victim.stdout is not None and victim.stdout.readline() == b"up\n"  # its environ is the job's now
        folder = memtier_files.job_dir("n1", VICTIM, "777", env)
        folder.mkdir(parents=True)
        (folder / memtier_files.PIDFILE).write_text(f"{victim.pid} 0\n")
        for path in (folder.parent, folder, folder / memtier_files.PIDFILE):
            os.chown(path, ATTACKER, ATTACKER)
        gone: Dict[str, Optional[memtier_files.JobFacts]] = {"777": ("GONE", 0), "1": ("COMPLETING", 0)}
        assert memtier_files.user_ids("n1", env) == []
        assert memtier_files.epilog_cleanup("n1", 0, "1", gone.get, env) == []
        assert memtier_files.epilog_cleanup("n1", VICTIM, "777", gone.get, env) == []  # the victim's own epilog
        assert memtier_files.agent_record("n1", VICTIM, "777", env) is None
        assert victim.poll() is None and (folder / memtier_files.PIDFILE).exists()
        # the same folder the victim's own: their word about their own process is taken, as before
        for path in (folder.parent, folder, folder / memtier_files.PIDFILE):
            os.chown(path, VICTIM, VICTIM)
        assert memtier_files.user_ids("n1", env) == [VICTIM]
        done = memtier_files.epilog_cleanup("n1", 0, "1", gone.get, env)
        assert done == ["freed memory-tier copies of job 777 (GONE)"] and not folder.exists()
        assert victim.wait(10) == -signal.SIGKILL
    finally:
        victim.kill()
        victim.wait()
        if victim.stdout is not None:
            victim.stdout.close()


def test_keep_for_restart_decision():
    keep = memtier_files.keep_for_restart
    assert keep(None, 0)  # Slurm not answering: kept, freed at a later epilog
    assert keep(("PENDING", 1), 0)
    assert keep(("COMPLETING", 1), 0)  # requeued: Slurm says COMPLETING until the epilogs end
    assert not keep(("COMPLETING", 0), 0)  # the same run ending: over
    assert not keep(("CANCELLED", 3), 3) and not keep(("GONE", 0), None)
    assert not keep(("RUNNING", 0), 0)  # a node leaving a hot-spare job: the job's agents are elsewhere
    assert not keep(("COMPLETING", 5), None)  # no agent record: the state alone decides


def test_epilog_keeps_a_requeued_jobs_copies_and_frees_finished_ones(tmp_path):
    env = _env(tmp_path)
    store = _store(tmp_path)
    store.put(0, 1, _copy(1))
    store.write_pidfile(0)
    old = memtier_files.job_dir("n1", os.geteuid(), "7", env)
    old.mkdir()
    running = memtier_files.job_dir("n1", os.geteuid(), "8", env)
    running.mkdir()
    facts: Dict[str, Optional[memtier_files.JobFacts]] = {"42": ("COMPLETING", 1), "7": ("GONE", 0),
                                                           "8": ("RUNNING", 0)}
    done = memtier_files.epilog_cleanup("n1", os.geteuid(), "42", facts.get, env)
    assert memtier_files.job_dirs("n1", os.geteuid(), env) == ["42", "8"], done
    facts["42"] = ("COMPLETING", 0)
    memtier_files.epilog_cleanup("n1", os.geteuid(), "42", facts.get, env)
    assert memtier_files.job_dirs("n1", os.geteuid(), env) == ["8"]
    facts["8"] = None  # Slurm not answering: another job's copies are never freed on a guess
    memtier_files.epilog_cleanup("n1", os.geteuid(), "42", facts.get, env)
    assert memtier_files.job_dirs("n1", os.geteuid(), env) == ["8"]


def test_sweep_frees_jobs_that_are_over_and_keeps_the_rest(tmp_path):
    """A job requeued onto other nodes leaves its copies on its old ones and no epilog of it comes there
    again (the bench read a node holding a cancelled job's 4 copies beside the running job's 4): the
    sweep frees every job that is over, never the caller's own, one that may run again, or one Slurm
    does not answer about."""
    env = _env(tmp_path)
    memtier_files.base_dir("n1", env).mkdir(parents=True)
    jobs = {"26": ("CANCELLED", 1), "27": ("GONE", 0), "28": ("PENDING", 1), "29": ("RUNNING", 0), "30": None,
            "31": ("COMPLETED", 0)}
    for job in jobs:
        d = memtier_files.job_dir("n1", os.geteuid(), job, env)
        d.mkdir(parents=True)
        (d / "r00000-s00000050.copy").write_bytes(b"x" * 64)
    done = memtier_files.sweep_over("n1", jobs.get, "31", env)
    assert memtier_files.job_dirs("n1", os.geteuid(), env) == ["28", "29", "30", "31"]
    assert sorted(done) == ["freed memory-tier copies of job 26 (CANCELLED)",
                            "freed memory-tier copies of job 27 (GONE)"]
    assert memtier_files.sweep_over("n1", jobs.get, "", env) == ["freed memory-tier copies of job 31 (COMPLETED)"]


@pytest.mark.parametrize("kind", ["prolog", "healthcheck"])
def test_the_prolog_and_the_healthcheck_free_an_over_jobs_copies(tmp_path, monkeypatch, kind):
    """The hooks' side of the sweep, through the hooks' real context type and a Slurm adapter: the
    prolog of job 40 frees cancelled job 26's copies (before job 40 starts beside them) and keeps its own
    (a requeued run's); the healthcheck, on a node that runs nothing, frees them too."""
    from autoheal.hooks import jobhook
    from autoheal.slurm.model import Job
    from autoheal_lab.testing.hooks import hook_context
    from autoheal_lab.testing.slurm import MemorySlurm

    monkeypatch.setenv(memtier_files.BASE_ENV, str(tmp_path / "{node}"))
    for job in ("26", "40"):
        memtier_files.job_dir("n1", os.geteuid(), job).mkdir(parents=True)
    slurm = MemorySlurm(jobs=[Job("26", "CANCELLED", ("n1",)), Job("40", "CONFIGURING", ("n1",))])
    ctx = hook_context(node="n1", source=kind, state_dir=str(tmp_path / "state"), slurm=slurm)
    jobhook.sweep_memory_tier(ctx, kind, "40" if kind == "prolog" else "")
    assert memtier_files.job_dirs("n1", os.geteuid()) == ["40"]


def test_common_steps_are_what_every_rank_holds():
    assert wire.common_steps([{0: [10, 12], 1: [8, 10]}, {1: [12]}], 2) == [12, 10]
    assert wire.common_steps([{0: [10, 12]}], 2) == []  # rank 1's copies are out of reach
    assert wire.common_steps([{0: [4], 1: [6]}], 2) == []


def test_consistent_restart_takes_the_newest_step_all_ranks_hold(two_nodes):
    r0, r1 = _tier(two_nodes, "n1", 0), _tier(two_nodes, "n2", 1)
    for step in (10, 12):
        r0.save(step, f"r0-{step}".encode())
    r1.save(10, b"r1-10")  # rank 1's node died before it kept step 12
    assert r0.newest().step == 12  # alone, rank 0 would start 2 steps ahead of rank 1
    both = [t.newest(consistent=True) for t in (r0, r1)]
    assert [(c.step, c.payload) for c in both] == [(10, b"r0-10"), (10, b"r1-10")]
    assert r0.newest(min_step=10, consistent=True) is None


def test_jobs_without_the_tier_import_none_of_it():
    code = ("import sys; from autoheal.sbatch_helpers import checkpoint, runner; import autoheal.hooks.jobhook; "
            "print(sorted(m for m in sys.modules if 'memtier' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_node_address_comes_from_slurms_nodeaddr():
    from autoheal.slurm.parse import node_from_json, node_from_oneliner

    assert node_from_json({"name": "n1", "state": ["IDLE"], "address": "127.0.0.11"}).address == "127.0.0.11"
    line = "NodeName=gpu2 Arch=x86_64 CPUTot=2 NodeAddr=127.0.0.11 NodeHostName=localhost State=IDLE Partitions=gpu"
    assert node_from_oneliner(line).address == "127.0.0.11"


@pytest.mark.parametrize("with_folder", [False, True], ids=["no-memory-folder", "a-users-memory-folder"])
def test_the_epilog_imports_the_tiers_cleanup_only_when_a_memory_folder_exists(tmp_path, with_folder):
    """Issue 24 section 6: every epilog of every job looked for memory folders through the cleanup's
    module; a job that never used the tier (nearly all) now pays one listing of the memory folder."""
    if with_folder:
        (tmp_path / "n1" / f"autoheal-memtier-{os.getuid()}").mkdir(parents=True)
    env = dict(os.environ, **{memtier_files.BASE_ENV: str(tmp_path / "{node}")}, SLURM_JOB_UID=str(os.getuid()))
    # the epilog's own context type and a Slurm adapter's, in a fresh interpreter (its sys.modules)
    out = subprocess.run([sys.executable, str(PROBE), str(tmp_path / "state")], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(with_folder), "True"]


def test_the_epilog_removing_a_job_from_the_dcgm_mapping_imports_no_slurm_parser(tmp_path):
    """hooks.mapping imported Slurm's parsers (and with them the Slurm model: 6 ms) for every prolog and
    epilog; only a GPU list to parse needs them."""
    code = ("import sys\nfrom autoheal.hooks import mapping\n"
            f"mapping.remove_job({str(tmp_path / 'map')!r}, '7', {str(tmp_path / 'state')!r})\n"
            "print(sorted(m for m in sys.modules if m.startswith('autoheal.slurm')))\n"
            "print(mapping.parse_indices('0,2-3'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[0, 2, 3]"]
