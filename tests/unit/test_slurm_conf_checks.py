"""Every recommendation judged right and wrong, over plain dicts (no Slurm needed)."""

from __future__ import annotations

import pytest

from autoheal.slurm_conf import checks
from autoheal.slurm_conf.doctor import diagnose
from autoheal.slurm_conf.fragment import settings
from autoheal.slurm_conf.recommendations import KNOWN_VERSIONS, for_version, load_all, version_tuple

# id -> a value of its key that is wrong (what sites really have, mostly Slurm's defaults)
WRONG = {
    "healthcheck_program": "(null)",
    "healthcheck_interval": "0 sec",
    "healthcheck_node_state": "IDLE",
    "healthcheck_timeout": "20 sec",
    "prolog": "(null)",
    "epilog": "(null)",
    "prolog_flags_alloc": "Serial",
    "nohold_on_prolog_fail": "bf_continue,bf_max_job_test=500",
    "job_requeue": "0",
    "kill_wait": "30 sec",
    "unkillable_step_timeout": "60 sec",
    "requeue_delay": "socket=/run/munge/munge.socket.2",
    "expedited_requeue": "(null)",
    "preempt_send_user_signal": "(null)",
    "max_batch_requeue": "0",
    "return_to_service": "0",
    "gres_types_gpu": "(null)",
}


def right_conf(version: str) -> dict:
    recs = for_version(version_tuple(version))
    conf = {key: value for key, (value, _g) in settings(recs).items()}
    conf["SLURM_VERSION"] = f"{version}.1"
    return conf


def test_every_recommendation_has_a_wrong_example():
    assert {r.id for r in load_all()} == set(WRONG)


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_fragment_values_pass_every_check(version):
    report = diagnose(right_conf(version))
    bad = [(f.id, f.current) for f in report.findings if f.status != "ok"]
    assert bad == []
    assert report.exit_code(strict=True) == 0


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
@pytest.mark.parametrize("rec_id", sorted(WRONG))
def test_each_wrong_value_is_reported(version, rec_id):
    recs = [r for r in for_version(version_tuple(version)) if r.id == rec_id]
    if not recs:
        pytest.skip(f"{rec_id} does not apply to {version}")
    rec = recs[0]
    conf = right_conf(version)
    conf[rec.key] = WRONG[rec_id]
    finding = {f.id: f for f in diagnose(conf).findings}[rec_id]
    assert finding.status == rec.severity, finding
    assert finding.effect and "{" not in finding.effect
    assert finding.why and finding.recommended
    # only this finding changed
    others = [f for f in diagnose(conf).findings if f.id != rec_id and f.status != "ok"]
    assert others == [] or all(f.what == rec.key for f in others)


def test_requeue_delay_effect_names_the_wait():
    conf = {"SLURM_VERSION": "22.05.8", "AuthInfo": "socket=/x"}
    f = {f.id: f for f in diagnose(conf).findings}["requeue_delay"]
    assert f.status == "fail"
    assert "requeued jobs wait 121 s before they can start again" == f.effect
    conf["AuthInfo"] = "socket=/x,cred_expire=60"
    assert {f.id: f for f in diagnose(conf).findings}["requeue_delay"].effect.startswith("requeued jobs wait 61 s")
    conf["AuthInfo"] = "cred_expire=10,socket=/x"
    assert {f.id: f for f in diagnose(conf).findings}["requeue_delay"].status == "ok"


def test_requeue_delay_from_scheduler_parameters_overrides_cred_expire_on_25_11_and_later():
    # 25.11's slurmctld (job_mgr.c _requeue_delay) takes SchedulerParameters requeue_delay= when present
    # and cred_expire only without it: a long requeue_delay next to the fragment's cred_expire=10 is slow
    conf = {"SLURM_VERSION": "26.05.5", "AuthInfo": "socket=/x,cred_expire=10",
            "SchedulerParameters": "nohold_on_prolog_fail,requeue_delay=300"}
    f = {f.id: f for f in diagnose(conf).findings}["requeue_delay"]
    assert f.status == "fail" and f.what == "SchedulerParameters"
    assert f.effect == "requeued jobs wait 301 s before they can start again"
    assert "requeue_delay=300" in f.current and "overrides AuthInfo cred_expire" in f.current
    # a short requeue_delay makes the default cred_expire (120) harmless
    conf.update(AuthInfo="socket=/x", SchedulerParameters="requeue_delay=5")
    assert {f.id: f for f in diagnose(conf).findings}["requeue_delay"].status == "ok"
    # without requeue_delay, cred_expire decides as before
    conf["SchedulerParameters"] = "nohold_on_prolog_fail"
    f = {f.id: f for f in diagnose(conf).findings}["requeue_delay"]
    assert f.status == "fail" and f.what == "AuthInfo" and f.effect.startswith("requeued jobs wait 121 s")


def test_requeue_delay_is_not_read_before_25_11():
    # 24.11 has no requeue_delay (its slurmctld ignores the item): only cred_expire counts there
    conf = {"SLURM_VERSION": "24.11.5", "AuthInfo": "socket=/x,cred_expire=10",
            "SchedulerParameters": "requeue_delay=300"}
    assert {f.id: f for f in diagnose(conf).findings}["requeue_delay"].status == "ok"
    conf.update(AuthInfo="socket=/x", SchedulerParameters="requeue_delay=5")
    assert {f.id: f for f in diagnose(conf).findings}["requeue_delay"].status == "fail"


def test_absent_keys_mean_slurm_defaults():
    # 25.11 omits Prolog/Epilog when unset; older versions omit MaxBatchRequeue etc.
    f = {f.id: f for f in diagnose({"SLURM_VERSION": "25.11.4"}).findings}
    assert f["prolog"].status == "fail" and "Slurm default" in f["prolog"].current
    assert f["kill_wait"].status == "fail" and f["kill_wait"].effect.startswith("jobs get 30 s")
    assert f["job_requeue"].status == "ok"  # default JobRequeue=1
    assert f["max_batch_requeue"].status == "ok"  # default 5
    assert f["return_to_service"].status == "warn"  # default 0


def test_indexed_prolog_epilog_of_2411_are_judged():
    # Slurm 24.11 prints "Prolog[0] = /path" (no plain "Prolog" line): recorded on Debian 13's 24.11.5
    from pathlib import Path

    from autoheal.slurm.parse import parse_show_config

    text = (Path(__file__).resolve().parents[1] / "fixtures" / "slurm-conf" / "show_config-24.11.5.txt").read_text()
    f = {f.id: f for f in diagnose(parse_show_config(text)).findings}
    assert f["prolog"].status == "ok" and f["epilog"].status == "ok"
    unset = text.replace("Prolog[0]               = /var/lib/autoheal-lab/hooks/prolog.sh",
                         "Prolog[0]               = (null)")
    assert unset != text
    assert {f.id: f for f in diagnose(parse_show_config(unset)).findings}["prolog"].status == "fail"


def test_version_ranges_pick_the_right_spelling():
    old = {f.id: f for f in diagnose({"SLURM_VERSION": "22.05.8"}).findings}
    new = {f.id: f for f in diagnose({"SLURM_VERSION": "24.11.5"}).findings}
    assert old["preempt_send_user_signal"].what == "SlurmctldParameters"
    assert new["preempt_send_user_signal"].what == "PreemptParameters"
    assert "max_batch_requeue" not in old and "max_batch_requeue" in new
    assert "expedited_requeue" not in new
    assert "expedited_requeue" in {f.id for f in diagnose({"SLURM_VERSION": "25.11.0"}).findings}


def test_preempt_signal_fails_only_when_preempting():
    conf = {"SLURM_VERSION": "24.11.5", "PreemptType": "preempt/none"}
    assert {f.id: f for f in diagnose(conf).findings}["preempt_send_user_signal"].status == "warn"
    conf["PreemptType"] = "preempt/qos"
    assert {f.id: f for f in diagnose(conf).findings}["preempt_send_user_signal"].status == "fail"


def test_gres_check_skipped_without_gpus_and_node_counts_compared():
    conf = {"SLURM_VERSION": "22.05.8"}
    f = {f.id: f for f in diagnose(conf, nodes_gpus={"cpu1": 0}).findings}
    assert f["gres_types_gpu"].status == "skip"
    f = {f.id: f for f in diagnose(conf, nodes_gpus={"g1": 8, "g2": 4}, expected_gpus=8).findings}
    assert f["gres_gpu_count"].status == "warn" and "g2=gpu:4" in f["gres_gpu_count"].current
    f = {f.id: f for f in diagnose(conf, nodes_gpus={"g1": 8, "login": 0}, expected_gpus=8).findings}
    assert f["gres_gpu_count"].status == "ok"


def test_exit_code_and_strict():
    ok = checks.Finding("a", "ok", "A")
    warn = checks.Finding("b", "warn", "B")
    fail = checks.Finding("c", "fail", "C")
    skip = checks.Finding("d", "skip", "D")
    assert checks.exit_code([ok, skip]) == 0
    assert checks.exit_code([ok, warn]) == 0
    assert checks.exit_code([ok, warn], strict=True) == 1
    assert checks.exit_code([fail]) == 1


def test_missing_or_bad_version_is_a_parse_error():
    from autoheal.errors import SlurmParseError

    with pytest.raises(SlurmParseError, match="SLURM_VERSION"):
        diagnose({"KillWait": "30 sec"})
    with pytest.raises(SlurmParseError, match="unreadable"):
        diagnose({"SLURM_VERSION": "banana"})


def test_healthcheck_timeout_is_judged_from_26_05_only():
    """26.05 made HealthCheckTimeout configurable: a short one kills the healthcheck mid-pass. Older
    versions have no such key (a fixed 60 s): nothing to judge there."""
    conf = right_conf("26.05")
    conf["HealthCheckTimeout"] = "20 sec"
    f = {f.id: f for f in diagnose(conf).findings}["healthcheck_timeout"]
    assert f.status == "warn" and "killed after 20 s" in f.effect
    del conf["HealthCheckTimeout"]  # Slurm's default, 60: passes
    assert {f.id: f for f in diagnose(conf).findings}["healthcheck_timeout"].status == "ok"
    conf["HealthCheckTimeout"] = "0 sec"  # what 26.05.5 prints when it is not set (recorded): the default
    assert {f.id: f for f in diagnose(conf).findings}["healthcheck_timeout"].status == "ok"
    old = right_conf("25.11")
    assert "healthcheck_timeout" not in {f.id for f in diagnose(old).findings}
