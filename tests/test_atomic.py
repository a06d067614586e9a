"""atomic.py: temp file + rename, nothing half-written, permissions kept."""

import os

import pytest

from checkpoint_strategy.atomic import atomic_write_text


def test_new_file_gets_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert p.read_text() == "{}"
    assert p.stat().st_mode & 0o777 == 0o644


def test_existing_mode_is_kept_and_no_temp_left(tmp_path):
    p = tmp_path / "b.json"
    p.write_text("old")
    p.chmod(0o640)
    atomic_write_text(p, "new")
    assert p.read_text() == "new" and p.stat().st_mode & 0o777 == 0o640
    assert sorted(x.name for x in tmp_path.iterdir()) == ["b.json"]


def test_failed_write_leaves_old_content_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "c.json"
    p.write_text("old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_text(p, "new")
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.json"]
