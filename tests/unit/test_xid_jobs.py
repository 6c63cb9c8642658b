"""Application XIDs are the job's, never the fleet's (issue 22 section 3, issue 25 item 3): the NVRM line's
pid= names the process, its Slurm job is found from its cgroup (or a verified claim, or the GPU's job
mapping), and only that job is recorded, told and (XID 94) requeued; a hardware XID still drains."""

from __future__ import annotations

import itertools
import os

import pytest

from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import checks as C
from autoheal.hooks import xid_jobs as XJ
from autoheal.hooks import xid_watch as XW
from autoheal.hooks.xids import parse_line
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.hooks import hook_context
from autoheal_lab.testing.slurm import MemorySlurm

PCI = ["0000:1b:00", "0000:1c:00", "0000:1d:00", "0000:1e:00"]


def line(xid, gpu, pid=None, name="python", text="Graphics SM Warp Exception"):
    """A /dev/kmsg record as the kernel writes it (facility 0): only those count (issue 25, item 1)."""
    who = "pid='<unknown>', name=<unknown>" if pid is None else f"pid={pid}, name={name}"
    return f"3,{next(_SEQ)},1000,-;NVRM: Xid (PCI:{PCI[gpu]}): {xid}, {who}, {text}"


_SEQ = itertools.count(1)


def fake_proc(root, pid, job=None, env_job=None, v2=True):
    d = root / str(pid)
    d.mkdir(parents=True)
    if job is None:
        cg = "0::/user.slice/user-1000.slice/session-3.scope\n"
    elif v2:
        cg = f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
    else:
        cg = f"4:memory:/slurm/uid_1000/job_{job}/step_0/task_0\n1:cpu:/slurm/uid_1000/job_{job}/step_0\n"
    (d / "cgroup").write_text(cg)
    env = b"HOME=/home/u\x00" + (f"SLURM_JOB_ID={env_job}".encode() + b"\x00" if env_job else b"")
    (d / "environ").write_bytes(env)


def watch(tmp_path, slurm, node, proc, **hooks):
    h = HooksSection(**{"grace_seconds": 10.0, "dcgm_mapping_dir": "", **hooks})
    ctx = hook_context(h, node=node, source="xid-watch", state_dir=str(tmp_path / node / "state"), slurm=slurm)
    with ctx.store.locked() as st:
        st["gpu_pci"] = {p: i for i, p in enumerate(PCI)}
    w = XW.XidWatch(ctx)
    w.proc = str(proc)
    w.jobs.step = lambda *a, **k: False  # the job side is tested elsewhere; here: what is decided
    return w


def records(w, event):
    return [kw for ev, kw in w.ctx.records if ev == event]


def world(nodes=("n1", "n2", "n3"), jobs=()):
    return MemorySlurm([Node(n, "ALLOCATED", frozenset(), "") for n in nodes], jobs)


# ---- who raised it ------------------------------------------------------------------------------------

def test_process_of_reads_the_drivers_fields_only():
    assert XJ.process_of(parse_line(line(13, 0, pid=4567, name="python"))) == (4567, "python")
    assert XJ.process_of(parse_line(line(13, 0))) == (None, "")
    # a process name is the user's: a name holding ", pid=1" cannot change the pid the driver wrote
    assert XJ.process_of(parse_line(line(13, 0, pid=4567, name="x, pid=1"))) == (4567, "x")
    ev = parse_line(line(13, 0, pid=4567))
    assert XJ.process_of(type(ev)(xid=13, gpu=0, source="nvml")) == (None, "")


@pytest.mark.parametrize("v2", [True, False])
def test_job_of_cgroup_v1_and_v2(tmp_path, v2):
    fake_proc(tmp_path, 4567, job=77, v2=v2)
    fake_proc(tmp_path, 4568)
    assert XJ.job_of_cgroup(4567, str(tmp_path)) == "77"
    assert XJ.job_of_cgroup(4568, str(tmp_path)) is None
    assert XJ.job_of_cgroup(9999, str(tmp_path)) is None  # gone already (the XID killed it)


def test_a_users_claimed_job_id_is_checked_with_slurm(tmp_path):
    """Attack: a process of user u (no Slurm cgroup, proctrack/linuxproc) sets SLURM_JOB_ID=<victim's job>
    in its own environment and crashes its kernel: the victim must not be named (and for XID 94, requeued)."""
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    slurm = world(jobs=[Job("77", "RUNNING", ("n1",), user=me), Job("88", "RUNNING", ("n1",), user="victim")])
    ctx = hook_context(node="n1", slurm=slurm)
    fake_proc(tmp_path, 4567, env_job=88)
    assert XJ.resolve_job(ctx, 4567, None, str(tmp_path)) == ("", "no job owns the process the driver named")
    fake_proc(tmp_path, 4568, env_job=77)  # the truth, from a job of the process's own user on this node
    assert XJ.resolve_job(ctx, 4568, None, str(tmp_path))[0] == "77"
    fake_proc(tmp_path, 4569, env_job=77)
    assert XJ.resolve_job(hook_context(node="n2", slurm=slurm), 4569, None, str(tmp_path))[0] == ""
    # no process named: the GPU's mapping when it names exactly one job
    assert XJ.resolve_job(ctx, None, ["77"], str(tmp_path))[0] == "77"
    assert XJ.resolve_job(ctx, None, ["77", "88"], str(tmp_path))[0] == ""


# ---- acting on the job only -------------------------------------------------------------------------------

def test_five_out_of_bounds_kernels_per_gpu_never_drain_a_shared_node(tmp_path):
    """Issue 25 item 3: five XID 13/31/43 per GPU in an hour used to drain the node with a GPU reset and
    requeue every job on it (the neighbour's too)."""
    slurm = world(jobs=[Job("77", "RUNNING", ("n1",), user="u"), Job("88", "RUNNING", ("n1",), user="v")])
    fake_proc(tmp_path / "proc", 4567, job=77)
    w = watch(tmp_path, slurm, "n1", tmp_path / "proc")
    t = 1000.0
    for _ in range(5):
        for xid in (13, 31, 43):
            t += 130.0  # past the dedupe window each time: every one is judged
            res = w.handle([parse_line(line(xid, 0, pid=4567))], now=t)
            assert all(r.status != C.FAIL for r in res)
    st = w.ctx.store.read()
    assert not st.get("pending_drain") and not st.get("faults") and slurm.count("drain") == 0
    app = records(w, "app-xid")  # 43 is IGNORE in NVIDIA's catalog: nothing at all
    assert len(app) == 10 and all(r["job_ids"] == ["77"] for r in app)
    assert st[XJ.APP_JOBS]["77"]["xids"] == {"13": 5, "31": 5}
    # told on the first of each XID and again at hooks.app_xid_repeat (5): 4 writes for 10 XIDs; the
    # neighbour's job untouched
    assert len(slurm.writes("77")) == 4
    assert slurm.get_job("77").comment.startswith("autoheal: xid 31 on GPU 0 of n1")
    assert "5 times on n1" in slurm.get_job("77").comment
    assert "raised by job 77 (process 4567 python)" in slurm.get_job("77").comment
    assert slurm.get_job("88").comment == "" and not slurm.writes("88")


def test_user_comment_and_runner_state_are_never_overwritten(tmp_path):
    slurm = world(jobs=[Job("77", "RUNNING", ("n1",), comment="my experiment 12"),
                        Job("78", "RUNNING", ("n1",), comment="autoheal-runner state=running restarts=0")])
    fake_proc(tmp_path / "proc", 1, job=77)
    fake_proc(tmp_path / "proc", 2, job=78)
    w = watch(tmp_path, slurm, "n1", tmp_path / "proc")
    w.handle([parse_line(line(13, 0, pid=1)), parse_line(line(31, 1, pid=2))], now=1000.0)
    assert slurm.get_job("77").comment == "my experiment 12"
    assert slurm.get_job("78").comment.startswith("autoheal-runner state=running")
    assert sorted(r["job_ids"][0] for r in records(w, "app-xid")) == ["77", "78"]  # the journal has them


def test_job_storm_on_every_node_of_one_job_drains_nothing_and_hardware_still_drains(tmp_path):
    """One job's crash raising app XIDs on every node it runs on (NVSentinel #1629: 77 nodes flagged): each
    node records it against the job, none drains; an XID 48 on one of them, inside the storm, drains it."""
    nodes = ("n1", "n2", "n3")
    slurm = world(nodes, jobs=[Job("500", "RUNNING", nodes, user="u")])
    watches = {}
    for k, n in enumerate(nodes):
        proc = tmp_path / f"proc-{n}"
        fake_proc(proc, 1000 + k, job=500)
        watches[n] = watch(tmp_path, slurm, n, proc)
    for n, w in watches.items():
        evs = [parse_line(line(xid, g, pid=1000 + nodes.index(n))) for g in range(4) for xid in (13, 45)]
        w.handle(evs, now=2000.0)
    watches["n2"].handle([parse_line(line(48, 2, text="An uncorrectable double bit error"))], now=2001.0)
    for n, w in watches.items():
        st = w.ctx.store.read()
        assert all(r["job_ids"] == ["500"] for r in records(w, "app-xid")) and len(records(w, "app-xid")) == 8
        if n == "n2":
            assert st["pending_drain"]["failure"]["reason"].startswith("xid 48 on GPU 2 of n2")
        else:
            assert not st.get("pending_drain") and not st.get("faults"), n


def test_xid_94_requeues_only_the_job_whose_process_raised_it(tmp_path):
    slurm = world(jobs=[Job("77", "RUNNING", ("n1",)), Job("88", "RUNNING", ("n1",))])
    fake_proc(tmp_path / "proc", 4567, job=88)
    w = watch(tmp_path, slurm, "n1", tmp_path / "proc")
    w.handle([parse_line(line(94, 1, pid=4567, text="Contained: SM (0x1). RST: No, D-RST: No"))], now=1000.0)
    faults = w.ctx.store.read()["requeue_faults"]
    assert [f.get("jobs") for f in faults] == [["88"]], faults


def test_an_xid_94_told_by_nvml_and_then_the_kernel_log_requeues_once(tmp_path):
    """CI soak seed 12: NVML's XID 94 (no process) and its kernel-log copy 150 ms later each opened a
    requeue fault, so every job on the GPU got two grace signals (a submitit job in its own requeue
    then lost its scontrol to the SIGTERM that requeue brings). One fault, one action."""
    from autoheal.hooks.xids import XidEvent

    slurm = world(jobs=[Job("77", "RUNNING", ("n1",))])
    w = watch(tmp_path, slurm, "n1", tmp_path / "proc")
    w.handle([XidEvent(94, gpu=1, source="nvml")], now=1000.0)
    w.handle([parse_line(line(94, 1, text="Contained: SM (0x1). RST: No, D-RST: No"))], now=1000.15)
    assert len(w.ctx.store.read()["requeue_faults"]) == 1
    assert len([d for d in records(w, "detection") if d.get("action") == C.REQUEUE]) == 1


def test_the_same_hardware_xid_repeated_is_one_fault_with_a_count(tmp_path):
    slurm = world()
    w = watch(tmp_path, slurm, "n1", tmp_path / "proc")
    for k in range(5):  # 200 s apart: past the dedupe window, no repair in between
        w.handle([parse_line(line(48, 1, text="An uncorrectable double bit error"))], now=1000.0 + 200 * k)
    st = w.ctx.store.read()
    assert len(st["faults"]) == 1 and st["faults"][0]["count"] == 5
    assert len([d for d in records(w, "detection") if d.get("severity") == "action"]) == 1


@pytest.mark.parametrize("xid", [13, 46, 110, 136, 151, 156, 158, 54, 4242])
def test_the_lab_can_raise_any_catalog_xid_with_a_jobs_pid(xid):
    from autoheal.hooks.xid_catalog import entry
    from autoheal_lab.fakenvml.state import kernel_log_line
    from autoheal_lab.gpus import xid_message

    text = kernel_log_line("0000:3b:00.0", xid, pid=4567, name="python", message=xid_message(xid))
    ev = parse_line(f"3,{next(_SEQ)},1000,-;{text}")  # the lab's injector writes it as the kernel would
    assert ev.xid == xid and ev.pci == "0000:3b:00" and XJ.process_of(ev) == (4567, "python")
    if xid in (46, 110, 156):  # no text of the fake driver's own: the catalog's description
        assert text.endswith(entry(xid).description)


def test_nvml_first_then_the_kernel_logs_copy_names_the_job(tmp_path):
    """The driver raises an NVML event (no process) and writes the Xid line; whichever xid-watch reads
    first, the job is named once the line is read."""
    from autoheal.hooks.xids import XidEvent

    slurm = world(jobs=[Job("77", "RUNNING", ("n1",))])
    fake_proc(tmp_path / "proc", 4567, job=77)
    w = watch(tmp_path, slurm, "n1", tmp_path / "proc")
    w.handle([XidEvent(13, gpu=0, source="nvml")], now=1000.0)
    w.handle([parse_line(line(13, 0, pid=4567))], now=1000.5)
    w.handle([parse_line(line(13, 0, pid=4567))], now=1001.0)  # a repeat of the line: no third record
    app = records(w, "app-xid")
    assert [r["job_ids"] for r in app] == [[], ["77"]]
    assert slurm.get_job("77").comment.startswith("autoheal: xid 13 on GPU 0 of n1")
