"""Hot spares inside the allocation: the pure decisions, the step environment, the srun shim, the
wrapper options and the comment fields (the lab behaviour is in tests/integration/test_hotspare_lab.py)."""

from __future__ import annotations

import subprocess

import pytest

from autoheal.config import parse_config
from autoheal.sbatch_helpers import hotspare as hs
from autoheal.sbatch_helpers import wrapper as w
from autoheal.sbatch_helpers.comment import CommentState

SETS = hs.NodeSets(("g1", "g2"), ("g3",))


def test_initial_sets_put_the_batch_host_first_and_keep_the_rest_as_spares():
    assert hs.initial_sets(["g1", "g2", "g3"], 2, "g2") == hs.NodeSets(("g2", "g1"), ("g3",))
    assert hs.initial_sets(["g1", "g2", "g3"], 2, "") == hs.NodeSets(("g1", "g2"), ("g3",))
    # a requeued job that got fewer nodes than asked: everything active, no spare
    assert hs.initial_sets(["g1", "g2"], 2, "g1") == hs.NodeSets(("g1", "g2"), ())


def test_judge_nothing_swap_drop_and_requeue():
    assert hs.judge(SETS, ["g1", "g2", "g3"], [], "g1").kind == hs.NOTHING
    d = hs.judge(SETS, ["g1", "g2", "g3"], ["g2"], "g1")
    assert (d.kind, d.lost, d.drop, d.swapped_in) == (hs.SWAP, ("g2",), ("g2",), ("g3",))
    assert d.after == hs.NodeSets(("g1", "g3"), ())
    # Slurm removed a dead node itself (--no-kill): lost, nothing left to drop
    d = hs.judge(SETS, ["g1", "g3"], [], "g1")
    assert (d.kind, d.lost, d.drop, d.after) == (hs.SWAP, ("g2",), (), hs.NodeSets(("g1", "g3"), ()))
    d = hs.judge(SETS, ["g1", "g2", "g3"], ["g3"], "g1")
    assert (d.kind, d.drop, d.after) == (hs.DROP_SPARES, ("g3",), hs.NodeSets(("g1", "g2"), ()))
    # spares used up, or the bad node is the batch host: requeue
    assert hs.judge(hs.NodeSets(("g1", "g3"), ()), ["g1", "g3"], ["g3"], "g1").kind == hs.REQUEUE
    assert hs.judge(SETS, ["g1", "g2", "g3"], ["g2", "g3"], "g1").kind == hs.REQUEUE
    assert hs.judge(SETS, ["g1", "g2", "g3"], ["g1"], "g1").kind == hs.REQUEUE


def test_judge_two_lost_two_spares_swaps_both():
    sets = hs.NodeSets(("a", "b", "c"), ("d", "e"))
    d = hs.judge(sets, ["a", "b", "c", "d", "e"], ["b", "c"], "a")
    assert d.kind == hs.SWAP and d.after == hs.NodeSets(("a", "d", "e"), ())


def test_step_env_describes_the_active_nodes_only():
    base = {"SLURM_JOB_NODELIST": "g[1-3]", "SLURM_NODELIST": "g[1-3]", "SLURM_JOB_NUM_NODES": "3",
            "SLURM_NNODES": "3", "SLURM_NTASKS": "6", "SLURM_NPROCS": "6", "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_JOB_CPUS_PER_NODE": "4,2(x2)", "PATH": "/usr/bin"}
    env = hs.step_env(base, SETS, "/tmp/shim", "/usr/bin/srun")
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == env["AUTOHEAL_ACTIVE_NODES"] == "g1,g2"
    assert env["SLURM_JOB_NUM_NODES"] == env["SLURM_NNODES"] == "2"
    assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == "4"
    assert env["SLURM_TASKS_PER_NODE"] == "2(x2)"
    assert "SLURM_JOB_CPUS_PER_NODE" not in env  # not uniform: unset rather than wrong
    assert env["AUTOHEAL_SPARE_NODES"] == "g3" and env["PATH"] == "/tmp/shim:/usr/bin"
    assert env["AUTOHEAL_REAL_SRUN"] == "/usr/bin/srun"
    # --ntasks without --ntasks-per-node: left as the user asked
    env = hs.step_env({"SLURM_NTASKS": "5", "SLURM_TASKS_PER_NODE": "2,2,1"}, SETS)
    assert env["SLURM_NTASKS"] == "5" and "SLURM_TASKS_PER_NODE" not in env and "AUTOHEAL_REAL_SRUN" not in env


def test_srun_shim_excludes_the_current_spares(tmp_path):
    fake = tmp_path / "real-srun"
    fake.write_text("#!/bin/sh\necho \"$@\"\n")
    fake.chmod(0o755)
    shim_dir = tmp_path / "shim"
    hs.write_shim(shim_dir, ["g3", "g4"])
    env = hs.step_env({"PATH": "/usr/bin:/bin"}, hs.NodeSets(("g1",), ("g3", "g4")), str(shim_dir), str(fake))

    def run():
        return subprocess.run(["srun", "-N", "1", "hostname"], env=env, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    assert run() == "--exclude=g3,g4 -N 1 hostname"
    hs.write_spares(shim_dir, [])  # the runner swapped the last spare in
    assert run() == "-N 1 hostname"


def test_comment_keeps_spares_and_swaps():
    st = CommentState(nodes="g1,g3", state="running", spares=hs.comment_spares([]), swaps="1")
    text = st.render()
    assert text == "autoheal-runner nodes=g1,g3 state=running spares=none swaps=1"
    back = CommentState.parse(text)
    assert (back.spares, back.swaps) == ("none", "1")


def plan(text, sbatch_args=(), overrides=None, defaults=None):
    return w.build_plan(w.SubmitRequest(script_path="/x/job.sh", script_text=text, script_args=[],
                                        sbatch_args=list(sbatch_args), cli_overrides=overrides or {},
                                        defaults=defaults or w.WrapperOptions(), python="/py"))


def test_wrapper_asks_for_n_plus_k_nodes_and_no_kill():
    p = plan("#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\n#AUTOHEAL --spare-nodes 1\nsrun x\n")
    assert "--nodes=3" in p.argv and "--no-kill" in p.argv
    assert "--spare-nodes 1 --active-nodes 2" in p.script
    # the command line's -N is replaced (sbatch would take the last one), the user's --no-kill kept once
    p = plan("#!/bin/bash\nsrun x\n", sbatch_args=["-N", "4", "--no-kill"], overrides={"spare_nodes": 2})
    assert p.argv.count("--no-kill") == 1 and "--nodes=6" in p.argv and "4" not in p.argv
    # no --nodes at all: one active node
    assert "--nodes=2" in plan("#!/bin/bash\nsrun x\n", overrides={"spare_nodes": 1}).argv
    # the config default, and 0 on the command line turns it off
    cfg = parse_config("[sbatch]\nspare_nodes = 1\n")
    p = plan("#!/bin/bash\n#SBATCH -N 2\nsrun x\n", defaults=w.defaults_from_config(cfg.sbatch))
    assert "--nodes=3" in p.argv
    p = plan("#!/bin/bash\n#SBATCH -N 2\nsrun x\n", defaults=w.defaults_from_config(cfg.sbatch),
             overrides={"spare_nodes": 0})
    assert not any(a.startswith("--nodes") for a in p.argv) and "--no-kill" not in p.argv
    assert "--spare-nodes" not in p.script


def test_wrapper_refuses_a_node_range_and_warns_on_bare_ntasks():
    with pytest.raises(w.WrapperError, match="fixed node count"):
        plan("#!/bin/bash\n#SBATCH -N 2-4\nsrun x\n", overrides={"spare_nodes": 1})
    with pytest.raises(w.WrapperError, match="between 0 and 64"):
        plan("#!/bin/bash\nsrun x\n", overrides={"spare_nodes": 65})
    p = plan("#!/bin/bash\n#SBATCH -N 2 -n 2\nsrun x\n", overrides={"spare_nodes": 1})
    assert any("--ntasks-per-node" in m for m in p.warnings)


def test_elastic_job_goes_on_with_fewer_nodes_down_to_min_nodes():
    used_up = hs.NodeSets(("g1", "g3"), ())
    d = hs.judge(used_up, ["g1", "g3"], ["g3"], "g1", min_active=1)
    assert (d.kind, d.drop, d.after) == (hs.SHRINK, ("g3",), hs.NodeSets(("g1",), ()))
    assert hs.judge(used_up, ["g1", "g3"], ["g3"], "g1", min_active=2).kind == hs.REQUEUE
    # one spare left for two lost nodes: takes it and goes on with three of four
    d = hs.judge(hs.NodeSets(("a", "b", "c", "d"), ("e",)), list("abcde"), ["b", "c"], "a", min_active=3)
    assert (d.kind, d.after) == (hs.SHRINK, hs.NodeSets(("a", "d", "e"), ()))


def test_wrapper_min_nodes_goes_with_spares_and_within_nodes():
    p = plan("#!/bin/bash\n#SBATCH -N 2\nsrun x\n", overrides={"spare_nodes": 1, "min_nodes": 1})
    assert "--spare-nodes 1 --active-nodes 2 --min-nodes 1" in p.script
    with pytest.raises(w.WrapperError, match="goes with --spare-nodes"):
        plan("#!/bin/bash\n#SBATCH -N 2\nsrun x\n", overrides={"min_nodes": 1})
    with pytest.raises(w.WrapperError, match="between 1 and the job's --nodes"):
        plan("#!/bin/bash\n#SBATCH -N 2\nsrun x\n", overrides={"spare_nodes": 1, "min_nodes": 3})
