"""The lab's fake "CUDA" (autoheal_lab.fakedevice): each fault kind reaches the rank as on real hardware."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from autoheal_lab import fakedevice as fd
from autoheal_lab.fakenvml import state as gstate


@pytest.fixture
def node(tmp_path):
    path = tmp_path / "gpu1.state"
    gstate.write_state(path, gstate.default_state("gpu1", 4))
    return path


class Crashed(Exception):
    pass


def _crash(why):
    raise Crashed(why)


def device(path, gpus=(1,), **kw):
    return fd.FakeDevice(path, list(gpus), crash=_crash, **kw)


def test_healthy_gpu_steps_saves_and_its_collective_runs(node):
    dev = device(node)
    dev.step()
    dev.copy_to_host()
    assert dev.links_ok()


def test_xid79_makes_every_call_fail_on_that_gpu_only(node):
    dev, other = device(node, (1,)), device(node, (2,))
    gstate.inject(node, 1, "xid", xid=79)
    with pytest.raises(fd.DeviceLost, match="fallen off the bus"):
        dev.step()
    with pytest.raises(fd.DeviceLost):
        dev.copy_to_host()  # the rank cannot copy its state off a GPU that is gone
    other.step()  # GPU 2 of the same node is fine


def test_lost_without_an_xid_fails_too(node):
    dev = device(node)
    gstate.inject(node, 1, "lost")
    with pytest.raises(fd.DeviceLost):
        dev.step()


def test_uncorrectable_ecc_crashes_the_process_instead_of_raising(node):
    dev = device(node)
    gstate.inject(node, 1, "ecc-dbe")
    with pytest.raises(Crashed, match="uncorrectable ECC"):
        dev.step()


def test_an_xid48_event_after_the_device_opened_crashes_but_an_older_one_does_not(node):
    gstate.inject(node, 1, "xid", xid=48)  # raised before this process's context existed
    dev = device(node)
    dev.step()
    gstate.inject(node, 1, "xid", xid=48)
    with pytest.raises(Crashed):
        dev.step()


def test_nvlink_down_leaves_compute_working_but_the_collective_cannot_complete(node):
    dev = device(node)
    gstate.inject(node, 1, "nvlink-down", link=3)
    dev.step()
    dev.copy_to_host()
    assert not dev.links_ok()


def test_a_hung_gpu_makes_the_call_take_that_long(node):
    slept = []
    dev = device(node, sleep=slept.append)
    with gstate.update_state(node) as st:
        st.gpus[1].hang_ms = 1500
    dev.step()
    assert slept == [1.5]


def test_a_cleared_gpu_works_again(node):
    dev = device(node)
    gstate.inject(node, 1, "ecc-dbe")
    gstate.inject(node, 1, "clear")
    # the XID 48 event is still in the queue: it was raised while this context lived, so it stays dead
    with pytest.raises(Crashed):
        dev.step()
    device(node).step()  # a new process (context) on the reset GPU runs


def test_a_step_without_gpus_or_with_a_gpu_already_gone_fails_at_init(node):
    with pytest.raises(fd.DeviceError, match="no CUDA-capable device"):
        device(node, ())
    gstate.inject(node, 3, "xid", xid=79)
    with pytest.raises(fd.DeviceLost):
        device(node, (3,))
    with pytest.raises(fd.DeviceLost):
        device(node.with_name("missing.state"))


@pytest.mark.parametrize("env,want", [
    ({"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}, [2, 3]),  # ConstrainDevices renumbers CVD
    ({"CUDA_VISIBLE_DEVICES": "1"}, [1]),
    ({}, []),
])
def test_step_gpus_prefers_slurms_own_index(env, want):
    assert fd.step_gpus(env) == want


def test_step_gpus_rejects_a_uuid_list():
    with pytest.raises(fd.DeviceError, match="not a list of GPU indexes"):
        fd.step_gpus({"CUDA_VISIBLE_DEVICES": "GPU-1234"})


def test_from_env_fills_in_the_node_and_needs_it(node):
    tmpl = str(node).replace("gpu1", "{node}")
    dev = fd.FakeDevice.from_env({fd.ENV_STATE: tmpl, "SLURMD_NODENAME": "gpu1", "SLURM_STEP_GPUS": "0"})
    assert dev.state_path == node and dev.gpus == [0]
    with pytest.raises(fd.DeviceError, match="SLURMD_NODENAME"):
        fd.FakeDevice.from_env({fd.ENV_STATE: tmpl, "SLURM_STEP_GPUS": "0"})


def test_the_real_crash_aborts_the_process_without_running_its_code_after(node):
    gstate.inject(node, 0, "ecc-dbe")
    code = ("from autoheal_lab import fakedevice as fd\n"
            "try:\n"
            f"    fd.FakeDevice({str(node)!r}, [0]).step()\n"
            "finally:\n"
            "    print('saved')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == -signal.SIGABRT, (res.returncode, res.stderr)
    assert "saved" not in res.stdout and "uncorrectable ECC" in res.stderr


def test_judge_reads_only_the_hardware():
    g = gstate.GpuState(index=0)
    assert fd.judge(g, 0, [], 0).health is fd.Health.OK
    assert fd.judge(None, 0, [], 0).health is fd.Health.LOST
    late = [gstate.Event(seq=10, gpu=0, xid=74)]
    assert fd.judge(g, 0, late, 5).health is fd.Health.LINK_DOWN
    assert fd.judge(g, 0, late, 10).health is fd.Health.OK  # raised before the context was opened
    assert fd.judge(g, 1, late, 5).health is fd.Health.OK  # another GPU's event


class Clock:
    """A fake monotonic clock that the fake sleep advances."""

    def __init__(self):
        self.now = 100.0
        self.slept = []

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_collective_runs_the_real_call_on_healthy_links(node):
    clk = Clock()
    dev = device(node, sleep=clk.sleep)
    assert dev.collective(lambda: 42, timeout=600, clock=lambda: clk.now) == 42
    assert clk.slept == []


def test_collective_over_a_link_that_is_down_waits_out_the_timeout_without_calling(node):
    clk = Clock()
    dev = device(node, sleep=clk.sleep)
    gstate.inject(node, 1, "nvlink-down")
    called = []
    with pytest.raises(fd.CollectiveTimeout, match="NVLink down: no progress within 600 s"):
        dev.collective(lambda: called.append(1), timeout=600, clock=lambda: clk.now)
    assert called == [] and clk.slept == [600.0]


def test_a_peer_gone_is_not_noticed_early_as_gloo_would_but_waited_out_as_nccl_does(node):
    clk = Clock()
    dev = device(node, sleep=clk.sleep)

    def gloo_allreduce():
        clk.now += 2.0  # gloo noticed the closed connection after 2 s
        raise RuntimeError("[pair.cc:598] Connection closed by peer [127.0.0.1]:4242\nmore")

    with pytest.raises(fd.CollectiveTimeout, match=r"peer gone \(\[pair.cc:598\] Connection closed by peer"):
        dev.collective(gloo_allreduce, timeout=300, clock=lambda: clk.now)
    assert clk.slept == [298.0]  # the rest of the timeout, not a second more


def test_a_gpu_call_failing_inside_the_collective_is_raised_as_it_is(node):
    dev = device(node)

    def lost():
        raise fd.DeviceLost("CUDA error: kernel launch on GPU 1")

    with pytest.raises(fd.DeviceLost):
        dev.collective(lost, timeout=300)
    other = device(node)
    with pytest.raises(ValueError):  # not a peer error: not swallowed either
        other.collective(lambda: int("x"), timeout=300)


def test_collective_on_a_lost_gpu_fails_at_once(node):
    clk = Clock()
    dev = device(node, sleep=clk.sleep)
    gstate.inject(node, 1, "xid", xid=79)
    with pytest.raises(fd.DeviceLost):
        dev.collective(lambda: 1, timeout=300, clock=lambda: clk.now)
    assert clk.slept == []


def test_collective_holds_the_grace_signal_pending_until_it_returns(node):
    got = []
    old = signal.signal(signal.SIGUSR2, lambda *_: got.append("handled"))
    try:
        dev = device(node)

        def allreduce():
            signal.pthread_kill(__import__("threading").main_thread().ident, signal.SIGUSR2)
            got.append("returned")
            return 1

        dev.collective(allreduce, timeout=5, signals=(signal.SIGUSR2,))
        assert got == ["returned", "handled"]
    finally:
        signal.signal(signal.SIGUSR2, old)
