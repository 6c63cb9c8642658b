"""Reasons we write into Slurm: sanitising, bounding, prefix and ownership."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoheal.reasons import MAX_REASON_LEN, PREFIX, is_ours, make_reason, sanitize, strip_reason_suffix


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch)[0] == "C" for ch in text)


def test_newlines_and_tabs_become_single_spaces():
    assert sanitize("xid 79\n\ngpu 3\tfell\r\noff") == "xid 79 gpu 3 fell off"


def test_ansi_escape_char_removed():
    out = sanitize("\x1b[31mred\x1b[0m alert")
    assert "\x1b" not in out
    assert "red" in out and "alert" in out
    assert not _has_control(out)


def test_nul_and_other_controls_removed():
    out = sanitize("a\x00b\x07c\x7fd\u200be")
    assert out == "a b c d e"


def test_quotes_and_shell_metacharacters_kept():
    text = "autoheal: \"x\" 'y' $HOME; rm -rf / | cat & `id` > /dev/null"
    assert sanitize(text) == text


def test_leading_trailing_whitespace_stripped():
    assert sanitize("   a  b   ") == "a b"


def test_none_is_empty():
    assert sanitize(None) == ""


def test_10kb_bounded_with_ellipsis():
    out = sanitize("x" * 10_000)
    assert len(out) == MAX_REASON_LEN
    assert out.endswith("...")
    assert out[:-3] == "x" * (MAX_REASON_LEN - 3)


def test_custom_max_len():
    out = sanitize("word " * 100, max_len=20)
    assert len(out) <= 20 and out.endswith("...")


def test_unicode_kept():
    assert sanitize("GPU défaillante — 温度 🔥") == "GPU défaillante — 温度 🔥"


def test_exact_length_not_cut():
    text = "y" * MAX_REASON_LEN
    assert sanitize(text) == text


@pytest.mark.parametrize("max_len", [0, 1, 2])
def test_tiny_max_len_still_bounded(max_len):
    assert len(sanitize("abcdef", max_len=max_len)) <= max_len


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600), st.integers(min_value=3, max_value=300))
def test_property_no_control_chars_bounded_idempotent(text, max_len):
    out = sanitize(text, max_len)
    assert not _has_control(out)
    assert "\n" not in out and "\r" not in out
    assert len(out) <= max_len
    assert sanitize(out, max_len) == out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=300), min_size=1, max_size=4))
def test_property_make_reason_bounded_and_ours(parts):
    reason = make_reason(*parts)
    assert len(reason) <= MAX_REASON_LEN
    assert is_ours(reason)
    assert not _has_control(reason)


def test_make_reason_joins_parts_with_prefix():
    assert make_reason("xid 79", "gpu 3 fell off the bus") == "autoheal: xid 79: gpu 3 fell off the bus"


def test_make_reason_skips_empty_parts():
    assert make_reason("xid 79", "", None, "  ", "gpu 3") == "autoheal: xid 79: gpu 3"


def test_make_reason_bound_includes_prefix():
    reason = make_reason("z" * 500)
    assert reason.startswith(PREFIX)
    assert len(reason) == MAX_REASON_LEN
    assert reason.endswith("...")
    assert len(make_reason("z" * 500, max_len=50)) == 50


def test_make_reason_sanitizes_parts():
    assert make_reason("bad\nline", "ok") == "autoheal: bad line: ok"


@pytest.mark.parametrize("reason, expected", [
    ("autoheal: xid 79", True),
    ("autoheal: xid 79 [root@2026-01-01T00:00:00]", True),
    ("  autoheal: leading space", True),
    ("maintenance by bob", False),
    ("Not responding", False),
    ("TRIX-DRAINER: Multiple reasons", False),
    ("my autoheal: note", False),
    ("Autoheal: capitalised is not ours", False),
    ("", False),
    (None, False),
])
def test_is_ours(reason, expected):
    assert is_ours(reason) is expected


@pytest.mark.parametrize("reason, expected", [
    ("autoheal: x [root@2026-11-30T08:19:06]", "autoheal: x"),
    ("admin work [slurm@2026-01-01T00:00:00]  ", "admin work"),
    ("no suffix here", "no suffix here"),
    ("keeps [brackets] inside", "keeps [brackets] inside"),
    ("list [a,b] at end", "list [a,b] at end"),
    ("", ""),
    (None, ""),
])
def test_strip_reason_suffix(reason, expected):
    assert strip_reason_suffix(reason) == expected
