"""Parsing Slurm output: 22.05, 24.11 and 26.05 JSON, one-liners, show config, node states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoheal.errors import SlurmParseError
from autoheal.slurm import parse
from autoheal.slurm.model import Node, SlurmVersion, parse_state

FIX = Path(__file__).resolve().parents[1] / "fixtures"
F2205 = FIX / "slurm-22.05"
F2411 = FIX / "slurm-24.11"
F2605 = FIX / "slurm-26.05"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ---- parse_state ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, base, flags", [
    ("IDLE+DRAIN", "IDLE", {"DRAIN"}),
    ("MIXED+DRAIN", "MIXED", {"DRAIN"}),
    ("DOWN*", "DOWN", {"NOT_RESPONDING"}),
    ("DOWN*+DRAIN", "DOWN", {"NOT_RESPONDING", "DRAIN"}),
    ("ALLOCATED+COMPLETING", "ALLOCATED", {"COMPLETING"}),
    ("IDLE+NOT_RESPONDING", "IDLE", {"NOT_RESPONDING"}),
    ("drained", "IDLE", {"DRAIN"}),
    ("draining", "ALLOCATED", {"DRAIN"}),
    ("drained*", "IDLE", {"DRAIN", "NOT_RESPONDING"}),
    ("idle~", "IDLE", {"POWERED_DOWN"}),
    ("mixed-", "MIXED", {"PLANNED"}),
    ("UNKNOWN+DRAIN+NOT_RESPONDING", "UNKNOWN", {"DRAIN", "NOT_RESPONDING"}),
    ("IDLE+DRAIN+REBOOT_REQUESTED", "IDLE", {"DRAIN", "REBOOT_REQUESTED"}),
    ("DOWN+REBOOT_ISSUED", "DOWN", {"REBOOT_ISSUED"}),
    ("mixed@", "MIXED", {"REBOOT_REQUESTED"}),
    ("down^", "DOWN", {"REBOOT_ISSUED"}),
    ("IDLE+REBOOT", "IDLE", {"REBOOT_REQUESTED"}),
    ("idle+drain", "IDLE", {"DRAIN"}),
    ("alloc", "ALLOCATED", set()),
    ("mix", "MIXED", set()),
    ("drng", "ALLOCATED", {"DRAIN"}),
    ("IDLE,DRAIN", "IDLE", {"DRAIN"}),
    ("", "UNKNOWN", set()),
    ("IDLE+FANCY_NEW_FLAG", "IDLE", {"FANCY_NEW_FLAG"}),
])
def test_parse_state_table(text, base, flags):
    assert parse_state(text) == (base, frozenset(flags))


def test_parse_state_extra_flags_2205_layout():
    assert parse_state("idle", ["DRAIN"]) == ("IDLE", frozenset({"DRAIN"}))
    assert parse_state("down", ["DRAIN", "NOT_RESPONDING"]) == ("DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}))


@pytest.mark.parametrize("text, drain, drained, down, responding", [
    ("IDLE+DRAIN", True, True, False, True),
    ("MIXED+DRAIN", True, False, False, True),
    ("DOWN*+DRAIN", True, True, True, False),
    ("IDLE+DRAIN+COMPLETING", True, False, False, True),
    ("IDLE", False, False, False, True),
    ("IDLE+FAIL", False, False, True, True),
])
def test_node_properties(text, drain, drained, down, responding):
    base, flags = parse_state(text)
    node = Node("n1", base, flags)
    assert (node.drain, node.drained, node.down, node.responding) == (drain, drained, down, responding)


def test_node_state_text_and_gpu_count():
    node = Node("n1", "IDLE", frozenset({"NOT_RESPONDING", "DRAIN"}), gres="gpu:h100:8(S:0-1),nic:2")
    assert node.state_text == "IDLE+DRAIN+NOT_RESPONDING"
    assert node.gpu_count == 8
    assert Node("n", "IDLE", gres="").gpu_count == 0
    assert Node("n", "IDLE", gres="nic:2").gpu_count == 0
    assert Node("n", "IDLE", gres="gpu:4").gpu_count == 4


# ---- 22.05 fixtures --------------------------------------------------------------------------------------

def test_2205_sinfo_json():
    nodes = parse.nodes_from_json(_read(F2205 / "sinfo.json"), "sinfo --json")
    by = {n.name: n for n in nodes}
    assert list(by) == ["gpu1", "gpu2", "gpu3", "spare1"]
    assert by["gpu1"].state == "MIXED" and by["gpu1"].flags == frozenset()
    assert by["gpu2"].state == "IDLE" and by["gpu2"].flags == frozenset({"DRAIN"})
    assert by["gpu2"].drained
    assert by["gpu2"].reason == 'autoheal: test "x" $y'
    assert by["gpu2"].reason_user == "root"
    assert by["gpu2"].reason_time == 1796026746
    assert by["gpu1"].reason_user == ""  # null in JSON
    assert by["spare1"].state == "UNKNOWN" and by["spare1"].drain
    assert by["spare1"].reason.startswith("autoheal: spare pool")
    assert all(n.gpu_count == 8 for n in nodes)
    assert by["gpu1"].partitions == ("gpu",)
    assert by["gpu1"].cpus == 2


def test_2205_squeue_json():
    jobs = parse.jobs_from_json(_read(F2205 / "squeue.json"), "squeue --json")
    assert len(jobs) == 1
    job = jobs[0]
    assert job.job_id == "1" and job.raw_id == "1"
    assert job.state == "RUNNING" and job.running
    assert job.nodes == ("gpu1", "gpu3")
    assert job.name == "wrap" and job.user == "root" and job.comment == "hello"
    assert job.batch_host == "gpu1"
    assert job.requeue is True and job.restart_count == 0
    assert job.eligible_time == 1796026753  # a plain number in v0.0.38
    assert job.end_time == 1827562753
    assert job.array_job_id is None and job.array_task_id is None
    assert job.excluded_nodes == ()


def test_2205_show_node_oneliners():
    nodes = parse.nodes_from_oneliners(_read(F2205 / "show_node_oneliner.txt"))
    by = {n.name: n for n in nodes}
    assert list(by) == ["gpu1", "gpu2", "gpu3", "spare1"]
    assert by["gpu2"].state == "IDLE" and by["gpu2"].flags == frozenset({"DRAIN"})
    assert by["gpu2"].reason == 'autoheal: test "x" $y'  # [root@...] suffix removed
    assert by["gpu2"].reason_user == "root"
    assert by["spare1"].state == "UNKNOWN" and by["spare1"].drain
    assert by["spare1"].reason == "autoheal: spare pool: held out of service until a replacement is requested"
    assert by["gpu1"].reason == ""
    assert by["gpu1"].gres == "gpu:8" and by["gpu1"].gpu_count == 8
    assert by["gpu1"].partitions == ("gpu",)
    assert by["gpu1"].cpus == 2


def test_2205_oneliner_keeps_values_with_spaces():
    line = _read(F2205 / "show_node_oneliner.txt").splitlines()[0]
    fields = parse.parse_oneliner(line)
    assert fields["OS"] == "Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0"
    assert fields["CfgTRES"] == "cpu=2,mem=1000M,billing=2"
    assert fields["AvailableFeatures"] == "(null)"
    assert fields["State"] == "MIXED"


def test_2205_show_config():
    conf = parse.parse_show_config(_read(F2205 / "show_config.txt"))
    assert conf["KillWait"] == "30 sec"
    assert conf["ClusterName"] == "autoheal-lab"
    assert conf["SlurmctldTimeout"] == "120 sec"
    assert conf["HealthCheckProgram"] == "(null)"
    assert conf["SLURM_VERSION"] == "22.05.8"
    assert conf["InteractiveStepOptions"] == "--interactive --preserve-env --pty $SHELL"
    assert conf["AuthInfo"] == "socket=/var/lib/autoheal-lab/munge/munge.socket.2"


def test_2205_show_config_stops_at_first_blank_line():
    text = _read(F2205 / "show_config.txt")
    conf = parse.parse_show_config(text)
    first_section = text.split("\n\n", 1)[0].splitlines()[1:]
    plain = [ln for ln in first_section if "=" in ln]
    assert len(conf) == len(plain)
    assert "Slurmctld(primary) at vm is UP" not in " ".join(conf.values())


def test_2205_show_config_keeps_indexed_keys():
    conf = parse.parse_show_config(_read(F2205 / "show_config.txt"))
    assert conf.get("SlurmctldHost[0]") == "vm(localhost)"


def test_2205_version():
    v = SlurmVersion.parse(_read(F2205 / "version.txt"))
    assert (v.major, v.minor, v.patch) == (22, 5, 8)
    assert v.at_least(22, 5) and not v.at_least(23, 2)
    assert str(v) == "22.05.8"


# ---- 24.11 fixtures (data_parser v0.0.42) -----------------------------------------------------------------

def test_2411_scontrol_json_show_node():
    nodes = parse.nodes_from_json(_read(F2411 / "scontrol_show_node.json"), "scontrol --json show node")
    by = {n.name: n for n in nodes}
    assert list(by) == ["node001", "node003", "node005", "node009"]
    n1 = by["node001"]
    assert n1.state == "DOWN" and n1.flags == frozenset({"DRAIN", "NOT_RESPONDING"})
    assert n1.down and n1.drain and not n1.responding
    assert n1.reason.startswith("TRIX-DRAINER: ")
    assert n1.reason_user == "root"
    assert n1.reason_time == 1762771892  # {"set": true, "number": N}
    assert n1.cpus == 2
    assert n1.partitions == ("defq", "compute-group")
    assert by["node003"].state == "IDLE" and by["node003"].flags == frozenset()
    assert by["node005"].state == "IDLE" and by["node005"].flags == frozenset({"DRAIN"})
    assert by["node005"].drained and by["node005"].reason == ""
    assert by["node009"].state == "DOWN" and by["node009"].flags == frozenset({"NOT_RESPONDING"})
    assert by["node009"].reason == "Not responding" and by["node009"].reason_user == "slurm"
    assert all(n.gpu_count == 0 for n in nodes)


def test_v0041_job_layout():
    jobs = parse.jobs_from_json(_read(F2411 / "jobs_v0.0.41.json"), "squeue --json")
    assert len(jobs) == 1
    job = jobs[0]
    assert job.job_id == "333" and job.raw_id == "333"
    assert job.state == "COMPLETED" and not job.running
    assert job.nodes == ("node1",)
    assert job.end_time == 1746693312
    assert job.batch_host == "hostname1"
    assert job.user == "qc-rest" and job.name == "REX REST JOB"
    assert job.array_job_id is None and job.array_task_id is None  # array_task_id "set": false


def _v42_job(**over):
    job = json.loads(_read(F2411 / "jobs_v0.0.41.json"))["jobs"][0]
    job.update(over)
    return job


def test_v042_array_task_and_running_state():
    num = lambda n, s=True: {"set": s, "infinite": False, "number": n}  # noqa: E731
    job = _v42_job(job_id=130, array_job_id=num(123), array_task_id=num(4), job_state=["RUNNING", "REQUEUED"],
                   nodes="gpu[1-2]", end_time=num(0, False), restart_cnt=2, excluded_nodes="gpu[7,9]")
    parsed = parse.job_from_json(job)
    assert parsed.job_id == "123_4" and parsed.raw_id == "130"
    assert parsed.array_job_id == "123" and parsed.array_task_id == "4"
    assert parsed.state == "RUNNING"
    assert parsed.nodes == ("gpu1", "gpu2")
    assert parsed.excluded_nodes == ("gpu7", "gpu9")
    assert parsed.end_time is None
    assert parsed.restart_count == 2


def test_array_task_zero_keeps_index():
    job = parse.job_from_json({"job_id": 50, "array_job_id": 50, "array_task_id": 0, "job_state": "PENDING"})
    assert job.job_id == "50_0"


def test_infinite_number_is_none():
    job = _v42_job(end_time={"set": True, "infinite": True, "number": 0})
    assert parse.job_from_json(job).end_time is None


# ---- 24.11.5 recorded on the lab (Debian 13, data_parser v0.0.42) -------------------------------------------

def test_2411_lab_scontrol_json_show_node():
    nodes = parse.nodes_from_json(_read(F2411 / "lab_scontrol_show_node.json"), "scontrol --json show node")
    by = {n.name: n for n in nodes}
    assert list(by) == ["gpu1", "gpu2", "gpu3", "spare1"]
    assert by["gpu1"].state == "MIXED" and by["gpu1"].flags == frozenset() and by["gpu1"].reason == ""
    assert by["gpu2"].state == "IDLE" and not by["gpu2"].drain
    gpu3 = by["gpu3"]
    assert gpu3.state == "IDLE" and gpu3.flags == frozenset({"DRAIN"}) and gpu3.drained
    assert gpu3.reason == "autoheal: xid 79 gpu 3 (0000:5d:00.0): fallen off the bus"
    assert gpu3.reason_user == "root" and gpu3.reason_time == 1796031116
    spare = by["spare1"]
    assert spare.state == "UNKNOWN" and spare.flags == frozenset({"DRAIN", "NOT_RESPONDING"})
    assert spare.reason.startswith("autoheal: spare pool")
    assert all(n.gpu_count == 8 and n.gres == "gpu:8" for n in nodes)
    assert all(n.partitions == ("gpu",) and n.cpus == 2 for n in nodes)


def test_2411_lab_squeue_json_running_and_held_job():
    jobs = parse.jobs_from_json(_read(F2411 / "lab_squeue.json"), "squeue --json")
    by = {j.job_id: j for j in jobs}
    assert sorted(by) == ["1", "2"]
    run = by["1"]
    assert run.state == "RUNNING" and run.running
    assert run.nodes == ("gpu1",) and run.batch_host == "gpu1"
    assert run.user == "root" and run.name == "j.sh" and run.comment == ""
    assert run.requeue is True and run.restart_count == 0
    assert run.end_time == 1827567110
    assert run.eligible_time == 1796031109  # {"set", "infinite", "number"} from 23.02 on
    assert run.array_job_id is None and run.array_task_id is None  # array_job_id 0, array_task_id unset
    held = by["2"]
    assert held.state == "PENDING" and held.nodes == () and held.state_reason == "JobHeldUser"
    assert held.eligible_time is None  # held: number 0, not a time
    assert held.comment == "autoheal-runner restarts=0" and held.name == "held-job"
    assert held.excluded_nodes == ()


def test_2411_lab_show_node_oneliners_match_json():
    lines = parse.nodes_from_oneliners(_read(F2411 / "lab_show_node_oneliner.txt"))
    json_nodes = parse.nodes_from_json(_read(F2411 / "lab_scontrol_show_node.json"), "scontrol --json show node")
    assert [(n.name, n.state, n.flags, n.reason, n.gres, n.partitions, n.cpus) for n in lines] == \
        [(n.name, n.state, n.flags, n.reason, n.gres, n.partitions, n.cpus) for n in json_nodes]
    by = {n.name: n for n in lines}
    assert by["gpu3"].reason_user == "root"  # [root@2026-...] suffix split off
    assert by["spare1"].reason_user == ""  # reason from slurm.conf: no suffix


def test_2411_lab_sinfo_json_is_not_a_node_list():
    # 23.02+ sinfo --json lists node groups under "sinfo"; the adapter reads `scontrol --json show node`
    # there, and must never take this layout for "no nodes"
    with pytest.raises(SlurmParseError, match="no 'nodes' list.*sinfo"):
        parse.nodes_from_json(_read(F2411 / "lab_sinfo.json"), "sinfo --json")


def test_2411_lab_version():
    v = SlurmVersion.parse(_read(F2411 / "lab_version.txt"))
    assert (v.major, v.minor, v.patch) == (24, 11, 5)
    assert v.at_least(23, 2)


def test_2411_show_config_indexed_prolog_epilog():
    conf = parse.parse_show_config(_read(FIX / "slurm-conf" / "show_config-24.11.5.txt"))
    assert conf["SLURM_VERSION"] == "24.11.5"
    # 24.11 prints Prolog[0]/Epilog[0]: also readable under the slurm.conf key
    assert conf["Prolog[0]"] == conf["Prolog"] == "/var/lib/autoheal-lab/hooks/prolog.sh"
    assert conf["Epilog"] == "/var/lib/autoheal-lab/hooks/epilog.sh"
    assert conf["AuthInfo"] == "socket=/var/lib/autoheal-lab/munge/munge.socket.2,cred_expire=10"
    assert conf["KillWait"] == "120 sec" and conf["MaxBatchRequeue"] == "10"
    assert conf["PreemptParameters"] == "send_user_signal"
    assert "SlurmctldHost" not in conf and conf["SlurmctldHost[0]"] == "vm(localhost)"


def test_show_config_program_lists_joined_in_index_order():
    text = ("Configuration data as of 2026-01-01T00:00:00\nEpilog[1] = /b\nEpilog[0] = /a\n"
            "Prolog[0] = (null)\nKillWait = 30 sec\n")
    conf = parse.parse_show_config(text)
    assert conf["Epilog"] == "/a,/b"
    assert conf["Prolog"] == "(null)"


# ---- errors -------------------------------------------------------------------------------------------------

def test_garbage_json_names_tool_and_shows_start():
    with pytest.raises(SlurmParseError) as err:
        parse.nodes_from_json("slurm_load_node error: Unable to contact slurm controller", "sinfo --json")
    msg = str(err.value)
    assert msg.startswith("sinfo --json: not valid JSON")
    assert "slurm_load_node error" in msg


def test_truncated_fixture_is_parse_error():
    text = _read(F2411 / "scontrol_show_node.json")
    with pytest.raises(SlurmParseError, match=r"^scontrol --json show node: not valid JSON"):
        parse.nodes_from_json(text[: len(text) // 2], "scontrol --json show node")


def test_truncated_squeue_is_parse_error():
    text = _read(F2205 / "squeue.json")
    with pytest.raises(SlurmParseError, match=r"^squeue --json: not valid JSON"):
        parse.jobs_from_json(text[: len(text) // 2], "squeue --json")


def test_empty_output_is_parse_error_not_empty_list():
    with pytest.raises(SlurmParseError, match="squeue --json"):
        parse.jobs_from_json("", "squeue --json")


def test_json_array_is_parse_error():
    with pytest.raises(SlurmParseError, match="sinfo --json: expected a JSON object, got list"):
        parse.nodes_from_json("[]", "sinfo --json")


def test_json_without_nodes_names_keys():
    with pytest.raises(SlurmParseError) as err:
        parse.nodes_from_json(json.dumps({"meta": {}, "errors": [], "jobs": []}), "scontrol --json show node")
    msg = str(err.value)
    assert msg.startswith("scontrol --json show node: JSON has no 'nodes' list")
    assert "errors, jobs, meta" in msg


def test_json_without_jobs():
    with pytest.raises(SlurmParseError, match="squeue --json: JSON has no 'jobs' list"):
        parse.jobs_from_json(json.dumps({"nodes": []}), "squeue --json")


def test_empty_nodes_list_is_fine():
    assert parse.nodes_from_json(json.dumps({"nodes": [], "errors": []}), "x") == []


def test_errors_list_reported():
    data = json.loads(_read(F2411 / "scontrol_show_node.json"))
    data["errors"] = [{"description": "Unable to query nodes", "error_number": 1007,
                       "error": "Protocol authentication error", "source": "slurm_load_node"}]
    with pytest.raises(SlurmParseError) as err:
        parse.nodes_from_json(json.dumps(data), "scontrol --json show node")
    assert str(err.value) == ("scontrol --json show node: Slurm reported an error: "
                              "Protocol authentication error")


def test_errors_list_of_strings():
    with pytest.raises(SlurmParseError, match="squeue --json: Slurm reported an error: boom"):
        parse.jobs_from_json(json.dumps({"jobs": [], "errors": ["boom"]}), "squeue --json")


def test_warnings_do_not_fail():
    data = {"nodes": [{"name": "n1", "state": ["IDLE"]}], "warnings": [{"description": "w"}], "errors": []}
    assert [n.name for n in parse.nodes_from_json(json.dumps(data), "x")] == ["n1"]


@pytest.mark.parametrize("entry", [{"state": ["IDLE"]}, {"name": "", "state": ["IDLE"]}, "gpu1", None])
def test_node_without_name(entry):
    with pytest.raises(SlurmParseError, match="node JSON without a name"):
        parse.nodes_from_json(json.dumps({"nodes": [entry]}), "sinfo --json")


@pytest.mark.parametrize("entry", [{"job_state": "RUNNING"}, {"job_id": {"set": False, "number": 0}}, 7])
def test_job_without_id(entry):
    with pytest.raises(SlurmParseError, match="job JSON without a job_id"):
        parse.jobs_from_json(json.dumps({"jobs": [entry]}), "squeue --json")


# ---- one-liners -----------------------------------------------------------------------------------------

def test_oneliner_reason_with_equals_spaces_quotes_and_comment_after():
    line = ('NodeName=gpu7 Arch=x86_64 CPUTot=64 Gres=gpu:h100:8(S:0-1) State=MIXED+DRAIN '
            'Partitions=gpu,debug '
            'Reason=autoheal: xid=79 gpu=3 "fell off" the bus [root@2026-01-02T03:04:05] '
            'Comment=rack 12 slot=4')
    fields = parse.parse_oneliner(line)
    assert fields["Reason"] == 'autoheal: xid=79 gpu=3 "fell off" the bus [root@2026-01-02T03:04:05]'
    assert fields["Comment"] == "rack 12 slot=4"
    node = parse.node_from_oneliner(line)
    assert node.reason == 'autoheal: xid=79 gpu=3 "fell off" the bus'
    assert node.reason_user == "root"
    assert node.state == "MIXED" and node.flags == frozenset({"DRAIN"})
    assert node.gpu_count == 8
    assert node.partitions == ("gpu", "debug")
    assert node.cpus == 64


def test_oneliner_extra_after_reason():
    fields = parse.parse_oneliner("NodeName=n1 State=IDLE Reason=maint x=y Extra=foo bar")
    assert fields["Reason"] == "maint x=y"
    assert fields["Extra"] == "foo bar"


def test_oneliner_null_values():
    node = parse.node_from_oneliner("NodeName=n1 CPUTot=N/A Gres=(null) Partitions=(null) State=IDLE")
    assert node.gres == "" and node.partitions == () and node.cpus == 0


def test_oneliner_without_nodename():
    with pytest.raises(SlurmParseError, match="scontrol node line without NodeName"):
        parse.node_from_oneliner("slurm_load_node error: Socket timed out on send/recv operation")


def test_no_nodes_in_system():
    assert parse.nodes_from_oneliners("No nodes in the system\n") == []
    assert parse.nodes_from_oneliners("") == []


# ---- show config errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "garbage\nmore garbage", "slurm_load_ctl_conf error: Unable to contact"])
def test_show_config_garbage(text):
    with pytest.raises(SlurmParseError, match="scontrol show config: unexpected first line"):
        parse.parse_show_config(text)


def test_show_config_header_only():
    with pytest.raises(SlurmParseError, match="no Key = value lines"):
        parse.parse_show_config("Configuration data as of 2026-01-01T00:00:00\n\n")


def test_version_garbage():
    with pytest.raises(SlurmParseError, match="cannot read a Slurm version"):
        SlurmVersion.parse("command not found")
    assert SlurmVersion.parse("slurm 24.11.5").at_least(24, 11)


def test_dead_controller_json_is_unavailable_not_parse_error():
    # 22.05 `sinfo --json` / `squeue --json` with slurmctld dead: exit 0, errno -1, empty lists (observed)
    from autoheal.errors import SlurmUnavailable

    dead_sinfo = json.dumps({"meta": {}, "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []})
    dead_squeue = json.dumps({"meta": {}, "errors": [{"description": "Failed while looking for jobs",
                                                      "error_number": -1, "error": "Unspecified error"}],
                              "jobs": []})
    with pytest.raises(SlurmUnavailable):
        parse.nodes_from_json(dead_sinfo, "sinfo --json")
    with pytest.raises(SlurmUnavailable):
        parse.jobs_from_json(dead_squeue, "squeue --json")
    refused = json.dumps({"errors": [{"error": "Invalid node name specified", "error_number": 2018}], "nodes": []})
    with pytest.raises(SlurmParseError):
        parse.nodes_from_json(refused, "sinfo --json")


def test_held_job_fields_from_both_layouts():
    old = json.dumps({"jobs": [{"job_id": 4, "job_state": "PENDING", "priority": 0, "state_reason": "JobHeldUser",
                                "state_description": "job requeued in held state"}]})
    new = json.dumps({"jobs": [{"job_id": 4, "job_state": ["PENDING"], "priority": {"set": True, "number": 0},
                                "state_reason": "JobHeldAdmin", "state_description": "job requeued in held state"}]})
    a, b = parse.jobs_from_json(old)[0], parse.jobs_from_json(new)[0]
    assert a.held and a.requeue_held
    assert b.held and not b.requeue_held  # an admin held it again: not ours any more


# ---- 26.05.5 recorded on the lab (Debian forky, data_parser v0.0.45) ------------------------------------------

def test_2605_lab_scontrol_json_show_node():
    text = _read(F2605 / "lab_scontrol_show_node.json")
    assert "data_parser/v0.0.45" in text.replace("\\/", "/")
    by = {n.name: n for n in parse.nodes_from_json(text, "scontrol --json show node")}
    assert list(by) == ["gpu1", "gpu2", "gpu3", "spare1"]
    assert by["gpu1"].state == "MIXED" and by["gpu1"].flags == frozenset() and by["gpu1"].reason == ""
    gpu3 = by["gpu3"]
    assert gpu3.state == "IDLE" and gpu3.flags == frozenset({"DRAIN"}) and gpu3.drained
    assert gpu3.reason == "autoheal: xid 79 on GPU 3 of gpu3 (0000:5d:00.0): fallen off the bus"
    assert gpu3.reason_user == "root" and gpu3.reason_time and gpu3.reason_time > 1_700_000_000
    spare = by["spare1"]
    assert spare.state == "UNKNOWN" and spare.drain and spare.reason.startswith("autoheal: spare")
    assert all(n.gpu_count == 8 and n.gres == "gpu:8" and n.cpus == 2 for n in by.values())


def test_2605_lab_squeue_json_running_and_held_job():
    jobs = parse.jobs_from_json(_read(F2605 / "lab_squeue.json"), "squeue --json")
    by = {j.job_id: j for j in jobs}
    assert sorted(by) == ["1", "2"]
    run = by["1"]
    assert run.state == "RUNNING" and run.nodes == ("gpu1",) and run.batch_host == "gpu1"
    assert run.requeue is True and run.restart_count == 0 and run.user == "root"
    assert run.array_job_id is None and run.array_task_id is None
    held = by["2"]
    assert held.state == "PENDING" and held.state_reason == "JobHeldUser" and held.held
    assert held.priority == 0 and not held.requeue_held  # a user hold, not requeuehold's
    assert held.comment == "autoheal: held for the fixture"


def test_2605_lab_show_node_oneliners_match_json():
    lines = parse.nodes_from_oneliners(_read(F2605 / "lab_show_node_oneliner.txt"))
    json_nodes = parse.nodes_from_json(_read(F2605 / "lab_scontrol_show_node.json"), "scontrol --json show node")
    assert [(n.name, n.state, n.flags, n.reason, n.gres, n.partitions, n.cpus) for n in lines] == \
        [(n.name, n.state, n.flags, n.reason, n.gres, n.partitions, n.cpus) for n in json_nodes]


def test_2605_lab_sinfo_json_is_not_a_node_list_and_gpus_of_a_job():
    with pytest.raises(SlurmParseError, match="no 'nodes' list.*sinfo"):
        parse.nodes_from_json(_read(F2605 / "lab_sinfo.json"), "sinfo --json")
    detail = _read(F2605 / "lab_show_job_detail.txt")
    assert parse.job_gpus_from_show_job(detail, "gpu1") == [0, 1]
    assert parse.job_gpus_from_show_job(detail, "gpu2") == []


def test_2605_lab_version_and_show_config():
    v = SlurmVersion.parse(_read(F2605 / "lab_version.txt"))
    assert (v.major, v.minor, v.patch) == (26, 5, 5) and v.at_least(25, 11)
    conf = parse.parse_show_config(_read(FIX / "slurm-conf" / "show_config-26.05.5.txt"))
    assert conf["SLURM_VERSION"] == "26.05.5"
    assert conf["Prolog[0]"] == conf["Prolog"] == "/var/lib/autoheal-lab/hooks/prolog.sh"
    assert conf["Epilog"] == "/var/lib/autoheal-lab/hooks/epilog.sh"
    assert conf["HealthCheckTimeout"] == "0 sec"  # unset: printed as 0, Slurm uses 60
    assert conf["SlurmctldParameters"] == "enable_expedited_requeue"


def test_oneliner_reason_time_is_read_as_the_json_gives_it(monkeypatch):
    """The text listing's ``[user@TIME]`` suffix carries the reason's time (slurmctld's local time): read
    it, as the JSON's reason_changed_at is (it was split off and dropped, so 22.05's text path had none)."""
    import time as _time

    monkeypatch.setenv("TZ", "UTC")
    _time.tzset()
    try:
        line = ("NodeName=gpu2 State=MIXED+DRAIN Reason=autoheal: xid 79 on GPU 0 of gpu2 [root@2026-12-03T08:40:01]")
        node = parse.nodes_from_oneliners(line)[0]
        assert node.reason == "autoheal: xid 79 on GPU 0 of gpu2" and node.reason_user == "root"
        assert node.reason_time == 1796287201  # 2026-12-03T08:40:01Z
        odd = parse.nodes_from_oneliners("NodeName=gpu2 State=IDLE Reason=maint [root@Unknown]")[0]
        assert odd.reason == "maint" and odd.reason_time is None
    finally:
        monkeypatch.delenv("TZ")
        _time.tzset()
