"""Pure judges, XID parsing, policy, ladder, mapping and gres parsing of autoheal.hooks."""

from __future__ import annotations

import pytest

from autoheal.config import parse_config
from autoheal.config.hooks_section import HooksSection
from autoheal.errors import ConfigError
from autoheal.hooks import checks as C
from autoheal.hooks.context import gres_gpu_count
from autoheal.hooks.gather import GpuSample, NodeSample
from autoheal.hooks.ladder import next_rung
from autoheal.hooks.mapping import indices_from_show_job, parse_indices
from autoheal.hooks.xids import LogCursor, normalize_pci, parse_line, policy_for, read_kernel_log


def healthy(i: int = 0) -> GpuSample:
    return GpuSample(index=i, ok=True, pci="0000:3b:00.0", persistence=True, temperature=40, ecc_dbe_volatile=0,
                     remap_pending=False, remap_failure=False, remap_uncorrectable=0, pcie_gen=5, pcie_gen_max=5,
                     pcie_width=16, pcie_width_max=16, nvlinks_down=[], clock_events=1, recovery_action=0, idle=True)


def test_kmsg_xid_records_of_every_real_format():
    ev = parse_line("4,812,7003002,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
                    "GPU has fallen off the bus.")
    assert (ev.xid, ev.pci, ev.seq, ev.usec) == (79, "0000:3b:00", 812, 7003002)
    old = parse_line("4,13,12300000,-;NVRM: Xid (0000:03:00): 14, Channel 00000001")
    assert (old.xid, old.pci, old.seq) == (14, "0000:03:00", 13)
    off = parse_line("4,14,12300001,-;NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.")
    assert (off.xid, off.pci) == (79, "0000:5d:00")
    # more test formats, and the forgeries that must not count: tests/unit/test_xid_forgery.py


@pytest.mark.parametrize("line", ["", "garbage", "NVRM: Xid (PCI:zz): x, foo",
                                  "NVRM: Xid (PCI:0000:3b:00): , no number",
                                  "NVRM: Xid (PCI:0000:3b:00): 0, nothing", "\x00\xff NVRM"])
def test_malformed_lines_are_ignored(line):
    assert parse_line(line) is None
    assert parse_line("4,1,2,-;" + line) is None  # malformed inside a kernel record too


def test_pci_forms_normalise_alike():
    assert normalize_pci("00000000:3B:00.0") == normalize_pci("PCI:0000:3b:00") == "0000:3b:00"


def test_policy_defaults_and_overrides():
    assert policy_for(79) == "replace" and policy_for(13) == "job" and policy_for(94) == "requeue"
    assert policy_for(999) == "recovery"  # not in the catalog: the documented fallback, not a silent warn
    assert policy_for(13, {"13": "reset"}) == "reset"


def test_xid_judgement_and_app_xids_never_escalate():
    ev = parse_line("4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
                    "GPU has fallen off the bus.")
    r = C.judge_xid(ev, gpu=3, pci="0000:3b:00.0", node="gpu2")
    assert r.status == C.FAIL and r.action == C.REPLACE
    # issue 15: a GPU index never reads like a node name ("on gpu3" was taken for the node gpu3)
    assert r.text == "xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus"
    app = parse_line("4,2,3,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception")
    r = C.judge_xid(app, gpu=3)
    assert r.status == C.OK and r.action == C.NONE and r.evidence["policy"] == "job"


CASES = [
    # (check name, field changes that break it, expected action)
    ("ecc", {"ecc_dbe_volatile": 1}, C.RESET),
    ("remapped-rows", {"remap_pending": True}, C.RESET),
    ("remapped-rows", {"remap_failure": True}, C.REPLACE),
    ("pcie", {"pcie_width": 8}, C.REBOOT),
    ("pcie", {"pcie_gen": 3, "idle": False, "clock_events": 0}, C.REBOOT),
    ("nvlink", {"nvlinks_down": [0, 5]}, C.RESET),
    ("temperature", {"temperature": 92}, C.DRAIN),
    ("recovery-action", {"recovery_action": 1}, C.RESET),
    ("gpu-lost", {"error": "lost", "ok": False}, C.REBOOT),
]


@pytest.mark.parametrize("check,change,action", CASES)
def test_each_check_healthy_failing_unknown(check, change, action):
    cfg = HooksSection()
    ok = C.judge_sample(NodeSample(count=1, gpus=[healthy()]), cfg, 1)
    assert C.overall(ok) == C.OK
    g = healthy()
    for k, v in change.items():
        setattr(g, k, v)
    res = [r for r in C.judge_sample(NodeSample(node="gpu2", count=1, gpus=[g]), cfg, 1) if r.check == check]
    assert res and res[0].status == C.FAIL and res[0].action == action, res
    assert res[0].text.startswith(check + ": GPU 0 of gpu2 (0000:3b:00.0): ")
    hung = GpuSample(index=0, error="timeout")
    unknown = C.judge_sample(NodeSample(count=1, gpus=[hung]), cfg, 1)
    assert C.overall(unknown) == C.UNKNOWN


def test_pcie_gen_ignored_while_idle_and_checks_can_be_disabled():
    g = healthy()
    g.pcie_gen = 1
    assert C.overall(C.judge_sample(NodeSample(count=1, gpus=[g]), HooksSection(), 1)) == C.OK
    g.ecc_dbe_volatile = 3
    off = HooksSection(disabled_checks=["ecc"])
    assert C.overall(C.judge_sample(NodeSample(count=1, gpus=[g]), off, 1)) == C.OK


def test_count_driver_and_thermal_warn():
    cfg = HooksSection()
    res = C.judge_sample(NodeSample(count=7, gpus=[healthy(i) for i in range(7)]), cfg, 8)
    assert [r.check for r in res if r.status == C.FAIL] == ["gpu-count"]
    hung = C.judge_sample(NodeSample(init_error="NVML did not answer within 1s"), cfg, 8)
    assert C.overall(hung) == C.UNKNOWN
    gone = C.judge_sample(NodeSample(init_error="Driver Not Loaded"), cfg, 8)
    assert C.overall(gone) == C.FAIL
    g = healthy()
    g.temperature, g.clock_events = 86, 0x48
    assert C.overall(C.judge_sample(NodeSample(count=1, gpus=[g]), cfg, 1)) == C.WARN


def test_ladder_escalates_on_recurrence():
    assert next_rung(C.RESET, 0, 0) == C.RESET
    assert next_rung(C.RESET, 1, 0) == C.REBOOT
    assert next_rung(C.RESET, 1, 1) == C.REPLACE
    assert next_rung(C.REBOOT, 0, 1) == C.REPLACE
    assert next_rung(C.RESET, 0, 0, can_reset=False) == C.REBOOT
    assert next_rung(C.DRAIN, 3, 3) is None


def test_mapping_indices():
    assert parse_indices("0-1,4") == [0, 1, 4] and parse_indices("x") == []
    text = ("JobId=5 JobName=wrap\n   Nodes=gpu1 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)\n"
            "   Nodes=gpu2 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n")
    assert indices_from_show_job(text, "gpu2") == [3]
    assert indices_from_show_job(text, "gpu9") == []


def test_gres_conf_count():
    text = "# c\nNodeName=gpu[1-3] Name=gpu File=/x/dev/nvidia[0-7]\nNodeName=big Name=gpu Count=4\n"
    assert gres_gpu_count(text, "gpu2") == 8 and gres_gpu_count(text, "big") == 4
    assert gres_gpu_count(text, "other") == 0


def test_kernel_log_file_cursor_drops_replays(tmp_path):
    log = tmp_path / "kmsg.log"
    rec = "4,7,100,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error\n"
    log.write_text("junk line\n")
    events, cur = read_kernel_log(str(log), LogCursor())  # the first read places the cursor
    assert events == []
    with open(log, "a") as fh:
        fh.write(rec)
    events, cur = read_kernel_log(str(log), cur)
    assert [e.xid for e in events] == [48]
    again, cur = read_kernel_log(str(log), cur)
    assert again == []
    with open(log, "a") as fh:  # the same record replayed (e.g. a log re-shipped after a restart)
        fh.write(rec)
    replayed, cur = read_kernel_log(str(log), LogCursor(boot_id=cur.boot_id, max_seq=cur.max_seq))
    assert replayed == []


def test_config_rejects_bad_policy():
    with pytest.raises(ConfigError, match="xid_policy"):
        parse_config('[hooks]\nxid_policy = {"79" = "explode"}\n')
    cfg = parse_config('[hooks]\nxid_policy = {"13" = "warn"}\ntemperature_max = 95\n')
    assert cfg.hooks.xid_policy == {"13": "warn"}


@pytest.mark.parametrize("value,status,action", [
    (0, C.OK, None),  # NONE: nothing
    (1, C.FAIL, C.RESET),  # GPU_RESET
    (2, C.FAIL, C.REBOOT),  # NODE_REBOOT
    (3, C.FAIL, C.DRAIN),  # DRAIN_P2P: drained (the jobs leave), no repair; the next reading decides
    (4, C.FAIL, C.RESET),  # DRAIN_AND_RESET: the reset runs on our idle drained node
    (5, C.FAIL, C.DRAIN),  # RECOVER_IMEX_DOMAIN: a person
    (6, C.FAIL, C.REBOOT),  # BUS_RESET: no bus reset in the hooks; a reboot resets the bus
    (7, C.FAIL, C.REBOOT),  # SYSTEM_REBOOT
    (99, C.FAIL, C.DRAIN),  # a newer driver's action: a person, never a silent pass
])
def test_nvmls_recovery_action_gets_its_rung(value, status, action):
    """XID 154 (issue 22): what NVML's GPU recovery action asks (nvml.h nvmlDeviceGpuRecoveryAction_t)
    is the rung. DRAIN_P2P was a warning before: the jobs kept their peer-to-peer traffic on a GPU NVIDIA
    says must be quiesced."""
    g = healthy()
    g.recovery_action = value
    res = [r for r in C.judge_sample(NodeSample(node="gpu2", count=1, gpus=[g]), HooksSection(), 1)
           if r.check == "recovery-action"]
    assert len(res) == 1 and res[0].status == status, res
    if action is not None:
        assert res[0].action == action and res[0].evidence["recovery_action"] == value
        assert C.worst_failure(res) is res[0]  # it names the drain
    assert (C.recovery_verdict(value) is None) == (value == 0)
    assert C.recovery_verdict(None) is None  # no reading (an older driver): nothing, never a drain
