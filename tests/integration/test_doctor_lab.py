"""`autoheal doctor` against real lab clusters: Slurm defaults fail the checks, the fragment passes them.

The session ``plain_lab`` runs with the fragment from ``autoheal.slurm_conf.fragment.lab_fragment``
(it starting at all proves slurmctld accepts the fragment on the installed Slurm).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from autoheal.slurm_conf.fragment import LAB_OWNED_KEYS
from autoheal.slurm_conf.recommendations import for_version, version_tuple


def run_doctor(handle, *args, extra_env=None):
    env = dict(handle.env)
    env.update(extra_env or {})
    res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "doctor", "--json", *args],
                         env=env, capture_output=True, text=True, timeout=120)
    try:
        data = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"doctor printed no JSON (rc {res.returncode}): {res.stdout} {res.stderr}") from None
    return res.returncode, data, {f["id"]: f for f in data.get("findings", [])}


def test_doctor_on_slurm_defaults_reports_the_failures(lab_factory):
    handle = lab_factory(slurm_defaults=True, hooks=False, xid_watch=False)
    conf_before = handle.layout.slurm_conf.stat().st_mtime_ns
    journal = Path(handle.config().journal.path)
    journal_before = journal.stat().st_size if journal.exists() else None
    code, data, f = run_doctor(handle, extra_env=handle.lab.node_env(handle.layout.nodes[0]))
    assert code == 1, data
    assert data["slurm_version"].startswith(tuple(f"{v}" for v in ("22.", "23.", "24.", "25.", "26.")))
    for rid in ("kill_wait", "requeue_delay", "prolog_flags_alloc", "nohold_on_prolog_fail",
                "healthcheck_program", "prolog"):
        assert f[rid]["status"] == "fail", f[rid]
    assert f["requeue_delay"]["effect"] == "requeued jobs wait 121 s before they can start again"
    assert f["kill_wait"]["current"].startswith("30")
    assert f["autoheal_config"]["status"] == "ok"
    assert f["journal"]["status"] == "ok"
    assert "nvml" in f
    # doctor changed nothing
    assert handle.layout.slurm_conf.stat().st_mtime_ns == conf_before
    assert (journal.stat().st_size if journal.exists() else None) == journal_before
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=handle.env, capture_output=True,
                           text=True, timeout=20).stdout
    assert "drain" not in nodes.split("spare")[0].lower()


def test_doctor_on_fragment_lab_passes_the_fragment_checks(plain_lab):
    code, data, f = run_doctor(plain_lab, "--settings-only")
    version = version_tuple(data["slurm_version"])
    owned = {k.lower() for k in LAB_OWNED_KEYS}
    fragment_ids = {r.id for r in for_version(version) if r.key.lower() not in owned}
    not_ok = {rid: f[rid]["current"] for rid in fragment_ids if f[rid]["status"] != "ok"}
    assert not_ok == {}  # requeue_delay included: the lab merges cred_expire into its AuthInfo
    assert f["gres_types_gpu"]["status"] == "ok"
    assert f["gres_gpu_count"]["status"] == "ok"
    # hooks=False: only the hook settings the lab did not wire may be reported
    problems = {rid for rid, x in f.items() if x["status"] in ("fail", "warn")}
    assert problems <= {"healthcheck_program", "healthcheck_interval", "prolog", "epilog"}
    assert code == (1 if problems & {"healthcheck_program", "prolog"} else 0)


def test_doctor_on_healing_lab_sees_the_wired_hooks(healing_lab):
    # the hooks are in slurm.conf: 24.11 prints them as Prolog[0]/Epilog[0], which must still count
    code, data, f = run_doctor(healing_lab, "--settings-only")
    for rid in ("healthcheck_program", "healthcheck_interval", "prolog", "epilog"):
        assert f[rid]["status"] == "ok", (rid, f[rid])
    assert f["prolog"]["current"].endswith("/hooks/prolog.sh")


def test_doctor_exit_2_when_slurmctld_unreachable(plain_lab, tmp_path):
    conf = tmp_path / "slurm.conf"
    text = plain_lab.layout.slurm_conf.read_text()
    port = plain_lab.layout.ctld_port
    conf.write_text(text.replace(f"SlurmctldPort={port}", "SlurmctldPort=9"))
    cfg = tmp_path / "autoheal.toml"
    cfg.write_text(f"[slurm]\nslurm_conf = \"{conf}\"\ntimeout = 3.0\nretries = 0\n")
    env = dict(plain_lab.env, SLURM_CONF=str(conf), AUTOHEAL_CONFIG=str(cfg))
    res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "doctor"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "autoheal: error:" in res.stderr
