"""Node-side attacks on a real lab (issue 25 item 1, issue 27's wiped-state gap).

1. A user makes the real kernel write "NVRM: Xid (...): 79, ..." into the real ``/dev/kmsg``: an
   unprivileged process (``nobody``) compiles a two-line shared library whose file name is an XID 79
   line, loads it and dereferences NULL; the kernel logs the segfault, at facility 0, naming the file.
   A second run also names the task "NVRM: Xid (0:0)" so the kernel record *begins* like an Xid line.
   The lab's xid-watch and healthcheck read the real ``/dev/kmsg`` here (not the lab's injected file):
   both see the records and neither drains.
2. A node that had an XID 79 long ago (drained, repaired, back in service) has its node state wiped
   without a reboot: xid-watch and the healthcheck start again with no kernel-log cursor, the old record
   still in the log, and do not drain while the GPUs are healthy.
3. A job submitted by ``nobody`` with an environment aimed at root's hooks (``--export=ALL``: its own
   ``AUTOHEAL_CONFIG``, ``PYTHONPATH`` with a ``sitecustomize``, ``PYTHONHOME``, ``LD_PRELOAD``, ...): Slurm
   gives the prolog and epilog only its own ``SLURM_*`` variables, so none of it reaches them; the
   node stays in service and the epilog journals the job's records with the site's config.
4. ``nobody`` plants ``autoheal-memtier-<victim>/<job>/agent.pid`` in the node's world-writable memory
   folder, naming a process of another user: the real epilog of nobody's next job leaves it alive.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import node_state as read_node_state
from helpers import wait_epilogs_done, wait_for, wait_node_idle

from autoheal.hooks.kmsg import kernel_record
from autoheal.hooks.xids import parse_line
from autoheal.job_records import ensure_spool
from autoheal_lab import wiring
from autoheal_lab.gpus import inject

NAME = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus"
LIB_C = "void boom(void) { *(volatile int *)0 = 1; }\n"
MAIN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <sys/prctl.h>
int main(int argc, char **argv) {
    if (argc > 2) prctl(PR_SET_NAME, argv[2], 0, 0, 0);
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 3; }
    ((void (*)(void))dlsym(h, "boom"))();
    return 0;
}
"""


def sh(handle, *argv, timeout=15):
    return subprocess.run(list(argv), env=handle.env, capture_output=True, text=True, timeout=timeout)


def node_line(handle, node):
    return sh(handle, "scontrol", "-o", "show", "node", node).stdout


def journal(handle):
    path = handle.layout.root / "journal" / "journal.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run_hook(handle, node, module="autoheal.hooks.healthcheck"):
    env = dict(handle.env, **handle.lab.node_env(node), SLURMD_NODENAME=node)
    return subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)


def node_state(handle, node):
    return read_node_state(handle.layout.root, node)


def xid_watch_log(handle, node):
    path = handle.root / "log" / f"xid-watch-{node}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def kmsg_records():
    """Every record now in the real /dev/kmsg (first lines only)."""
    out = []
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # overwritten while reading
                continue
            if not data:
                break
            out.append(data.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return out


def no_xid_action(records):
    acted = [r for r in records if r.get("check") == "xid" or r.get("event") in ("drain", "requeue", "signal")]
    return not acted, acted


@pytest.fixture
def kmsg_lab(lab_factory):
    """A one-node lab whose hooks and xid-watch read the machine's real /dev/kmsg."""
    try:
        trace = Path("/proc/sys/debug/exception-trace").read_text().strip()
    except OSError:
        trace = ""
    if trace != "1":
        pytest.skip(f"/proc/sys/debug/exception-trace is {trace or 'missing'}: the kernel logs no segfaults")
    if not os.access("/dev/kmsg", os.R_OK) or shutil.which("gcc") is None:
        pytest.skip("needs a readable /dev/kmsg and gcc")
    handle = lab_factory(nodes=1, gpus=2, spares=0, hooks=True, xid_watch=False)
    conf = handle.layout.autoheal_conf
    text, n = re.subn(r'^kernel_log = .*$', 'kernel_log = "/dev/kmsg"', conf.read_text(), flags=re.M)
    assert n == 1, text
    conf.write_text(text)
    handle.lab.start_node_daemon("xid-watch-gpu1", "gpu1", wiring.xid_watch_argv("gpu1"))
    # xid-watch has read /dev/kmsg once: its cursor names it
    wait_for(lambda: (node_state(handle, "gpu1").get("kmsg") or {}).get("path") == "/dev/kmsg", 30,
             "xid-watch to read /dev/kmsg")
    return handle


@pytest.fixture
def attacker_dir():
    work = Path(tempfile.mkdtemp(prefix="autoheal-attack-", dir="/tmp"))
    os.chmod(work, 0o755)
    os.chown(work, pwd.getpwnam("nobody").pw_uid, -1)
    yield work
    shutil.rmtree(work, ignore_errors=True)


def as_nobody(argv, cwd, timeout=60):
    return subprocess.run(argv, user="nobody", group="nogroup", cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def test_a_users_segfault_in_an_xid_named_library_drains_nothing(kmsg_lab, attacker_dir):
    handle, node = kmsg_lab, "gpu1"
    before = len(journal(handle))
    # the compile, the library's file name and the crash are nobody's (the sources are plain C)
    for name, text in (("lib.c", LIB_C), ("main.c", MAIN_C)):
        (attacker_dir / name).write_text(text)
    got = as_nobody(["gcc", "-shared", "-fPIC", "-o", NAME, "lib.c"], attacker_dir)
    assert got.returncode == 0, got
    got = as_nobody(["gcc", "-o", "main", "main.c", "-ldl"], attacker_dir)
    assert got.returncode == 0, got
    comms = ("main", "NVRM: Xid (0:0)")
    # the kernel's records name each crash by its PID in the initial PID namespace, not the one
    # Popen returns when the suite runs in a PID namespace of its own (.ci/slurm-chroot, a container):
    # this run's records are the new ones, and their PIDs are read from them
    earlier = set(kmsg_records())
    for comm in comms:
        proc = subprocess.Popen([str(attacker_dir / "main"), str(attacker_dir / NAME), comm], user="nobody",
                                group="nogroup", cwd=str(attacker_dir), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        assert proc.wait(timeout=30) == -signal.SIGSEGV

    def crash_records():
        recs = [r for r in kmsg_records() if r not in earlier and NAME in r
                and re.search(r"\[\d+\]: segfault", r)]
        return recs if len(recs) == len(comms) else None

    records = wait_for(crash_records, 10, "the kernel's segfault records in /dev/kmsg")
    pids = [re.search(r"\[(\d+)\]: segfault", r).group(1) for r in records]
    for rec in records:
        # the forgery is real: a kernel record (facility 0) that carries the whole XID 79 line
        assert kernel_record(rec) is not None and NAME in rec, rec
        assert parse_line(rec) is None, rec
    assert any(";NVRM: Xid (0:0)[" in r for r in records), records  # the record begins like an Xid line

    # xid-watch read both records and said why it ignored them
    def rejected():
        log = xid_watch_log(handle, node)
        return all(f"[{pid}]: segfault" in log for pid in pids) and "not the NVIDIA driver's kernel record" in log

    wait_for(rejected, 15, "xid-watch to read and ignore the crash records")
    wait_for(lambda: (node_state(handle, node).get("counters") or {}).get("kernel_log_rejected_total", 0) >= 2,
             10, "the rejected-line counter")
    res = run_hook(handle, node)  # the healthcheck reads the same /dev/kmsg (shared cursor, or its own)
    assert res.returncode == 0, res.stderr
    line = node_line(handle, node)
    assert "DRAIN" not in line and "Reason=" not in line, line
    ok, acted = no_xid_action(journal(handle)[before:])
    assert ok, acted


def test_wiped_node_state_does_not_rejudge_an_xid_of_long_ago(lab_factory):
    handle, node = lab_factory(nodes=1, gpus=2, spares=0, hooks=True, xid_watch=True), "gpu1"
    from autoheal_lab.fakenvml import state as gstate

    # long ago: an XID 79 drained the node; the GPU was repaired and the node put back in service
    inject(handle.lab, node, 1, "xid", xid=79)
    wait_for(lambda: "DRAIN" in node_line(handle, node), 20, f"{node} to drain for the XID 79")
    for gpu in range(handle.layout.gpus):
        gstate.inject(handle.layout.gpu_state(node), gpu, "clear")
    env = dict(handle.env, **handle.lab.node_env(node))
    sh(handle, sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node, timeout=60)
    sh(handle, "scontrol", "update", f"nodename={node}", "state=resume")
    assert run_hook(handle, node).returncode == 0
    wait_node_idle(handle.env, node, 60)
    assert ": 79," in handle.layout.kernel_log(node).read_text()  # the old record is still in the log

    # the node state is wiped (an admin's rm -rf, a re-imaged disk) without a reboot
    rec = handle.lab.records()[f"xid-watch-{node}"]
    from autoheal_lab import procs

    procs.stop(rec)
    shutil.rmtree(handle.layout.root / "nodestate" / node)
    before = len(journal(handle))
    log_before = len(xid_watch_log(handle, node))
    handle.lab.start_node_daemon(f"xid-watch-{node}", node, wiring.xid_watch_argv(node))
    wait_for(lambda: "earlier XID record(s) not judged" in xid_watch_log(handle, node)[log_before:]
             or (node_state(handle, node).get("kmsg") or {}).get("offset"), 30,
             "xid-watch to read the kernel log")
    for _ in range(2):  # the healthcheck twice: live NVML checks decide, and the GPUs are healthy
        res = run_hook(handle, node, "autoheal.hooks.healthcheck")
        assert res.returncode == 0, (res.stdout, res.stderr)
    res = subprocess.run([sys.executable, "-m", "autoheal.hooks.prolog"], env=dict(env, SLURMD_NODENAME=node,
                         SLURM_JOB_ID="999"), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    line = node_line(handle, node)
    assert "DRAIN" not in line and "Reason=" not in line, line
    ok, acted = no_xid_action(journal(handle)[before:])
    assert ok, acted
    # a new XID after the wipe is still judged at once
    inject(handle.lab, node, 0, "xid", xid=79)
    wait_for(lambda: "DRAIN" in node_line(handle, node), 20, f"{node} to drain for the new XID 79")
    assert "xid 79 on GPU 0" in node_line(handle, node)


PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void probe(void) {
    char p[4096];
    snprintf(p, sizeof p, "%s/pwned.preload.uid%d.pid%d", PROBE_DIR, (int)getuid(), (int)getpid());
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
}
"""
SITECUSTOMIZE = """import os
open(os.path.join({d!r}, "pwned.sitecustomize.uid%d.pid%d" % (os.getuid(), os.getpid())), "w").close()
"""


@pytest.fixture
def world_lab():
    """A one-node lab with the hooks, in a folder every user can read (slurm.conf, munge's socket), as
    on a real cluster: not under pytest's private (0700) temporary folder."""
    from conftest import _start

    if shutil.which("gcc") is None:
        pytest.skip("needs gcc (the LD_PRELOAD probe)")
    root = Path(tempfile.mkdtemp(prefix="autoheal-envlab-", dir="/tmp"))
    root.chmod(0o755)
    try:
        handle = _start(root, nodes=1, gpus=2, spares=0, hooks=True, xid_watch=False)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield handle
    finally:
        handle.lab.down()
        shutil.rmtree(root, ignore_errors=True)


def _probes(attacker_dir):
    return sorted(p.name for p in attacker_dir.iterdir() if p.name.startswith("pwned."))


def test_a_users_job_environment_never_reaches_the_hooks(world_lab, attacker_dir):
    handle, node = world_lab, "gpu1"
    spool = Path(handle.config().journal.job_spool)
    assert ensure_spool(spool) is None  # as the node's first epilog leaves it (root's, 1733)
    evil = attacker_dir / "evil.toml"
    for sub in ("py", "journal", "state"):
        (attacker_dir / sub).mkdir()
    evil.write_text(f'[journal]\npath = "{attacker_dir}/journal/journal.jsonl"\n'
                    f'[hooks]\nstate_dir = "{attacker_dir}/state/{{node}}"\nexpected_gpus = 99\n')
    (attacker_dir / "py" / "sitecustomize.py").write_text(SITECUSTOMIZE.format(d=str(attacker_dir)))
    (attacker_dir / "preload.c").write_text(PRELOAD_C)
    for path in attacker_dir.rglob("*"):
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    got = as_nobody(["gcc", "-shared", "-fPIC", f'-DPROBE_DIR="{attacker_dir}"', "-o", "preload.so", "preload.c"],
                    attacker_dir)
    assert got.returncode == 0, got
    hostile = {"AUTOHEAL_CONFIG": str(evil), "PYTHONPATH": str(attacker_dir / "py"),
               "PYTHONSTARTUP": str(attacker_dir / "py" / "sitecustomize.py"), "PYTHONHOME": str(attacker_dir),
               "LD_PRELOAD": str(attacker_dir / "preload.so"), "LD_LIBRARY_PATH": str(attacker_dir),
               "AUTOHEAL_NODE": "gpu9", "AUTOHEAL_MEMTIER_BASE": str(attacker_dir / "mem"),
               "AUTOHEAL_FAKE_NVML_STATE": str(attacker_dir / "gpus.state")}
    # the probes work: root's Python and a root program given this environment leave a uid-0 mark
    probe_env = dict(os.environ, PYTHONPATH=hostile["PYTHONPATH"], LD_PRELOAD=hostile["LD_PRELOAD"])
    subprocess.run([sys.executable, "-c", "pass"], env=probe_env, check=True, timeout=60)
    assert any("sitecustomize.uid0" in n for n in _probes(attacker_dir)), _probes(attacker_dir)
    assert any("preload.uid0" in n for n in _probes(attacker_dir)), _probes(attacker_dir)
    for name in _probes(attacker_dir):
        (attacker_dir / name).unlink()

    script = attacker_dir / "job.sh"
    script.write_text("#!/bin/sh\nenv | sort > job.env\numask 077\n"
                      f"echo '{{\"event\": \"job-note\", \"message\": \"env probe\"}}' "
                      f'> "{spool}/$SLURM_JOB_ID.$(id -u).jsonl"\n')
    script.chmod(0o755)
    os.chown(script, pwd.getpwnam("nobody").pw_uid, -1)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(attacker_dir), "SLURM_CONF": str(handle.layout.slurm_conf),
           **hostile}
    got = subprocess.run(["sbatch", "--parsable", "--export=ALL", "-N1", "-w", node, "-o", "/dev/null",
                          "--comment", "autoheal-runner state=running", str(script)], user="nobody",
                         group="nogroup", cwd=str(attacker_dir), env=env, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got
    job = got.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: "JobState=COMPLETED" in sh(handle, "scontrol", "-o", "show", "job", job).stdout, 90,
                 f"job {job} to complete")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {sh(handle, 'scontrol', '-o', 'show', 'job', job).stdout} | "
                             f"{node_line(handle, node)}") from None
    wait_epilogs_done(handle.env, node, 60)
    # the epilog ran with the site's config: the job's own record is in the site journal, marked as nobody's
    wait_for(lambda: any(r.get("source") == "job" and job in r.get("job_ids", []) for r in journal(handle)), 30,
             "the epilog to journal the job's record")
    rec = next(r for r in journal(handle) if r.get("source") == "job" and job in r.get("job_ids", []))
    assert rec["message"].startswith("[user nobody]") and rec["node"] == node, rec
    # the attack was live: the job itself had the hostile environment...
    job_env = (attacker_dir / "job.env").read_text()
    assert all(f"{k}={v}\n" in job_env for k, v in hostile.items()), job_env
    # ... and root's hooks never did: no root process loaded the user's code, used their config or drained
    assert not [n for n in _probes(attacker_dir) if ".uid0." in n], _probes(attacker_dir)
    assert not list((attacker_dir / "journal").iterdir()) and not list((attacker_dir / "state").iterdir())
    line = node_line(handle, node)
    assert "DRAIN" not in line and "Reason=" not in line, line


def _run_job_as_nobody(handle, attacker_dir, node, script_text):
    """Submit ``script_text`` as nobody on ``node``; wait until it completed and its epilog ended."""
    script = attacker_dir / "job.sh"
    script.write_text(script_text)
    script.chmod(0o755)
    os.chown(script, pwd.getpwnam("nobody").pw_uid, -1)
    got = as_nobody(["env", f"SLURM_CONF={handle.layout.slurm_conf}", "sbatch", "--parsable", "-N1", "-w", node,
                     "-o", "/dev/null", str(script)], attacker_dir)
    assert got.returncode == 0, got
    job = got.stdout.strip().split(";")[0]
    wait_for(lambda: "JobState=COMPLETED" in sh(handle, "scontrol", "-o", "show", "job", job).stdout, 90,
             f"job {job} to complete")
    wait_epilogs_done(handle.env, node, 60)
    return job


def test_a_memory_folder_a_user_named_for_another_is_never_believed_by_the_epilog(world_lab, attacker_dir):
    """The node's memory is world-writable, as /dev/shm is: nobody makes autoheal-memtier-<victim>/<job>/
    agent.pid naming a process of the victim's (uid 65533) that carries SLURM_JOB_ID=<a job Slurm does not
    know>. Before the fix the epilog of nobody's next job swept it as the victim's leftover and SIGKILLed
    that process."""
    handle, node = world_lab, "gpu1"
    mem = Path(handle.layout.memory_base.replace("{node}", node))
    victim = subprocess.Popen(["/bin/sh", "-c", "echo up; exec sleep 300"], user=65533, group=65533, extra_groups=[],
                              env={"SLURM_JOB_ID": "777", "PATH": "/usr/bin:/bin"}, cwd="/", stdout=subprocess.PIPE)
    try:
        assert victim.stdout is not None and victim.stdout.readline() == b"up\n"
        folder = mem / "autoheal-memtier-65533" / "777"
        got = as_nobody(["sh", "-c", f"mkdir -p {folder} && echo '{victim.pid} 0' > {folder}/agent.pid"],
                        attacker_dir)
        assert got.returncode == 0, got  # the lab's node memory lets any user do it, as /dev/shm does
        _run_job_as_nobody(handle, attacker_dir, node, "#!/bin/sh\ntrue\n")
        assert victim.poll() is None, "the epilog killed the victim's process on nobody's word"
        assert (folder / "agent.pid").exists()
        line = node_line(handle, node)
        assert "DRAIN" not in line and "Reason=" not in line, line
    finally:
        victim.kill()
        victim.wait()
        if victim.stdout is not None:
            victim.stdout.close()
