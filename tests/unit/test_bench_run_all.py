"""bench/run_all.py --write-docs: the figures go between docs/benchmarks.md's markers, the rest is kept."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_table_replaces_only_what_lies_between_the_markers(tmp_path):
    run_all = _run_all()
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\nintro\n{run_all.BEGIN}\n| old | 1 | - |\n{run_all.END}\n## Notes\nkept\n")
    block = run_all.render_markdown([("drill: fault -> drain, median s", 0.1, "<= 2")], "python bench/run_all.py",
                                    "2026-12-02, 2 cores")
    run_all.write_docs(page, block)
    text = page.read_text()
    assert "| old |" not in text
    assert "| drill: fault -> drain, median s | 0.1 | <= 2 |" in text
    assert text.startswith("# Benchmarks\nintro\n") and text.endswith("## Notes\nkept\n")
    assert "`python bench/run_all.py` on 2026-12-02, 2 cores" in text


def test_a_page_without_markers_is_refused_and_left_alone(tmp_path):
    run_all = _run_all()
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\nhand-written\n")
    with pytest.raises(SystemExit, match="markers"):
        run_all.write_docs(page, "x")
    assert page.read_text() == "# Benchmarks\nhand-written\n"


def test_the_docs_page_has_the_markers():
    run_all = _run_all()
    text = run_all.DOCS.read_text()
    assert text.count(run_all.BEGIN) == 1 and text.count(run_all.END) == 1
