"""The fragment per version, lab_fragment's merging, recorded samples, and the CLIs without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoheal.slurm.parse import parse_show_config
from autoheal.slurm_conf import values
from autoheal.slurm_conf.cli import doctor, slurm_conf
from autoheal.slurm_conf.doctor import diagnose
from autoheal.slurm_conf.fragment import LAB_OWNED_KEYS, lab_fragment, render_conf
from autoheal.slurm_conf.recommendations import KNOWN_VERSIONS

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLES = {
    "22.05-defaults": FIX / "slurm-22.05" / "show_config.txt",
    "22.05-fragment": FIX / "slurm-conf" / "show_config-22.05.8-fragment.txt",
    "24.11-lab": FIX / "slurm-conf" / "show_config-24.11.5.txt",
    "25.11-defaults": FIX / "slurm-conf" / "show_config-25.11.4.txt",
    "26.05-lab": FIX / "slurm-conf" / "show_config-26.05.5.txt",
}


def conf_lines(lines):
    return [ln for ln in lines if ln.strip() and not ln.startswith("#")]


def keys_of(lines):
    return [ln.split("=", 1)[0] for ln in conf_lines(lines)]


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_fragment_one_line_per_key(version):
    keys = keys_of(render_conf(version, gres=False))
    assert len(keys) == len(set(keys))
    assert "KillWait" in keys and "AuthInfo" in keys


def test_version_specific_keys():
    k22 = keys_of(render_conf("22.05"))
    k24 = keys_of(render_conf("24.11"))
    k25 = conf_lines(render_conf("25.11"))
    assert "PreemptParameters" not in k22 and "MaxBatchRequeue" not in k22  # 22.05 rejects unknown keys
    assert "SlurmctldParameters=preempt_send_user_signal" in conf_lines(render_conf("22.05"))
    assert "PreemptParameters" in k24 and "MaxBatchRequeue" in k24
    assert "SlurmctldParameters=enable_expedited_requeue" in k25


def test_lab_fragment_leaves_out_lab_keys_and_merges_authinfo():
    lines = lab_fragment("22.05", existing={"AuthInfo": "socket=/lab/munge.sock"})
    keys = keys_of(lines)
    assert not {k.lower() for k in keys} & {k.lower() for k in LAB_OWNED_KEYS}
    assert "AuthInfo=socket=/lab/munge.sock,cred_expire=10" in lines
    # without `existing`, AuthInfo must not replace the lab's munge socket
    assert "AuthInfo" not in keys_of(lab_fragment("22.05"))
    assert "AuthInfo=cred_expire=10" in lab_fragment("22.05", existing={})


def test_lab_fragment_auto_detects_installed_version():
    import shutil

    if not (shutil.which("scontrol") or Path("/usr/sbin/slurmctld").exists()):
        pytest.skip("Slurm not installed")
    assert lab_fragment()[0].startswith("# autoheal slurm-conf fragment for Slurm ")


def test_merge_items_replaces_same_name():
    assert values.merge_items("socket=/x,cred_expire=120", ["cred_expire=10"]) == "socket=/x,cred_expire=10"
    assert values.merge_items("(null)", ["Alloc"]) == "Alloc"
    assert values.merge_items("bf_continue", ["nohold_on_prolog_fail"]) == "bf_continue,nohold_on_prolog_fail"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_recorded_samples_parse(name):
    conf = parse_show_config(SAMPLES[name].read_text())
    assert conf["SLURM_VERSION"][:5] in ("22.05", "24.11", "25.11", "26.05")
    assert "KillWait" in conf


def test_samples_judged_as_expected():
    def status(name):
        return {f.id: f.status for f in diagnose(parse_show_config(SAMPLES[name].read_text())).findings}

    d22 = status("22.05-defaults")
    assert d22["kill_wait"] == d22["requeue_delay"] == d22["nohold_on_prolog_fail"] == "fail"
    assert d22["prolog_flags_alloc"] == "fail"
    f22 = status("22.05-fragment")
    for rid in ("kill_wait", "requeue_delay", "nohold_on_prolog_fail", "prolog_flags_alloc",
                "unkillable_step_timeout", "preempt_send_user_signal", "return_to_service"):
        assert f22[rid] == "ok", rid
    r24 = status("24.11-lab")
    assert set(r24.values()) == {"ok"}, r24
    r26 = status("26.05-lab")  # recorded with the lab's fragment and hooks: HealthCheckTimeout unset (0)
    assert set(r26.values()) == {"ok"} and "healthcheck_timeout" in r26, r26
    d25 = status("25.11-defaults")
    assert d25["prolog"] == "fail" and d25["expedited_requeue"] == "warn" and d25["return_to_service"] == "ok"


def test_slurm_conf_cli_conf_and_json():
    r = CliRunner().invoke(slurm_conf, ["--version", "24.11"])
    assert r.exit_code == 0, r.output
    assert "KillWait=120" in r.output and "# gres.conf" in r.output
    r = CliRunner().invoke(slurm_conf, ["--version", "22.05", "--format", "json"])
    data = json.loads(r.output)
    assert data["slurm_version"] == "22.05"
    assert {s["key"] for s in data["settings"]} >= {"AuthInfo", "KillWait", "PrologFlags"}
    r = CliRunner().invoke(slurm_conf, ["--version", "21.08"])
    assert r.exit_code == 2


def test_slurm_conf_merge_with_existing_file(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("AuthInfo=socket=/run/m.sock\nSchedulerParameters=bf_continue # tuned\n"
                    "NodeName=n1 CPUs=2\n")
    r = CliRunner().invoke(slurm_conf, ["--version", "24.11", "--merge-with", str(conf)])
    assert "AuthInfo=socket=/run/m.sock,cred_expire=10" in r.output
    assert "SchedulerParameters=bf_continue,nohold_on_prolog_fail" in r.output


def test_doctor_garbage_input_exits_2(tmp_path):
    bad = tmp_path / "garbage.txt"
    bad.write_text("<html>502 Bad Gateway</html>\n")
    r = CliRunner().invoke(doctor, ["--from-file", str(bad), "--config", str(tmp_path / "none.toml")])
    assert r.exit_code == 2
    assert "unexpected first line" in r.output
    bad.write_text("Configuration data as of 2026-01-01T00:00:00\nnonsense without equals\n")
    r = CliRunner().invoke(doctor, ["--from-file", str(bad), "--json"])
    assert r.exit_code == 2


def test_doctor_from_file_exit_codes(tmp_path):
    cfg = tmp_path / "a.toml"
    cfg.write_text("")
    r = CliRunner().invoke(doctor, ["--from-file", str(SAMPLES["22.05-defaults"]), "--json", "--config", str(cfg)])
    assert r.exit_code == 1
    data = json.loads(r.output)
    assert data["slurm_version"] == "22.05.8" and not data["ok"]
    r = CliRunner().invoke(doctor, ["--from-file", str(SAMPLES["24.11-lab"]), "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert "-> exit 0" in r.output


def test_version_detection_is_the_adapters_and_falls_back_to_the_daemons(tmp_path):
    # 22.05's scontrol dies without a readable slurm.conf: the daemons' -V still tell the version
    import os

    from autoheal.slurm.cli_backend import CliSlurm

    for name, body in (("scontrol", "echo 'no slurm.conf' >&2; exit 1"), ("slurmctld", "echo 'slurm 23.02.7'")):
        p = tmp_path / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        os.chmod(p, 0o755)
    v = CliSlurm(bin_dir=str(tmp_path), retries=0).installed_version()
    assert (v.major, v.minor, v.patch) == (23, 2, 7)
    (tmp_path / "slurmctld").write_text("#!/bin/sh\nexit 3\n")
    (tmp_path / "slurmd").write_text("#!/bin/sh\nexit 3\n")
    os.chmod(tmp_path / "slurmd", 0o755)
    from autoheal.errors import SlurmError

    with pytest.raises(SlurmError, match="cannot detect the Slurm version: scontrol .*slurmctld .*slurmd"):
        CliSlurm(bin_dir=str(tmp_path), retries=0).installed_version()
