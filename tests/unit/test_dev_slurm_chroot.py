"""`./dev test|drill --slurm RELEASE` and .ci/slurm-chroot: the argument checks that come before any
chroot is built (bad usage is exit 2 with a message, and nothing is built or mounted)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "slurm-chroot"


def _run(argv, **env):
    full = dict(os.environ, **env)
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=30, env=full)


def test_unknown_release_is_usage_error(tmp_path):
    res = _run([str(SCRIPT), "sid", "build"], AUTOHEAL_CHROOT=str(tmp_path / "c"))
    assert res.returncode == 2
    assert "unknown release 'sid'" in res.stderr
    assert not (tmp_path / "c").exists()


def test_missing_action_is_usage_error():
    res = _run([str(SCRIPT), "trixie"])
    assert res.returncode == 2
    assert "slurm-chroot trixie build" in res.stderr


def test_run_without_command_is_usage_error(tmp_path):
    res = _run([str(SCRIPT), "trixie", "run"], AUTOHEAL_CHROOT=str(tmp_path / "c"))
    assert res.returncode == 2
    assert not (tmp_path / "c").exists()


def test_chroot_inside_the_checkout_is_refused():
    if os.geteuid() != 0:  # the root check comes first
        res = _run([str(SCRIPT), "trixie", "build"])
        assert res.returncode == 2 and "not root" in res.stderr
        return
    res = _run([str(SCRIPT), "trixie", "build"], AUTOHEAL_CHROOT=str(ROOT / "chroot"))
    assert res.returncode == 2
    assert "inside the checkout" in res.stderr
    assert not (ROOT / "chroot").exists()


def test_dev_slurm_flag_needs_a_release():
    res = _run([str(ROOT / "dev"), "test", "--slurm"])
    assert res.returncode == 2
    assert "--slurm needs a release" in res.stderr


def _dev_apt_packages():
    for line in (ROOT / "dev").read_text().splitlines():
        if line.startswith("APT_PACKAGES="):
            return line.split("=", 1)[1].strip('"').split()
    raise AssertionError("no APT_PACKAGES line in ./dev")


def test_dev_installs_the_plugin_for_every_auth_type_the_lab_uses(tmp_path):
    """A minimal Debian 13 (no Recommends: the chroot) had no auth_jwt.so, and the lab's slurmctld died
    with "cannot find auth plugin for auth/jwt"; ./dev setup must name the package itself."""
    from autoheal_lab.slurmconf import LabLayout, render_slurm_conf

    lay = LabLayout(root=tmp_path, nodes=["gpu1"], spares=[], gpus=1, ctld_port=1, node_ports={"gpu1": 2},
                    rest_port=3)
    text = render_slurm_conf(lay, {}, [])
    plugin_package = {"auth/jwt": "slurm-wlm-jwt-plugin", "auth/munge": "munge"}
    used = {v.strip() for ln in text.splitlines() if ln.split("=", 1)[0] in ("AuthType", "AuthAltTypes")
            for v in ln.split("=", 1)[1].split(",")}
    assert used, text
    for auth in used:
        assert plugin_package[auth] in _dev_apt_packages(), auth


def test_forky_is_a_known_release(tmp_path):
    res = _run([str(SCRIPT), "forky", "run"], AUTOHEAL_CHROOT=str(tmp_path / "c"))
    assert res.returncode == 2
    assert "unknown release" not in res.stderr
    assert not (tmp_path / "c").exists()


def test_forky_is_bootstrapped_with_the_sid_script_where_debootstrap_has_none(tmp_path):
    """Debian 12's debootstrap (1.0.128) has no forky script: the build names sid's as the fourth argument
    (a fake debootstrap records its arguments and fails, so nothing is installed)."""
    if os.geteuid() != 0:
        res = _run([str(SCRIPT), "forky", "build"], AUTOHEAL_CHROOT=str(tmp_path / "c"))
        assert res.returncode == 2 and "not root" in res.stderr
        return
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "argv"
    (fake / "debootstrap").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >{record}\nexit 1\n')
    (fake / "debootstrap").chmod(0o755)
    res = _run([str(SCRIPT), "forky", "build"], AUTOHEAL_CHROOT=str(tmp_path / "c"),
               PATH=f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    assert res.returncode == 2 and "debootstrap failed" in res.stderr, res.stderr
    argv = record.read_text().split("\n")
    assert argv[:3] == ["--variant=minbase", "forky", str(tmp_path / "c")]
    if Path("/usr/share/debootstrap/scripts/forky").exists():
        assert argv[4:] == [""]  # a debootstrap that knows forky gets no script argument
    else:
        assert argv[4] == "/usr/share/debootstrap/scripts/sid"
    assert (tmp_path / "c" / ".autoheal-chroot-building").exists()  # half-built: started over next time
