"""The quick walk's fast paths give what the reference paths give.

A torch archive no bigger than the end-record search (filechecks.SMALL_ZIP_BYTES) is read once and checked
from memory; SMALL_ZIP_BYTES = -1 forces the reference path (every record read from the file). Both must find
the same problems, entries and pickle on real torch.save files and on damaged copies of them (cut short at
many points, a byte flipped in every region). `storage.read_bytes` reads a file's size, not its limit.
"""

from __future__ import annotations

import os

import pytest

from checkpoint_strategy import storage
from checkpoint_strategy.checkpoints import filechecks as fc

torch = pytest.importorskip("torch", reason="real torch.save archives")


def _scan(path, monkeypatch, in_memory: bool):
    with monkeypatch.context() as m:
        if not in_memory:
            m.setattr(fc, "SMALL_ZIP_BYTES", -1)
        counter = fc.Counter()
        z = fc.scan_zip(str(path), counter)
    entries = [(e.name, e.method, e.crc, e.csize, e.usize, e.offset, e.data_start) for e in z.entries]
    return [str(f) for f in z.findings], entries, z.keys(), z.legacy, counter.files, counter.bytes_read


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    d = tmp_path_factory.mktemp("zips")
    opt = torch.optim.AdamW(torch.nn.Linear(8, 4).parameters())
    opt.zero_grad()
    torch.nn.Linear(8, 4)(torch.ones(2, 8)).sum().backward()
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save({"last_epoch": 3, "_step_count": 4}, d / "scheduler.pt")
    torch.save({"w": torch.arange(40_000, dtype=torch.float32)}, d / "big.pt")   # past SMALL_ZIP_BYTES
    torch.save({"a": torch.ones(3)}, d / "legacy.pt", _use_new_zipfile_serialization=False)
    return d


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "big.pt", "legacy.pt"])
def test_real_archives_read_the_same_from_memory(archives, name, monkeypatch):
    path = archives / name
    fast = _scan(path, monkeypatch, True)
    assert fast == _scan(path, monkeypatch, False)
    assert fast[0] == [], fast[0]   # a real archive is valid
    assert (os.path.getsize(path) <= fc.SMALL_ZIP_BYTES) == (name != "big.pt")


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt"])
def test_damaged_archives_give_the_same_findings_from_memory(archives, name, tmp_path, monkeypatch):
    data = (archives / name).read_bytes()
    bad = tmp_path / name
    seen = set()
    for cut in range(0, len(data), max(1, len(data) // 60)):
        bad.write_bytes(data[:cut])
        fast = _scan(bad, monkeypatch, True)
        assert fast == _scan(bad, monkeypatch, False), cut
        seen.update(fast[0])
    for at in range(0, len(data), max(1, len(data) // 80)):
        flipped = bytearray(data)
        flipped[at] ^= 0x5A
        bad.write_bytes(bytes(flipped))
        fast = _scan(bad, monkeypatch, True)
        assert fast == _scan(bad, monkeypatch, False), at
        seen.update(fast[0])
    assert len(seen) >= 5, seen   # the damage reached several different checks


def test_read_bytes_reads_the_file_not_the_limit(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b'{"a": 1}')
    assert storage.read_bytes(p, "JSON file", limit=8) == b'{"a": 1}'
    with pytest.raises(storage.ReadError, match="larger than 7 bytes"):
        storage.read_bytes(p, "JSON file", limit=7)
    assert storage.read_bytes(tmp_path / "config.json", "JSON file") == b'{"a": 1}'


def test_crc_threads_follow_the_usable_cores(tmp_path, monkeypatch):
    """The measured rule: one CRC thread per core this process may use (affinity, then a cgroup quota), at most
    MAX_CRC_WORKERS; a number in CRC_WORKERS overrides it."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(fc, "CGROUP_CPU_MAX", str(quota))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    quota.write_text("max 100000\n")
    assert fc.usable_cores() == 16 and fc.crc_workers() == fc.MAX_CRC_WORKERS
    quota.write_text("150000 100000\n")   # 1.5 CPUs of quota: 2 threads
    assert fc.usable_cores() == 2 and fc.crc_workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert fc.crc_workers() == 1
    quota.write_text("garbage")
    assert fc.usable_cores() == 1
    monkeypatch.setattr(fc, "CRC_WORKERS", 3)
    assert fc.crc_workers() == 3
