"""`autoheal guard` options that reach the Guard (the lab's tests run it with short bounds)."""

from __future__ import annotations

from click.testing import CliRunner


def test_lost_prolog_after_reaches_the_guard_and_sets_how_often_it_looks(tmp_path, monkeypatch):
    from autoheal.sbatch_helpers import guard_cli

    built = {}
    real = guard_cli._build

    def spy(*args, **kwargs):
        g, notifier = real(*args, **kwargs)
        built["guard"] = g
        return g, notifier

    monkeypatch.setattr(guard_cli, "_build", spy)
    monkeypatch.setattr("autoheal.slurm.get_adapter", lambda cfg: _NoJobs())
    conf = tmp_path / "autoheal.toml"
    conf.write_text('[journal]\npath = "%s"\n' % (tmp_path / "j.jsonl"))
    res = CliRunner().invoke(guard_cli.guard, ["--once", "--dry-run", "--lost-prolog-after", "8",
                                               "--config", str(conf)])
    assert res.exit_code == 0, res.output
    assert built["guard"].lost_prolog_after == 8.0
    assert built["guard"].prolog_every == 2.0  # a look every quarter of the bound


def test_lost_prolog_after_defaults_to_a_minute_and_refuses_nonsense(tmp_path):
    from autoheal.sbatch_helpers.guard_cli import guard

    help_text = CliRunner().invoke(guard, ["--help"]).output
    assert "--lost-prolog-after" in help_text and "60" in help_text
    res = CliRunner().invoke(guard, ["--once", "--lost-prolog-after", "0"])
    assert res.exit_code == 2 and "--lost-prolog-after" in res.output


class _NoJobs:
    """An adapter with nothing to do: no jobs (the pass ends before it lists nodes)."""

    def list_jobs(self, states=None):
        return []

    def show_config(self):
        return {"PrologFlags": "Alloc"}

    def version(self):
        from autoheal.slurm.model import SlurmVersion

        return SlurmVersion.parse("24.11.5")


def test_lost_prolog_jobs_reaches_the_guard_and_refuses_other_words(tmp_path, monkeypatch):
    from autoheal.sbatch_helpers import guard_cli
    from autoheal.sbatch_helpers.guard import PrologJobs

    built = {}
    real = guard_cli._build

    def spy(*args, **kwargs):
        g, notifier = real(*args, **kwargs)
        built.setdefault("guards", []).append(g)
        return g, notifier

    monkeypatch.setattr(guard_cli, "_build", spy)
    monkeypatch.setattr("autoheal.slurm.get_adapter", lambda cfg: _NoJobs())
    conf = tmp_path / "autoheal.toml"
    conf.write_text('[journal]\npath = "%s"\n' % (tmp_path / "j.jsonl"))
    for extra in ([], ["--lost-prolog-jobs", "autoheal"]):
        res = CliRunner().invoke(guard_cli.guard, ["--once", "--dry-run", *extra, "--config", str(conf)])
        assert res.exit_code == 0, res.output
    assert [g.prolog_jobs for g in built["guards"]] == [PrologJobs.ALL, PrologJobs.AUTOHEAL]
    res = CliRunner().invoke(guard_cli.guard, ["--once", "--lost-prolog-jobs", "mine", "--config", str(conf)])
    assert res.exit_code == 2 and "--lost-prolog-jobs" in res.output
