"""The lab's generated configuration, without a lab: one definition of the spare's reason, daemons."""

from __future__ import annotations

from pathlib import Path

from autoheal.config import load_config
from autoheal.config.sync_section import SyncSection
from autoheal.reasons import MAX_REASON_LEN, is_ours
from autoheal_lab import wiring
from autoheal_lab.cluster import render_autoheal_toml, set_toml_values
from autoheal_lab.slurmconf import LabLayout, render_slurm_conf, spare_reason


def _layout(root: Path) -> LabLayout:
    return LabLayout(root=root, nodes=["gpu1", "gpu2"], spares=["spare1"], gpus=2, ctld_port=1,
                     node_ports={"gpu1": 2, "gpu2": 3, "spare1": 4}, rest_port=5)


def test_the_spare_reason_starts_with_the_syncs_prefix(tmp_path):
    """Issue 16 finding 10: slurm.conf said "autoheal: spare pool: ...", the sync looked for "autoheal: spare:"."""
    lay = _layout(tmp_path)
    lay.autoheal_conf.parent.mkdir(parents=True)
    lay.autoheal_conf.write_text(render_autoheal_toml(lay))
    prefix = load_config(lay.autoheal_conf).sync.spare_reason_prefix
    assert prefix == SyncSection().spare_reason_prefix
    reason = spare_reason(prefix)
    assert reason.startswith(prefix.strip()) and is_ours(reason) and len(reason) <= MAX_REASON_LEN
    assert spare_reason("autoheal: pool-x:").startswith("autoheal: pool-x:")  # follows a site's own prefix
    assert spare_reason("autoheal: x:\n" + "y" * 300).count("\n") == 0  # sanitised and bounded


def test_slurm_conf_gives_spares_no_configured_state(tmp_path):
    """A configured State=DRAIN is re-applied by slurmctld on every restart, even to a spare in service."""
    text = render_slurm_conf(_layout(tmp_path), {}, [])
    node_lines = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert len(node_lines) == 3 and all(ln.endswith("State=UNKNOWN") for ln in node_lines)
    assert "Reason=" not in text


def test_every_node_in_service_gets_the_node_daemons_and_options_turn_them_off():
    names = [d.proc_name("spare1") for d in wiring.node_daemons({"xid_watch": True})]
    assert names == (["xid-watch-spare1"] if wiring.xid_watch_available() else [])
    assert wiring.node_daemons({"xid_watch": False}) == []
    assert wiring.xid_watch_argv("spare1")[-2:] == ["--node", "spare1"]
    extra = wiring.Daemon("guard", lambda _n: ["true"], lambda: True)
    assert extra.wanted({}) and extra.proc_name() == "guard"


def test_a_labs_hooks_settings_are_written_before_its_daemons_read_them(tmp_path):
    """The soak's lemons: Lab.up(hooks_conf=...) sets [hooks] keys in the generated config (xid-watch reads
    it once at start), replacing the lab's own line, and the result is a config autoheal loads."""
    lay = _layout(tmp_path)
    lay.autoheal_conf.parent.mkdir(parents=True, exist_ok=True)
    lay.autoheal_conf.write_text(render_autoheal_toml(lay))
    assert load_config(lay.autoheal_conf).hooks.lemon_faults == 0  # the lab's default: lemons off
    set_toml_values(lay.autoheal_conf, "hooks", {"lemon_faults": 3, "resume_cooldown": 1.0})
    cfg = load_config(lay.autoheal_conf)
    assert cfg.hooks.lemon_faults == 3 and cfg.hooks.resume_cooldown == 1.0
    assert cfg.hooks.grace_seconds == 10.0 and cfg.sync.slurm_resync_seconds == 2.0  # the rest kept
    assert lay.autoheal_conf.read_text().count("lemon_faults") == 1


def test_reboot_program_finds_its_node_in_26_05s_power_action_environment(tmp_path):
    """26.05's slurmd runs RebootProgram as a "power action" whose environment holds SLURM_NODE_NAME and
    nothing else (no SLURMD_NODENAME, no PATH), and kills the program's process group once it exits: the
    lab's program exited 1 there, then (named) lost its restart to that kill, and no lab node rebooted
    (the hooks' reboot rung timed out). Run as 26.05 runs it, it names its node and the restart survives."""
    import subprocess
    import time

    lay = LabLayout(root=tmp_path, nodes=["gpu1"], spares=[], gpus=1, ctld_port=1, node_ports={"gpu1": 2},
                    rest_port=3)
    lay.path("hooks").mkdir(parents=True, exist_ok=True)
    lay.path("log").mkdir(parents=True, exist_ok=True)
    script = wiring.write_reboot_program(lay)
    log = lay.path("log", "reboot.log")
    bare = subprocess.run(["/usr/bin/env", "-i", script], capture_output=True, timeout=20)
    assert bare.returncode == 1  # no node named at all: nothing restarted
    # as 26.05's run_command does: the program in a process group of its own, killed (the group) as soon
    # as the program exits; the restart must already be out of it by then
    import os
    import signal

    proc = subprocess.Popen(["/usr/bin/env", "-i", "SLURM_NODE_NAME=gpu1", script], process_group=0,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _out, err = proc.communicate(timeout=20)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert proc.returncode == 0, err
    assert "RebootProgram for node=gpu1 (SLURM_NODE_NAME=gpu1 SLURMD_NODENAME=unset" in log.read_text()
    # the detached restart (no lab here: it fails after naming the node) is waited for, not left behind
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "lab reboot of gpu1" not in log.read_text():
        time.sleep(0.2)
    assert "lab reboot of gpu1" in log.read_text()
