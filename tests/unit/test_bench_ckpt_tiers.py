"""bench/bench_ckpt_tiers.py's pure parts: the figures read from a job's output, the phases, the targets
judged met or not, and the rows as printed (and as run_all.py writes them into the docs)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
T0 = 1796651600.0  # the fault's time in the transcripts below


@pytest.fixture(scope="module")
def tiers():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))  # its own import of bench_requeue_resume, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("bench_ckpt_tiers", ROOT / "bench" / "bench_ckpt_tiers.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclass looks its module up while it is defined
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(ROOT / "bench"))
        sys.modules.pop("bench_ckpt_tiers", None)


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _transcript(restart: str = "0", origin0: str = "memory:own-memory@gpu1",
                origin1: str = "memory:peer-memory@gpu1", resumed: int = 51, ended: bool = True) -> tuple:
    """A 2-rank job's output: steps 1..52 (rank 1 on gpu2 reached 51), the fault, the runner ending the
    step, the ranks started again on gpu1 and gpu3 from ``resumed`` and training on. Returns (text, offset)."""
    lines = []
    lines += [f"{r}: autoheal-trainer: start step=0 resumed_from=none restart=0 host=gpu{r + 1} rank={r} world=2 "
              f"steps=100000 reason=none time={T0 - 60:.3f}" for r in (0, 1)]
    for step in range(1, 53):
        for r in (0, 1):
            if r == 1 and step == 52:
                continue
            lines.append(f"{r}: autoheal-trainer: step={step} time={T0 - 53 + step:.3f}")
        lines.append(f"0: autoheal-trainer: memory saved step={step} nodes=gpu1,gpu2 ms={100 + step:.1f} "
                     f"bytes=9470000 time={T0 - 53 + step:.3f}")
    before = "\n".join(lines) + "\n"
    after = ["1: terminate called after throwing an instance of 'c10::Error'",
             "1:   what():  CUDA error: uncorrectable ECC error encountered (GPU 0: XID 48: uncorrectable ECC error)"]
    if ended:
        after.append("autoheal-runner: the job's ranks are hung: no rank progressed for 5.0s after the fault signal "
                     "(limit 5s); last step 52; ending the step now (5.4s after the signal, grace 10s)")
    after += [f"0: autoheal-trainer: device lab gpus=0 time={T0 + 6.9:.3f}",
              f"1: autoheal-trainer: device lab gpus=0 time={T0 + 7.0:.3f}",
              f"1: autoheal-trainer: start step={resumed} resumed_from={origin1} restart={restart} host=gpu3 rank=1 "
              f"world=2 steps=100000 reason=hot-spare-swap time={T0 + 7.1:.3f}",
              f"0: autoheal-trainer: start step={resumed} resumed_from={origin0} restart={restart} host=gpu1 rank=0 "
              f"world=2 steps=100000 reason=hot-spare-swap time={T0 + 7.05:.3f}",
              f"0: autoheal-trainer: step={resumed + 1} time={T0 + 7.3:.3f}",
              f"1: autoheal-trainer: step={resumed + 1} time={T0 + 7.31:.3f}"]
    return before + "\n".join(after) + "\n", len(before)


def test_the_figures_come_from_the_trainers_own_lines_and_clocks(tiers):
    text, offset = _transcript()
    seen = {"ended": (T0 + 5.98, "5.4"), "rank aborted": (T0 + 0.1,)}
    fig = tiers.figures(text, offset, "1", T0, seen, ["gpu2", "gpu1"])
    assert fig["lost_steps"] == 1  # rank 0 had done step 52, the ranks resumed from 51
    assert fig["resumed_step"] == 51
    assert fig["fault_to_resumed_s"] == 7.3  # the restarted run's first step, on the trainer's clock
    assert fig["fault_to_step_ended_s"] == 5.98 and fig["runner_waited_s"] == 5.4
    assert fig["fault_to_node_down_s"] is None
    assert fig["resumed_from"] == "memory:peer-memory@gpu1"  # the victim rank's origin
    assert fig["requeued"] is False
    assert fig["nodes_before"] == ["gpu1", "gpu2"] and fig["nodes_after"] == ["gpu1", "gpu3"]
    assert fig["save_ms_p50"] == 126.5 and fig["save_ms_p95"] == 150.0 and fig["state_mb"] == 9.47


def test_a_requeued_run_from_the_durable_tier_is_told_apart(tiers):
    text, offset = _transcript(restart="1", origin0="/ckpt/ckpt-00000040", origin1="/ckpt/ckpt-00000040",
                               resumed=40)
    fig = tiers.figures(text, offset, "1", T0, {}, ["gpu1", "gpu2"])
    assert fig["requeued"] is True and fig["lost_steps"] == 12
    assert fig["fault_to_step_ended_s"] is None and fig["runner_waited_s"] is None


def test_training_resumed_only_once_both_ranks_stepped_after_the_newest_start(tiers):
    text, offset = _transcript()
    tail = text[offset:]
    assert tiers.resumed_in(tail)
    assert not tiers.resumed_in(tail.rsplit("\n1: autoheal-trainer: step=", 1)[0])  # rank 1 not yet
    assert not tiers.resumed_in(tail.split("\n0: autoheal-trainer: device lab", 1)[0])  # no start yet


def test_the_phases_are_stamped_by_the_evidence_own_clock(tiers):
    text, offset = _transcript()
    journal = [{"event": "drain", "time": T0 + 0.22, "node": "gpu2"},
               {"event": "signal", "time": T0 + 0.54, "job_ids": ["7"]},
               {"event": "signal", "time": T0 + 0.3, "job_ids": ["8"]},  # another job's: not this one's phase
               {"event": "job-hot-swap", "time": T0 + 6.3, "job_id": "7"}]
    seen = {"ended": (T0 + 5.98, "5.4"), "rank aborted": (T0 + 0.1,)}
    got = tiers.phases(text[offset:], journal, "7", T0, seen, T0 + 7.3)
    assert got == {"rank aborted": 0.1, "drain": 0.22, "signal": 0.54, "step ended": 5.98, "swapped": 6.3,
                   "ranks imported": 7.0, "ranks started": 7.1, "first step": 7.3}
    assert list(got) == sorted(got, key=got.get)  # in the order they happened


def _row(fault="xid79", path="hotspare", tier="memory", trainer="tiny", **kw):
    row = {"trainer": trainer, "path": path, "tier": tier, "fault": fault, "K": 1 if tier == "memory" else None,
           "N": 20, "lost_steps": 0, "fault_to_resumed_s": 2.5, "fault_to_step_ended_s": 5.5, "runner_waited_s": 5.1,
           "fault_to_node_down_s": None, "resumed_from": "memory:peer-memory@gpu1", "requeued": False,
           "nodes_before": ["gpu1", "gpu2"], "nodes_after": ["gpu1", "gpu3"], "save_ms_p50": None,
           "save_ms_p95": None, "state_mb": None, "memory_per_node_mb": 0.0, "phases": {"first step": 2.5}}
    row.update(kw)
    return row


def test_the_targets_are_met_only_when_every_case_meets_them(tiers):
    rows = [_row(), _row(fault="nvlink"), _row(fault="node-killed", fault_to_step_ended_s=None, runner_waited_s=None),
            _row(path="requeue", requeued=True, lost_steps=11, resumed_from="/c/ckpt-00000040",
                 nodes_after=["gpu3", "gpu4"], fault_to_resumed_s=25.0),
            _row(tier="durable", lost_steps=10, fault_to_resumed_s=9.0)]
    lost_hot, lost_req, resumed, hang = tiers.check_targets(rows, k=1)
    assert lost_hot.met and lost_hot.cases == 3 and lost_hot.worst == 0
    assert not lost_req.met and lost_req.missed == ["tiny xid79 requeue memory"] and lost_req.worst == 11
    assert resumed.met and resumed.worst == 2.5 and resumed.cases == 3
    assert hang.met and hang.cases == 4 and hang.limit == 15  # the killed node sends no signal: not judged
    printed = tiers.render_targets(rows, [lost_hot, lost_req, resumed, hang])
    assert "memory tier lost steps <= K=1, hot spare: max 0 steps over 3 case(s): met" in printed
    assert "requeue: max 11 steps over 1 case(s): NOT met (1 of 1: tiny xid79 requeue memory)" in printed
    assert "tiny xid79 requeue: gpu1,gpu2 -> gpu3,gpu4: the copies on gpu1,gpu2 out of reach" in printed


def test_a_hang_the_runner_did_not_end_and_a_failed_case_miss_their_targets(tiers):
    rows = [_row(fault="nvlink", fault_to_step_ended_s=None, runner_waited_s=None),
            {"trainer": "torch", "path": "hotspare", "tier": "memory", "fault": "ecc", "K": 1, "N": 20,
             "error": "SystemExit: bench: the job did not resume within 300s", "output": "/tmp/x/out.txt"},
            _row(fault="xid79", fault_to_step_ended_s=16.0)]
    _, _, resumed, hang = tiers.check_targets(rows, k=1)
    assert not hang.met and hang.missed == ["tiny nvlink hotspare memory", "torch ecc hotspare memory",
                                            "tiny xid79 hotspare memory"]
    assert hang.worst == 16.0
    assert not resumed.met and resumed.missed == ["torch ecc hotspare memory"]
    assert "fault->step ended: not ended by the hang detection" in tiers.render_row(rows[0])
    assert "FAILED: SystemExit: bench: the job did not resume" in tiers.render_row(rows[1])
    assert "no case" in tiers.render_targets([], tiers.check_targets([], k=1))


def test_every_fault_kind_is_a_lab_injection(tiers, monkeypatch):
    calls = []
    monkeypatch.setattr(tiers, "inject", lambda lab, node, gpu, kind, **kw: calls.append((node, gpu, kind, kw)))

    class FakeLab:
        def crash_node(self, node):
            calls.append((node, "crash"))

    for fault in tiers.FAULTS:
        tiers.break_gpu_or_node(FakeLab(), fault, "gpu2", 0)
    assert calls == [("gpu2", 0, "xid", {"xid": 79}), ("gpu2", 0, "ecc-dbe", {}), ("gpu2", 0, "nvlink-down", {}),
                     ("gpu2", "crash")]
    with pytest.raises(ValueError):
        tiers.break_gpu_or_node(FakeLab(), "thermal", "gpu2", 0)


def _doc(tiers, rows):
    targets = tiers.check_targets(rows, k=1)
    return json.loads(json.dumps({
        "argv": [], "k": 1, "n": 20, "grace": 10, "torch": "2.15.0", "commit": "abc1234",
        "started": "2026-12-07 14:00:00 UTC", "ended": "2026-12-07 15:00:00 UTC",
        "uptime_start": "14:00:00 up 1 min,  0 user,  load average: 7.59, 5.07, 2.20",
        "uptime_end": "15:00:00 up 61 min,  0 user,  load average: 9.81, 6.61, 3.03",
        "rows": rows, "targets": [dict(t.__dict__, met=t.met) for t in targets]}))


def test_run_all_writes_the_tiers_rows_and_costs_from_the_bench_output(tiers, tmp_path):
    run_all = _run_all()
    rows = [_row(trainer="torch", save_ms_p50=120.0, save_ms_p95=300.0, state_mb=9.47, memory_per_node_mb=37.88,
                 memory_peak_mb=47.35, memory_other_jobs_mb=0.0),
            _row(trainer="torch", fault="ecc", save_ms_p50=200.0, save_ms_p95=350.0, state_mb=9.47,
                 memory_per_node_mb=37.88, lost_steps=1, fault_to_resumed_s=20.1),
            _row(trainer="torch", tier="durable", lost_steps=11, fault_to_resumed_s=19.0)]
    doc = _doc(tiers, rows)
    block = run_all.render_tiers(doc, "2 cores")
    assert block.startswith("`python bench/bench_ckpt_tiers.py` from 2026-12-07 14:00:00 UTC to 2026-12-07 "
                            "15:00:00 UTC on 2 cores, torch 2.15.0; 3 case(s). As printed:\n\n```text\n")
    assert block.endswith("\n```")
    assert tiers.render_row(rows[1]) in block and "3 case(s)" in block
    assert "hot spare + memory tier fault -> resumed <= 3 s: max 20.1 s over 2 case(s): NOT met" in block
    costs = run_all.render_tier_costs(doc)
    assert "9.47 MB; memory per node with K=1 and the default 2 copies" in costs
    assert "median 37.88 MB (37.88 MB over 2 runs); at the peak, with a save in flight: 47.35 MB;" in costs
    assert "other jobs" not in costs
    assert "p50 120-200 ms, p95 300-350 ms over 2 runs" in costs
    assert "K = 4 / 7" in costs  # ceil(0.2 / 0.05), ceil(0.35 / 0.05)
    assert "torch 0-1 vs 11" in costs
    assert "a GPU fault (XID 79, ECC, NVLink): tiny -, torch 2.5-20.1 s; a killed node: tiny -, torch -." in costs
    table = run_all.tiers_rows(doc)
    assert ("checkpoint tiers (2 cases): hot spare + memory tier fault -> resumed <= 3 s, max",
            "20.1 s (not met: 1 of 2)", "<= 3 s") in table
    page = tmp_path / "guide.md"
    page.write_text("intro\n<!-- bench_ckpt_tiers: begin -->\nold\n<!-- bench_ckpt_tiers: end -->\nrest\n")
    run_all.write_docs(page, costs, run_all.TIERS)
    begin, end = run_all.markers(run_all.TIERS)
    assert page.read_text() == f"intro\n{begin}\n{costs}\n{end}\nrest\n"


def test_the_docs_pages_have_the_tiers_markers():
    run_all = _run_all()
    begin, end = run_all.markers(run_all.TIERS)
    for page in (run_all.DOCS, run_all.GUIDE):
        text = page.read_text()
        assert text.count(begin) == 1 and text.count(end) == 1, page


def test_memory_read_counts_the_jobs_copies_apart_from_saves_in_flight_and_other_jobs(tiers, tmp_path):
    """The matrix read 79.04 MB on a node where the tier bounds the job to 37.88 MB: 4 copies of job 26
    (requeued onto other nodes, then cancelled) next to job 28's 4 and one being written. The read now
    says which is which: the job's own published copies, its temporaries, other jobs' files."""
    user = tmp_path / "autoheal-memtier-0"
    for job, names in {"28": ["r00000-s00000050.copy", "r00000-s00000051.copy", ".tmp-r00000-s00000052.copy-9-ab",
                              "agent.pid"],
                       "26": ["r00001-s00000041.copy", "agent.pid"]}.items():
        (user / job).mkdir(parents=True)
        for i, name in enumerate(names):
            (user / job / name).write_bytes(b"x" * (100 * (i + 1)))
    (tmp_path / "unrelated").write_bytes(b"y" * 5000)  # not the tier's
    assert tiers.memory_held(tmp_path, "28") == tiers.Held(copies=300, in_flight=300, other_jobs=300)
    assert tiers.memory_held(tmp_path / "gone", "28") == tiers.Held()


def test_memory_figures_are_the_first_reads_copies_the_peak_and_other_jobs(tiers):
    H = tiers.Held
    reads = [{"gpu1": H(37_880_000, 0, 0), "gpu2": H(37_880_000, 3_280_000, 0)},
             {"gpu1": H(37_880_000, 9_470_000, 0), "gpu2": H(37_880_000, 0, 1_000_000)}]
    assert tiers.memory_figures(reads) == {"memory_per_node_mb": 37.88, "memory_peak_mb": 47.35,
                                           "memory_other_jobs_mb": 1.0}
    assert tiers.memory_figures([])["memory_per_node_mb"] is None
    row = _row(trainer="torch", save_ms_p50=120.0, save_ms_p95=300.0, state_mb=9.47, **tiers.memory_figures(reads))
    assert "tier memory/node 37.88 MB (peak 47.35 MB) (+1.0 MB of other jobs)" in tiers.render_row(row)
    assert "of other jobs" not in tiers.render_row(dict(row, memory_other_jobs_mb=0.0))
