"""The Lightning recipe resumes from its newest *valid* checkpoint (sbatch_helpers/examples/lightning_job.py).

Lightning's save (``TorchCheckpointIO`` -> ``_atomic_save``) writes a temporary file in ``$TMPDIR`` and
``shutil.move``s it to the checkpoint's name: to a shared filesystem that is a copy into the final name,
so a kill in the middle leaves a torn file there, and nothing is fsynced. ``resume_path`` must skip such a
file for the next newest one, never hand it to Lightning (whose own hpc resume picks the highest-numbered
``hpc_ckpt`` blindly). The archives here are built like ``torch.save``'s (stored zip members, each with its
CRC-32) so that CI, which has no torch, runs these; the torch test at the end uses Lightning's own save.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

import autoheal.sbatch_helpers as sbh

EXAMPLES = Path(sbh.__file__).parent / "examples"


@pytest.fixture(scope="module")
def lj():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lightning_job", EXAMPLES / "lightning_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _archive(path: Path, mtime: float, payload: bytes = b"\x80\x02weights" * 4096, crc: bool = True) -> Path:
    """A checkpoint laid out as torch.save's (``<name>/data.pkl``, ``<name>/data/0``, ... stored, not
    compressed); ``crc=False``: every member's CRC-32 written as 0, as after
    ``torch.serialization.set_crc32_options(False)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in (("archive/data.pkl", b"\x80\x02}q\x00."), ("archive/data/0", payload),
                           ("archive/version", b"3\n")):
            zf.writestr(name, data)
    if not crc:
        raw = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
        for info in infos:  # the CRC field of the local header (offset 14) and of the central directory entry
            raw[info.header_offset + 14:info.header_offset + 18] = b"\0\0\0\0"
        cd = raw.rfind(b"PK\x05\x06")
        start = int.from_bytes(raw[cd + 16:cd + 20], "little")
        pos = start
        for _ in infos:
            raw[pos + 16:pos + 20] = b"\0\0\0\0"
            pos += 46 + int.from_bytes(raw[pos + 28:pos + 30], "little") + int.from_bytes(
                raw[pos + 30:pos + 32], "little") + int.from_bytes(raw[pos + 32:pos + 34], "little")
        path.write_bytes(bytes(raw))
    os.utime(path, (mtime, mtime))
    return path


def _tear(path: Path, how: str) -> Path:
    """What a killed copy or a crash leaves under the checkpoint's name (its mtime kept)."""
    st = path.stat()
    raw = bytearray(path.read_bytes())
    if how == "cut":  # the copy was killed half way
        raw = raw[:len(raw) // 2]
    elif how == "empty":  # created, nothing written yet (or a crash before the data reached the disk)
        raw = bytearray()
    elif how == "zero-tail":  # the size was extended but the last blocks never written
        raw[len(raw) // 2:] = bytes(len(raw) - len(raw) // 2)
    elif how == "hole":  # one block in the data never written: only the member's CRC-32 sees it
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo("archive/data/0")
        at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 4096
        raw[at:at + 4096] = bytes(4096)
    path.write_bytes(bytes(raw))
    os.utime(path, (st.st_mtime, st.st_mtime))
    return path


def test_nothing_to_resume_from_starts_from_scratch(lj, tmp_path):
    assert lj.resume_path(str(tmp_path)) is None


def test_the_newest_valid_checkpoint_regular_or_hpc_is_named_explicitly(lj, tmp_path):
    """Lightning's own hpc resume is never relied on: the newest valid file is always passed."""
    hpc1 = _archive(tmp_path / "hpc_ckpt_1.ckpt", 1000)
    assert lj.resume_path(str(tmp_path)) == str(hpc1)
    _archive(tmp_path / "checkpoints" / "epoch=0-step=128.ckpt", 900)
    assert lj.resume_path(str(tmp_path)) == str(hpc1)  # the hpc one (the signal's) is newer
    reg = _archive(tmp_path / "checkpoints" / "epoch=1-step=256.ckpt", 1100)
    assert lj.resume_path(str(tmp_path)) == str(reg)
    hpc2 = _archive(tmp_path / "hpc_ckpt_2.ckpt", 1100)
    assert lj.resume_path(str(tmp_path)) == str(hpc2)  # a tie: the hpc one, the later save


@pytest.mark.parametrize("how", ["cut", "empty", "zero-tail", "hole"])
def test_a_torn_newest_regular_checkpoint_is_skipped_for_the_previous_good_one(lj, tmp_path, capsys, how):
    good = _archive(tmp_path / "checkpoints" / "epoch=0-step=128.ckpt", 1000)
    torn = _tear(_archive(tmp_path / "checkpoints" / "epoch=1-step=256.ckpt", 1100), how)
    assert lj.checkpoint_problem(str(torn)) is not None and lj.checkpoint_problem(str(good)) is None
    assert lj.resume_path(str(tmp_path)) == str(good)
    assert f"lightning-job: skipped torn checkpoint {torn}: " in capsys.readouterr().out
    assert torn.exists()  # a regular one is left where it is (Lightning overwrites it at that epoch's end)


@pytest.mark.parametrize("how", ["cut", "zero-tail", "hole"])
def test_a_torn_hpc_checkpoint_never_wins_the_comparison_with_a_regular_one(lj, tmp_path, how):
    """The save on the signal killed half way (the grace ran out): newer than the regular checkpoint
    by mtime, and torn. The regular one is resumed; the older valid hpc one loses to it by mtime."""
    _archive(tmp_path / "hpc_ckpt_1.ckpt", 900)
    reg = _archive(tmp_path / "checkpoints" / "epoch=1-step=256.ckpt", 1000)
    _tear(_archive(tmp_path / "hpc_ckpt_2.ckpt", 1100), how)
    assert lj.resume_path(str(tmp_path)) == str(reg)
    os.utime(reg, (800, 800))  # now the valid hpc one is the newest valid file
    assert lj.resume_path(str(tmp_path)) == str(tmp_path / "hpc_ckpt_1.ckpt")


def test_with_no_valid_checkpoint_torn_hpc_files_are_moved_aside_so_lightning_cannot_pick_them(lj, tmp_path):
    _tear(_archive(tmp_path / "hpc_ckpt_1.ckpt", 1000), "cut")
    _tear(_archive(tmp_path / "checkpoints" / "epoch=0-step=128.ckpt", 900), "cut")
    assert lj.resume_path(str(tmp_path)) is None
    assert not list(tmp_path.glob("*ckpt_*"))  # Lightning looks for names containing "ckpt_" in the root
    assert (tmp_path / lj.TORN / "hpc_ckpt_1.ckpt").is_file()  # kept for a post-mortem
    assert lj.resume_path(str(tmp_path)) is None  # a second rank, or a second start: the same answer


def test_an_archive_written_without_crcs_is_judged_by_its_structure(lj, tmp_path):
    whole = _archive(tmp_path / "nocrc.ckpt", 1000, crc=False)
    with zipfile.ZipFile(whole) as zf:
        assert {i.CRC for i in zf.infolist()} == {0}
    assert lj.checkpoint_problem(str(whole)) is None
    assert lj.checkpoint_problem(str(_tear(_archive(tmp_path / "cut.ckpt", 1000, crc=False), "cut"))) is not None


def test_what_is_not_a_checkpoint(lj, tmp_path):
    (tmp_path / "dir.ckpt").mkdir()
    assert lj.checkpoint_problem(str(tmp_path / "dir.ckpt")) == "not a file"
    with zipfile.ZipFile(tmp_path / "other.ckpt", "w") as zf:
        zf.writestr("readme.txt", "not torch")
    assert "not a torch.save archive" in lj.checkpoint_problem(str(tmp_path / "other.ckpt"))
    assert lj.checkpoint_problem(str(tmp_path / "missing.ckpt")) == "not a file"


def test_lightnings_own_save_torn_at_any_point_is_rejected_and_the_previous_one_loads(lj, tmp_path):
    """Lightning's own writer (TorchCheckpointIO, as ``Trainer.save_checkpoint`` uses it), real tensors:
    the newest file cut at any point, or with a hole in a tensor, is skipped; the previous file loads.
    A hole is what torch.load alone misses: it loads wrong weights without a word."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lightning")
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    io = TorchCheckpointIO()
    state = {"state_dict": {"w": torch.arange(50_000, dtype=torch.float32)}, "global_step": 128}
    good = tmp_path / "checkpoints" / "epoch=0-step=128.ckpt"
    io.save_checkpoint(state, good)
    os.utime(good, (1000, 1000))
    newest = tmp_path / "checkpoints" / "epoch=1-step=256.ckpt"
    io.save_checkpoint(dict(state, global_step=256), newest)
    whole = newest.read_bytes()
    assert lj.checkpoint_problem(str(newest)) is None
    for cut in range(0, len(whole), max(1, len(whole) // 17)):
        newest.write_bytes(whole[:cut])
        os.utime(newest, (1100, 1100))
        assert lj.resume_path(str(tmp_path)) == str(good), cut
    newest.write_bytes(whole)
    _tear(newest, "hole")
    # torch 2.15's torch.load checks no CRC: the file loads, with zeros in the middle of the tensor
    assert torch.load(newest, weights_only=True)["global_step"] == 256
    assert lj.resume_path(str(tmp_path)) == str(good)
    assert io.load_checkpoint(lj.resume_path(str(tmp_path)))["global_step"] == 128
    if hasattr(torch.serialization, "set_crc32_options"):  # torch >= 2.6
        torch.serialization.set_crc32_options(False)
        try:
            io.save_checkpoint(dict(state, global_step=384), newest)
        finally:
            torch.serialization.set_crc32_options(True)  # torch's default
        os.utime(newest, (1200, 1200))
        assert lj.resume_path(str(tmp_path)) == str(newest)  # no CRCs: a whole file is still valid
