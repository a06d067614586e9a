"""The quick walk's fast paths give what the reference paths give.

A torch archive no bigger than archive.SMALL_ZIP_BYTES (1 MiB) is read once and checked
from memory (the one zip reader, `archive`, unpacks its records from the bytes and checks the usual local
headers in its directory pass); SMALL_ZIP_BYTES = -1 reads every record from the file. Both must find
the same problems, entries and pickle on real torch.save files and on damaged copies of them (cut short at
many points, a byte flipped in every region). `storage.read_bytes` reads a file's size, not its limit.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import struct

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from checkpoint_strategy import storage
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc

torch = pytest.importorskip("torch", reason="real torch.save archives")


def _scan(path, monkeypatch, in_memory: bool):
    """scan_zip's result: from memory, or with every record read from the file."""
    with monkeypatch.context() as m:
        if not in_memory:
            m.setattr(zr, "SMALL_ZIP_BYTES", -1)
        counter = zr.Counter()
        z = fc.scan_zip(str(path), counter)
    entries = [
        (e.name, e.method, e.crc, e.csize, e.usize, e.offset, e.data_start) for e in z.entries
    ]
    return (
        [str(f) for f in z.findings],
        entries,
        z.keys(),
        z.legacy,
        counter.files,
        counter.bytes_read,
    )


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    d = tmp_path_factory.mktemp("zips")
    opt = torch.optim.AdamW(torch.nn.Linear(8, 4).parameters())
    opt.zero_grad()
    torch.nn.Linear(8, 4)(torch.ones(2, 8)).sum().backward()
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save({"last_epoch": 3, "_step_count": 4}, d / "scheduler.pt")
    torch.save({"a": torch.ones(2), "b": torch.zeros(2, dtype=torch.float64)}, d / "tensors.pt")
    torch.save(
        {"w": torch.arange(300_000, dtype=torch.float32)}, d / "big.pt"
    )  # past SMALL_ZIP_BYTES
    torch.save({"a": torch.ones(3)}, d / "legacy.pt", _use_new_zipfile_serialization=False)
    return d


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "big.pt", "legacy.pt"])
def test_real_archives_read_the_same_from_memory(archives, name, monkeypatch):
    path = archives / name
    fast = _scan(path, monkeypatch, True)
    assert fast == _scan(path, monkeypatch, False)
    assert fast[0] == [], fast[0]  # a real archive is valid
    assert (os.path.getsize(path) <= zr.SMALL_ZIP_BYTES) == (name != "big.pt")


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
    assert len(seen) >= 5, seen  # the damage reached several different checks


def _scan_bytes(data: bytes, in_memory: bool):
    """`_scan_open_zip` on an archive's bytes held whole (`archive.InMemory`) or read record by record (a
    `Window` on them, as on a file)."""
    z, counter = fc.ZipScan(), zr.Counter()
    src = zr.InMemory(data) if in_memory else zr.Window(io.BytesIO(data), 0, len(data))
    fc._scan_open_zip(src, "x.pt", z, counter, False, None)
    entries = [
        (e.name, e.method, e.crc, e.csize, e.usize, e.offset, e.data_start) for e in z.entries
    ]
    return [str(f) for f in z.findings], entries, z.keys(), z.prefix, z.legacy, counter.bytes_read


@pytest.mark.parametrize("name", ["optimizer.pt", "tensors.pt"])
def test_in_memory_agrees_on_every_byte_of_the_directory(archives, name):
    """The reader on a small archive's bytes (every record unpacked from them, the usual local headers checked in
    the directory pass) against the same reader taking each record from a file: every byte of the central
    directory, the zip64 records, the end record and the last local header, each set to three other values; and
    every cut. Same findings, entries, pickle and byte count."""
    data = (archives / name).read_bytes()
    assert _scan_bytes(data, True)[0] == []  # a real archive
    cd_at = data.find(b"PK\x01\x02")
    start = data.rfind(b"PK\x03\x04", 0, cd_at)
    valid = invalid = 0
    for at in range(start, len(data)):
        for x in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[at] ^= x
            bad = bytes(bad)
            got = _scan_bytes(bad, True)
            valid += not got[0]
            invalid += bool(got[0])
            assert got == _scan_bytes(bad, False), (at, x)
    for cut in range(len(data)):
        assert _scan_bytes(data[:cut], True) == _scan_bytes(data[:cut], False), cut
    assert (
        valid and invalid
    )  # both ways were exercised (a flipped CRC or data byte still reads as valid)


def _edits(data: bytes) -> dict[str, bytes]:
    """Damage no single flipped byte makes: a name changed in the directory and its local header alike, the
    zip64 record's fields, a comment after the end record, disk numbers, an archive of another writer's shape."""
    z64 = data.rfind(b"PK\x06\x06")
    eocd = len(data) - 22

    def put(buf: bytes, at: int, fmt: str, *values) -> bytes:
        b = bytearray(buf)
        struct.pack_into(fmt, b, at, *values)
        return bytes(b)

    return {
        "duplicate name": data.replace(b"/data/1", b"/data/0"),
        "no data.pkl": data.replace(b"data.pkl", b"data.pkx"),
        "zip64 record too short": put(data, z64 + 4, "<Q", 43),
        "zip64 entries past 32 bits": put(
            put(data, z64 + 24, "<Q", 1 << 33), z64 + 32, "<Q", 1 << 33
        ),
        "zip64 on disk 1 of 1": put(data, z64 + 16, "<II", 1, 1),
        "zip64 on disk 2": put(data, z64 + 16, "<II", 2, 0),
        "locator counts 2 disks": put(data, eocd - 4, "<I", 2),
        "comment": put(data, eocd + 20, "<H", 3) + b"abc",
        "no zip64 records, 0xFFFF entries": data[:z64] + put(data[eocd:], 8, "<HH", 0xFFFF, 0xFFFF),
        "no zip64 records": data[:z64] + data[eocd:],
        "end record twice": data + data[eocd:],
    }


def test_in_memory_agrees_on_damage_beyond_one_byte(archives):
    data = (archives / "tensors.pt").read_bytes()
    seen = set()
    for what, bad in _edits(data).items():
        assert bad != data, what
        got = _scan_bytes(bad, True)
        assert got == _scan_bytes(bad, False), what
        seen.add(got[0][0].split()[0] if got[0] else "valid")
    assert _scan_bytes(_edits(data)["duplicate name"], True)[0][0].startswith("duplicate entry")
    assert len(seen) >= 4, seen


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
    monkeypatch.setattr(zr, "CGROUP_CPU_MAX", str(quota))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    quota.write_text("max 100000\n")
    assert zr.usable_cores() == 16 and zr.crc_workers() == zr.MAX_CRC_WORKERS
    quota.write_text("150000 100000\n")  # 1.5 CPUs of quota: 2 threads
    assert zr.usable_cores() == 2 and zr.crc_workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert zr.crc_workers() == 1
    quota.write_text("garbage")
    assert zr.usable_cores() == 1
    monkeypatch.setattr(zr, "CRC_WORKERS", 3)
    assert zr.crc_workers() == 3


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_read_small_reads_whole_small_files_and_hands_back_big_ones(tmp_path):
    """storage.read_small: a file up to `small` bytes comes back as its bytes, a bigger one open at its start;
    no descriptor is left open either way, nor when it refuses a FIFO, a folder or a missing file."""
    small, big, empty = tmp_path / "a.json", tmp_path / "b.pt", tmp_path / "c"
    small.write_bytes(b'{"a": 1}')
    big.write_bytes(b"x" * 100)
    empty.write_bytes(b"")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    from checkpoint_strategy.storage import (
        remote,  # loaded, no object-storage view open: still read whole
    )

    assert remote.view_count() == 0
    before = _open_fds()
    for _ in range(300):
        assert storage.read_small(small, small=8) == b'{"a": 1}'
        assert storage.read_small(empty, small=8) == b""
        with storage.read_small(big, small=99) as fh:
            assert fh.read() == b"x" * 100
        for bad, reason in (
            (fifo, "is a FIFO"),
            (tmp_path, "is a folder"),
            (tmp_path / "gone", "does not exist"),
        ):
            with pytest.raises(storage.ReadError, match=reason):
                storage.read_small(bad)
    assert _open_fds() == before


def test_read_small_takes_the_file_as_it_is_when_its_size_changed(tmp_path, monkeypatch):
    """A file that grew between the size check and the read is not cut to its old size: it comes back open at
    its start (the callers' reference path reads it as it is now)."""
    p = tmp_path / "config.json"
    p.write_bytes(b'{"a": 1}')
    real_open_fd = storage._open_fd

    def stale_size(path, what, **kw):
        fd, size = real_open_fd(path, what, **kw)
        return fd, size - 3  # as if the file had been 3 bytes shorter at fstat time

    monkeypatch.setattr(storage, "_open_fd", stale_size)
    got = storage.read_small(p, small=100)
    assert not isinstance(got, bytes)
    with got as fh:
        assert fh.read() == b'{"a": 1}'
    assert storage.read_bytes(p) == b'{"a": 1}'


def _walk_size(path: str) -> int:
    """The reference definition of a checkpoint's bytes (prune's report): os.walk, no links followed, lstat."""
    if not os.path.isdir(path) or os.path.islink(path):
        return os.lstat(path).st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for n in files:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def test_prune_sizes_match_a_walk_on_links_fifos_and_nested_folders(tmp_path):
    """prune_survey._size (one scandir per folder) counts what an os.walk + lstat counts: files in nested
    folders, a link to a file as the link, a dangling link, a FIFO; a link to a folder (inside or outside)
    is neither entered nor counted; unreadable folders are skipped."""
    from checkpoint_strategy.retention.survey import _links_under, _size

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge.bin").write_bytes(b"o" * 5000)
    ck = tmp_path / "checkpoint-10"
    (ck / "global_step10" / "deeper").mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"m" * 700)
    (ck / "global_step10" / "shard.pt").write_bytes(b"s" * 300)
    (ck / "global_step10" / "deeper" / "x").write_bytes(b"d" * 11)
    (ck / "link-to-file").symlink_to(ck / "model.safetensors")
    (ck / "link-to-outside").symlink_to(outside)
    (ck / "link-to-inside").symlink_to(ck / "global_step10")
    (ck / "dangling").symlink_to(tmp_path / "nothing")
    (ck / "name with\nnewline|bar").write_bytes(b"n" * 5)
    os.mkfifo(ck / "fifo")
    locked = ck / "locked"
    locked.mkdir()
    (locked / "secret").write_bytes(b"z" * 50)
    locked.chmod(0)
    try:
        expected = _walk_size(str(ck))
        assert _size(str(ck)) == expected
        assert expected < 5000  # the folder outside was not counted
        # the survey's link walk counts the same bytes (it stands in for _size in the report)
        assert _links_under(
            str(ck),
            str(tmp_path),
            os.path.realpath(tmp_path),
            {"checkpoint-10"},
            "checkpoint-10",
            recurse=True,
        )[1:] == (True, expected)
    finally:
        locked.chmod(0o755)
    assert _size(str(ck)) == _walk_size(str(ck))
    assert _size(str(ck / "model.safetensors")) == 700
    assert _size(str(ck / "link-to-outside")) == _walk_size(str(ck / "link-to-outside"))
    assert _size(str(tmp_path / "missing")) == 0


def test_zip_entry_lookup_is_the_first_of_that_name_in_the_current_list():
    """ZipScan.entry looks names up through a dict (linear in storages): the first entry of a name, as a scan
    finds it, and the current list's when the entries are replaced or grown."""
    a1, a2, b = (
        zr.ZipEntry("a", 0, 0, 1, 1, 0),
        zr.ZipEntry("a", 0, 0, 2, 2, 9),
        zr.ZipEntry("b", 0, 0, 3, 3, 5),
    )
    z = fc.ZipScan(entries=[a1, a2])
    assert z.entry("a") is a1 and z.entry("b") is None
    z.entries.append(b)
    assert z.entry("b") is b
    z.entries = [a2]
    assert z.entry("a") is a2 and z.entry("b") is None


@pytest.mark.parametrize("small", [True, False])
def test_local_header_names_longer_in_bytes_than_in_characters(tmp_path, monkeypatch, small):
    """A local header is read as 30 bytes + the name's length in characters; a UTF-8 name is longer in bytes and
    is read again whole: a good one passes, a changed one is named in full in the mismatch (from memory and
    from the file alike)."""
    import zipfile

    p = tmp_path / "archive.pt"
    name = "archive/données/é"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("archive/version", b"3\n")
        zf.writestr(name, b"x" * 10)
    if not small:
        monkeypatch.setattr(zr, "SMALL_ZIP_BYTES", -1)
    z = fc.scan_zip(str(p), zr.Counter())
    assert [str(f) for f in z.findings] == [] and z.entry(name).data_start > 0
    data = bytearray(p.read_bytes())
    at = data.index("données/é".encode())  # the local header's copy comes first
    data[at] = ord("D")
    p.write_bytes(bytes(data))
    z = fc.scan_zip(str(p), zr.Counter())
    assert [str(f) for f in z.findings] == [
        f"entry name mismatch: central directory {name!r}, local header {'archive/Données/é'!r}"
    ]


def _archive(path, deflate_last: bool = False) -> bytes:
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("archive/version", b"3\n")
        zf.writestr(
            "archive/data/0",
            b"x" * 10,
            zipfile.ZIP_DEFLATED if deflate_last else zipfile.ZIP_STORED,
        )
    return path.read_bytes()


def _cd_record(data: bytes, name: str) -> int:
    """Offset of the central directory record of `name` (its second copy in the file; the first is the local header)."""
    raw = name.encode()
    return data.index(raw, data.index(raw) + 1) - 46


@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize(
    "damage, expected",
    [
        ("signature", "broken local header for entry 'archive/data/0' at offset {lh}"),
        ("past", "entry 'archive/data/0' (40 bytes) runs past the central directory: truncated"),
        ("method", "entry 'archive/data/0' uses unsupported compression method 12"),
        ("sizes", "entry 'archive/data/0': stored sizes disagree (10 vs 11)"),
        (
            "bomb",
            "entry 'archive/data/0' is deflated to inflate to 11 bytes, more than the 0 GB this checker inflates "
            "(torch.save stores entries uncompressed: a re-zipped archive or a zip bomb)",
        ),
    ],
)
def test_local_header_findings(tmp_path, monkeypatch, small, damage, expected):
    """Each local-header finding, from memory (a small archive read whole) and from the file."""
    p = tmp_path / "archive.pt"
    data = bytearray(_archive(p, deflate_last=damage == "bomb"))
    lh = data.index(b"archive/data/0") - 30
    cd = _cd_record(bytes(data), "archive/data/0")
    full = False
    if damage == "signature":
        data[lh : lh + 4] = b"PK\x00\x00"
    elif damage == "past":
        data[cd + 20 : cd + 28] = struct.pack("<II", 40, 40)
    elif damage == "method":
        data[cd + 10 : cd + 12] = struct.pack("<H", 12)
    elif damage == "sizes":
        data[cd + 24 : cd + 28] = struct.pack("<I", 11)
    elif damage == "bomb":
        data[cd + 24 : cd + 28] = struct.pack("<I", 11)
        monkeypatch.setattr(zr, "MAX_INFLATE_BYTES", 10)
        full = True
    p.write_bytes(bytes(data))
    if not small:
        monkeypatch.setattr(zr, "SMALL_ZIP_BYTES", -1)
    z = fc.scan_zip(str(p), zr.Counter(), full=full)
    assert [str(f) for f in z.findings] == [expected.format(lh=lh)]
    assert z.findings[0].kind == ("incomplete" if damage == "past" else "invalid")


def test_recover_without_checkpoints_loads_neither_the_validator_nor_prune(tmp_path):
    """validate/__init__ and retention/__init__ name their API lazily (PEP 562): recover on a log reads formats.marker and
    formats.runlog (the run facts) only; the package's `prune` stays the function whichever import comes first."""
    import subprocess
    import sys

    from cliresult import checkout_env

    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(f'{{"step": {i}, "loss": {2.0 + (i % 5) / 100}}}\n' for i in range(1, 200))
    )
    code = (
        "import sys; from checkpoint_strategy.cli.main import main; rc = main(['recover', sys.argv[1], '-o', "
        "sys.argv[2]]); heavy = sorted(m for m in sys.modules if m.startswith(('checkpoint_strategy.validate.', 'checkpoint_strategy.formats.', 'checkpoint_strategy.retention.'))"
        " and m.rsplit('.', 1)[1] in ('engine', 'prune', 'survey', 'deep', 'filechecks')); "
        "import checkpoint_strategy.retention.prune as a; from checkpoint_strategy.retention import prune as b;"
        " print(rc, heavy, callable(a) and a is b and a.__module__ == 'checkpoint_strategy.retention.prune')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(log), str(tmp_path / "report.txt")],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )
    assert out.stdout.split("\n")[0] == "0 [] True", out.stdout + out.stderr


def test_validate_loads_neither_the_planner_nor_the_keep_rules(tmp_path):
    """validate (the command a training callback or CI runs after every save) starts without the plan models,
    the planner or the keep rules: the report models take the policy tiers and the reason kinds from small
    modules of their own (planning/policytiers.py, formats/reasonkinds.py). ~13% fewer instructions to
    import the validator (bench/bench_walk.py --instructions, start-up floors). Nor, at the quick level, the
    deep check and its value scanner (validate._deep: loaded at level deep only)."""
    import subprocess
    import sys

    from cliresult import checkout_env

    folder = tmp_path / "checkpoint-10"
    _hf_checkpoint(folder)
    code = (
        "import sys; from checkpoint_strategy.cli.main import main; rc = main(['validate', sys.argv[1], '--format', "
        "'json', '-o', sys.argv[2]]); print(rc, sorted(m for m in sys.modules if m in ("
        "'checkpoint_strategy.planning.models', 'checkpoint_strategy.planning.planner', "
        "'checkpoint_strategy.retention.rules', 'checkpoint_strategy.validate.deep', "
        "'checkpoint_strategy.formats.tensors')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(tmp_path / "report.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )
    assert out.stdout.split("\n")[0] == "0 []", out.stdout + out.stderr


# --------------------------------------------------------------------------- the listing's hints (issue 30)


def _hf_checkpoint(folder, step: int = 10, log_history=None):
    """An HF-Trainer-shaped checkpoint written by torch and safetensors themselves (no Trainer run)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.ones(4, 4)}, str(folder / "model.safetensors"))
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save({"last_epoch": 3}, folder / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.zeros(3, dtype=torch.uint8)}, folder / "rng_state.pth")
    torch.save({"lr": 1e-3}, folder / "training_args.bin")
    import json

    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": step, "log_history": log_history or []})
    )
    (folder / "config.json").write_text("{}")
    return folder


def _damaged_run(root):
    """One run folder holding a sound checkpoint and one per kind of damage the quick walk reports."""
    import shutil

    good = _hf_checkpoint(root / "checkpoint-10")
    for step, damage in enumerate(
        (
            "fifo-json",
            "fifo-zip",
            "link-out",
            "cut-zip",
            "no-pkl",
            "cut-st",
            "bad-json",
            "dir-zip",
            "bom-json",
        ),
        start=2,
    ):
        d = root / f"checkpoint-{step * 10}"
        shutil.copytree(good, d)
        if damage == "fifo-json":
            (d / "config.json").unlink()
            os.mkfifo(d / "config.json")
        elif damage == "fifo-zip":
            (d / "scheduler.pt").unlink()
            os.mkfifo(d / "scheduler.pt")
        elif damage == "link-out":
            (d / "training_args.bin").unlink()
            (d / "training_args.bin").symlink_to(root / "checkpoint-10" / "training_args.bin")
        elif damage == "cut-zip":
            data = (d / "optimizer.pt").read_bytes()
            (d / "optimizer.pt").write_bytes(data[: len(data) // 2])
        elif damage == "no-pkl":
            data = bytearray((d / "rng_state.pth").read_bytes())
            at = data.index(b"data.pkl")
            data[at : at + 8] = b"data.pk_"  # the local header's copy of the name: a name mismatch
            (d / "rng_state.pth").write_bytes(bytes(data))
        elif damage == "cut-st":
            data = (d / "model.safetensors").read_bytes()
            (d / "model.safetensors").write_bytes(data[:-5])
        elif damage == "bad-json":
            (d / "trainer_state.json").write_text('{"global_step": NaN, "log_history": [')
        elif damage == "dir-zip":
            (d / "optimizer.pt").unlink()
            (d / "optimizer.pt").mkdir()
        elif damage == "bom-json":
            (d / "model.safetensors").write_bytes(struct.pack("<Q", 5) + "\ufeff{}".encode()[:5])
    return root


def _report(root) -> list:
    from checkpoint_strategy.validate import validate_paths

    r = validate_paths([str(root)], level="quick", progress=False)
    return [
        (
            c.path,
            c.status,
            c.files_checked,
            c.bytes_read,
            [(p.file, p.reason, p.kind) for p in c.problems],
            c.notes,
        )
        for c in r.checkpoints
    ] + [r.blind_spots, [s.model_dump() for s in r.safety]]


def test_listing_hints_give_the_verdicts_of_a_stat_before_every_open(tmp_path, monkeypatch):
    """The HF checker's scandir listing lets each file check skip its stat before the open (a regular file seen by
    the listing). The verdicts are those of the stat-first path on FIFOs, folders and links in place of files, cut
    archives and headers, a local header that does not match, bad JSON; also when the listing is told every
    name is a regular file (a file swapped for a FIFO or a folder after the listing): the fstat after the open
    refuses it in the same words, without blocking."""
    from checkpoint_strategy.formats import identify as fm

    root = _damaged_run(tmp_path / "run")
    hinted = _report(root)
    statuses = [c[1] for c in hinted[:-2]]
    assert statuses[0] == "valid" and statuses.count("valid") == 2, (
        hinted
    )  # the good one and the link inside
    real_listing = fm.listing_types
    with (
        monkeypatch.context() as m
    ):  # discover's listing not handed on: the checker lists each folder itself
        real_discover = fm.discover
        assert any(
            f.listing is not None for f in real_discover(str(root))[0]
        )  # (what the patch takes away)
        m.setattr(
            fm,
            "discover",
            lambda *a, **k: (
                lambda found, unrec: ([dataclasses.replace(f, listing=None) for f in found], unrec)
            )(*real_discover(*a, **k)),
        )
        assert _report(root) == hinted
    monkeypatch.setattr(
        fm,
        "listing_types",
        lambda p: (lambda got: (got[0], set()) if got else got)(real_listing(p)),
    )
    assert _report(root) == hinted  # no hint: a stat before every open, as before
    monkeypatch.setattr(
        fm,
        "listing_types",
        lambda p: (lambda got: (got[0], set(got[0])) if got else got)(real_listing(p)),
    )
    assert _report(root) == hinted  # every name claimed regular: the fstat after the open decides


def test_read_small_with_the_hint_refuses_what_is_not_a_regular_file(tmp_path):
    """read_small(..., regular=True) skips the stat before the open only: a FIFO, a folder, a missing file are
    refused with the words of the stat-first path, and no descriptor is left open."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = _open_fds() if os.path.isdir("/proc/self/fd") else None
    for bad in (fifo, tmp_path, tmp_path / "gone", tmp_path / "a\0b"):
        with pytest.raises(storage.ReadError) as plain:
            storage.read_small(bad)
        with pytest.raises(storage.ReadError) as hinted:
            storage.read_small(bad, regular=True)
        assert hinted.value.reason == plain.value.reason and str(hinted.value) == str(plain.value)
    assert before is None or _open_fds() == before


def test_read_small_takes_a_file_that_shrank_as_it_is(tmp_path, monkeypatch):
    """One read of size + 1 bytes decides: a file that shrank since its fstat comes back open, read as it is."""
    p = tmp_path / "config.json"
    p.write_bytes(b'{"a": 1}')
    real_open_fd = storage._open_fd
    monkeypatch.setattr(
        storage,
        "_open_fd",
        lambda path, what, **kw: (lambda fd, size: (fd, size + 3))(*real_open_fd(path, what, **kw)),
    )
    got = storage.read_small(p, small=100)
    assert not isinstance(got, bytes)
    with got as fh:
        assert fh.read() == b'{"a": 1}'


def test_small_safetensors_read_whole_give_the_findings_of_the_file_path(tmp_path, monkeypatch):
    """A safetensors file up to ST_SMALL_BYTES is read in one read and its header sliced; ST_SMALL_BYTES = -1
    forces the file path. Same findings and bytes counted (and the same parsed header from safetensors_header, the
    index cross-check's reader) on a real file cut short anywhere and with a byte flipped anywhere."""
    from safetensors.torch import save_file

    src = tmp_path / "src.safetensors"
    save_file({"a": torch.ones(3, 5), "b": torch.zeros(2, dtype=torch.int64)}, str(src))
    data = src.read_bytes()
    bad = tmp_path / "bad.safetensors"

    def both():
        out = []
        for small in (zr.ST_SMALL_BYTES, -1):
            with monkeypatch.context() as m:
                m.setattr(zr, "ST_SMALL_BYTES", small)
                counter = zr.Counter()
                out.append(
                    (
                        [str(r) for r in fc.check_safetensors(str(bad), counter, regular=True)],
                        counter.bytes_read,
                        zr.safetensors_header(str(bad)),
                    )
                )
        return out

    seen, headers = set(), set()
    for cut in range(0, len(data) + 1):
        bad.write_bytes(data[:cut])
        fast, slow = both()
        assert fast == slow, cut
        seen.update(fast[0])
    for at in range(len(data)):
        flipped = bytearray(data)
        flipped[at] ^= 0x5A
        bad.write_bytes(bytes(flipped))
        fast, slow = both()
        assert fast == slow, at
        seen.update(fast[0])
        headers.add(fast[2] is None)
    assert len(seen) >= 5, seen
    assert headers == {True, False}  # flips the header reader refuses, and others it reads


@pytest.mark.parametrize(
    "text",
    ['{"a": NaN}', '\ufeff{"a": 1}', '{"a": Infinity}', '{"a": -Infinity}', "[1,", "", '{"a": 1}'],
)
def test_strict_json_decoder_built_once_says_what_json_loads_says(text):
    """loads_json without allow_nan uses one decoder built once: the same objects and the same reasons as
    json.loads(parse_constant=...) built per call (a byte-order mark, NaN/Infinity refused, syntax errors)."""
    import json

    def reference():
        try:
            return json.loads(text, parse_constant=storage._reject_constant), None
        except ValueError as exc:
            return None, f"not valid JSON ({storage._short(exc)})"

    want_obj, want_reason = reference()
    try:
        got = storage.loads_json(text.encode(), "x"), None
    except storage.ReadError as exc:
        got = None, exc.reason
    assert got == (want_obj, want_reason)


@pytest.mark.parametrize("small", [True, False])
def test_zip64_records_and_duplicate_names_read_the_same_from_memory(tmp_path, monkeypatch, small):
    """zip64 records (torch.save's zip64 end record; zip64 extras in every local header, as zipfile's
    force_zip64 writes them) are read whole as from the file, and valid; a duplicated name is named as before:
    the first name, in directory order, that appears twice."""
    import zipfile

    p = tmp_path / "z64.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, data in (
            ("archive/data.pkl", b"\x80\x02}q\x00."),
            ("archive/version", b"3\n"),
            ("archive/data/0", b"x" * 10),
        ):
            with zf.open(name, "w", force_zip64=True) as fh:
                fh.write(data)
    t = tmp_path / "torch.pt"
    torch.save({"w": torch.ones(3)}, t)
    assert (
        b"PK\x06\x06" in t.read_bytes() and b"\x01\x00\x10\x00" in p.read_bytes()
    )  # the records tested
    for path in (p, t):
        fast = _scan(path, monkeypatch, small)
        assert fast == _scan(path, monkeypatch, False) and fast[0] == [], fast
    z = fc.scan_zip(str(p), zr.Counter())
    assert z.entry("archive/data/0").data_start > 0 and z.entry("archive/data.pkl") is z.entries[0]

    d = tmp_path / "dup.pt"
    with (
        zipfile.ZipFile(d, "w", zipfile.ZIP_STORED) as zf,
        pytest.warns(UserWarning, match="Duplicate name"),
    ):
        for name in ("archive/data.pkl", "archive/a", "archive/b", "archive/b", "archive/a"):
            zf.writestr(name, b"\x80\x02}q\x00.")
    z = fc.scan_zip(str(d), zr.Counter())
    assert [str(f) for f in z.findings] == [
        "duplicate entry 'archive/a' in the central directory (torch.load would "
        "refuse or read the wrong one)"
    ]
    assert z.entry("archive/a") is z.entries[1]  # the first of that name


def test_an_empty_log_history_is_not_handed_to_the_adviser_and_says_what_it_says(
    tmp_path, monkeypatch
):
    """validate's spike check on a run whose newest trainer_state.json has an empty log_history: the same note as
    the adviser's, without loading the adviser (numpy); a log with entries (or log_history twice) still goes to
    it."""
    from checkpoint_strategy.recovery import advise
    from checkpoint_strategy.retention import safety

    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint-10").mkdir()
    log = run / "checkpoint-10" / "trainer_state.json"
    log.write_text('{"global_step": 10, "log_history": []}')
    valid = [(10, str(run / "checkpoint-10"))]
    calls = []

    def counting(*a, **kw):
        calls.append(a)
        return advise(*a, **kw)

    quick = safety.read_spike(valid, None, counting)
    assert calls == []
    with monkeypatch.context() as m:
        m.setattr(safety, "_no_log_entries", lambda log: False)
        assert safety.read_spike(valid, None, counting) == quick and len(calls) == 1
    for text in (
        '{"log_history": [], "log_history": [{"loss": 1.0, "step": 1}]}',
        '{"log_history": [{"loss": 1.0, "step": 1}]}',
        "[]",
        '{"log_history": {}}',
    ):
        log.write_text(text)
        assert not safety._no_log_entries(str(log)), text


def test_validate_of_a_run_without_log_entries_does_not_import_numpy(tmp_path):
    """The command's start-up on the quick path: no numpy when the spike check has no log entries to read."""
    import subprocess
    import sys

    from cliresult import checkout_env

    run = tmp_path / "run"
    _hf_checkpoint(run / "checkpoint-10")
    code = (
        "import sys; from checkpoint_strategy.cli.main import main; rc = main(['validate', sys.argv[1], '-o', "
        "sys.argv[2]]); print(rc, 'numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(run), str(tmp_path / "r.txt")],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )
    assert out.stdout.split("\n")[0] == "0 False", out.stdout + out.stderr
    assert "no log entries" in (tmp_path / "r.txt").read_text()


def test_an_entry_marked_a_folder_is_refused_as_torch_load_reads_nothing_from_it(tmp_path):
    """The MS-DOS folder bit (0x10) in an entry's external attributes: torch.load's reader takes the entry for a
    folder and reads no bytes from it (found by test_fuzz_corrupted_real_zip: validate passed such a file); a real
    folder entry (its name ends in '/', as zip tools write them) is left alone."""
    import io
    import zipfile

    p = tmp_path / "w.pt"
    torch.save({"w": torch.arange(6, dtype=torch.float32)}, p)
    data = bytearray(p.read_bytes())
    name = next(n for n in zipfile.ZipFile(p).namelist() if "/data/" in n)
    cd = data.index(name.encode(), data.index(name.encode()) + 1) - 46
    data[cd + 38 : cd + 42] = struct.pack("<I", 0x10)
    p.write_bytes(bytes(data))
    try:
        loaded = torch.load(io.BytesIO(bytes(data)), weights_only=True)
        same = torch.equal(loaded["w"], torch.arange(6, dtype=torch.float32))
    except Exception:  # noqa: BLE001 - any refusal is "not loadable"
        same = False
    assert not same  # the oracle: torch.load does not give the tensor back
    for small in (True, False):
        counter = zr.Counter()
        with pytest.MonkeyPatch.context() as m:
            if not small:
                m.setattr(zr, "SMALL_ZIP_BYTES", -1)
            z = fc.scan_zip(str(p), counter, full=not small)
        assert [str(f) for f in z.findings] == [
            f"entry {name!r} is marked a folder (external attributes "
            "0x00000010): torch.load reads no bytes from it"
        ]
    q = tmp_path / "with-folder.pt"
    with zipfile.ZipFile(q, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("archive/version", b"3\n")
        zf.mkdir("archive/data/")
    assert zipfile.ZipFile(q).getinfo("archive/data/").external_attr & 0x10
    assert [str(f) for f in fc.scan_zip(str(q), zr.Counter()).findings] == []


def test_run_folders_realpath_is_os_realpath(tmp_path, monkeypatch):
    """safety._realpath (the folder resolved once, one lstat per name) gives os.path.realpath's answer for plain
    names, a symlinked checkpoint, a symlinked folder on the way, a dangling link, a missing name, '..', a
    trailing slash and relative paths; and default_log picks the newest checkpoint's trainer_state.json."""
    from checkpoint_strategy.retention.safety import _realpath, default_log

    real = tmp_path / "real"
    (real / "checkpoint-1").mkdir(parents=True)
    (real / "checkpoint-2").mkdir()
    (tmp_path / "via").symlink_to(real)
    (real / "checkpoint-3").symlink_to(real / "checkpoint-1")
    (real / "checkpoint-4").symlink_to(tmp_path / "nowhere")
    (real / "loop").symlink_to(real / "loop")
    monkeypatch.chdir(tmp_path)
    cache: dict[str, str] = {}
    names = [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
        "checkpoint-9",
        "loop",
        "..",
        ".",
        "checkpoint-1/",
        "checkpoint-1/..",
        "name with\nnewline|x",
    ]
    for folder in (str(real), str(tmp_path / "via"), "via", "real", "./via/../via"):
        for name in names:
            p = os.path.join(folder, name)
            assert _realpath(p, cache) == os.path.realpath(p), p
    assert _realpath("checkpoint-1", cache) == os.path.realpath("checkpoint-1")
    for n in (1, 2):
        (real / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    valid = [
        (1, str(real / "checkpoint-1")),
        (2, str(real / "checkpoint-2")),
        (4, str(real / "checkpoint-4")),
    ]
    assert default_log(valid) == str(real / "checkpoint-2" / "trainer_state.json")
    assert default_log(valid[:1]) == str(real / "checkpoint-1" / "trainer_state.json")
    assert default_log([]) is None


def test_prune_survey_takes_from_the_validator_what_it_would_read_again(
    hf_run, tmp_path, monkeypatch
):
    """prune's survey reuses what validation just read (the listing of a folder of regular files and the sizes of
    the files read whole, the emergency marker, trainer_state.json's best_model_checkpoint) instead of reading
    it again: the survey is the same as one that reads everything again, on flat checkpoints, one with a
    subfolder, a link into another checkpoint, an emergency marker, a damaged trainer_state.json, a FIFO."""
    import json

    from checkpoint_strategy.formats.marker import write_marker
    from checkpoint_strategy.retention import survey as prune_survey
    from checkpoint_strategy.validate import engine as validate

    run = tmp_path / "run"
    src = hf_run.output_dir / "checkpoint-110"
    for step in (10, 20, 30, 40, 50, 60):
        shutil.copytree(src, run / f"checkpoint-{step}")
    state = json.loads((src / "trainer_state.json").read_text())
    state["best_model_checkpoint"] = str(run / "checkpoint-20")
    (run / "checkpoint-60" / "trainer_state.json").write_text(
        json.dumps(state)
    )  # the newest valid state: best now
    (run / "checkpoint-40" / "extra").mkdir()
    (run / "checkpoint-40" / "extra" / "notes.txt").write_text("x" * 123)
    (run / "checkpoint-50" / "training_args.bin").unlink()
    (run / "checkpoint-50" / "training_args.bin").symlink_to(
        run / "checkpoint-10" / "training_args.bin"
    )
    write_marker(str(run / "checkpoint-60"), event="loss_spike_detected", step=60)
    (run / "checkpoint-20" / "trainer_state.json").write_text("{not json")
    (run / "checkpoint-10" / "README.md").write_text("not read by the checker")
    os.mkfifo(run / "checkpoint-10" / "pipe")
    (run / "checkpoint-70").symlink_to(
        run / "checkpoint-60"
    )  # an entry of ROOT that is a link (lstat'ed)

    def picture(s):
        return (s.sizes, s.best, s.emergency, [repr(c) for c in s.candidates], s.notes)

    fresh = prune_survey.survey(str(run))
    assert (
        fresh.results["checkpoint-30"]._seen.flat_names
        and fresh.results["checkpoint-60"]._seen.marker
    )
    assert all(
        r.seen is r._seen for r in fresh.results.values()
    )  # the fast read is the private attribute
    assert "seen" not in fresh.results["checkpoint-30"].model_dump()
    assert fresh.results["checkpoint-10"]._seen.flat_names is None  # the FIFO: walked as before
    real_check = validate.check_with_values

    def forgetful(*a, **k):  # the results as they were before: nothing for the survey to take
        r, outcome = real_check(*a, **k)
        r._seen = None
        return r, outcome

    monkeypatch.setattr(prune_survey, "check_with_values", forgetful)
    again = prune_survey.survey(str(run))
    assert picture(fresh) == picture(again)
    assert "checkpoint-20" in fresh.best and "checkpoint-60" in fresh.emergency
    assert fresh.sizes["checkpoint-30"] == _walk_size(str(run / "checkpoint-30"))
    assert (
        "model.safetensors" in fresh.results["checkpoint-30"].seen.flat_unread
    )  # not read whole: its lstat counts
    assert fresh.results["checkpoint-30"].seen.flat_read > 0
    link = next(c for c in fresh.candidates if c.name == "checkpoint-70")
    assert (
        link.symlink and link.links_to == "checkpoint-60" and "checkpoint-70" not in fresh.results
    )
    linked = next(c for c in fresh.candidates if c.name == "checkpoint-50")
    assert linked.links_into and linked.links_into[0][0] == "checkpoint-10"


def test_discover_passes_what_it_listed_and_finds_what_identify_finds(tmp_path):
    """discover hands identify what its own listing saw (a folder: no stat; the names beside it: no lstat for
    NeMo's -unfinished marker) and hands an HF Trainer folder's listing on to the checker: each entry is found as
    identify finds it alone, a marker beside a folder included."""
    from checkpoint_strategy.formats import identify as fm

    root = tmp_path / "run"
    for name in ("checkpoint-10", "checkpoint-20", "step-30", "megatron_gpt--step=40.ckpt"):
        (root / name).mkdir(parents=True)
        (root / name / "trainer_state.json").write_text("{}")
    (root / "checkpoint-20-unfinished").write_text("")
    (root / "megatron_gpt--step=40-unfinished").write_text("")
    (root / "checkpoint-50").symlink_to(root / "checkpoint-10")
    found, _ = fm.discover(str(root))
    by_name = {os.path.basename(f.path): f for f in found}
    for name, f in by_name.items():
        alone = fm.identify(f.path)
        assert (f.format, f.step, f.is_dir) == (alone.format, alone.step, alone.is_dir), name
    assert (
        by_name["checkpoint-20"].format == "nemo"
        and by_name["megatron_gpt--step=40.ckpt"].format == "nemo"
    )
    assert by_name["checkpoint-10"].listing == (["trainer_state.json"], {"trainer_state.json"})
    # a link: discover does not list through it; identify lists it once and keeps that listing for the checker
    assert by_name["checkpoint-50"].listing == (["trainer_state.json"], {"trainer_state.json"})
    assert fm.identify(str(root / "checkpoint-10")).listing == by_name["checkpoint-10"].listing


@settings(max_examples=300, deadline=None)
@given(
    name=st.text(st.sampled_from("ab.-_/EMAckptnemo0"), min_size=1, max_size=16),
    folder=st.sampled_from(["", "run", "/abs/run", "a/b/"]),
)
def test_the_marker_name_discover_looks_for_is_the_marker_path_identify_looks_at(name, folder):
    """discover looks NeMo's -unfinished marker up by name among the names beside a folder (`unfinished_name`),
    identify alone by path (`unfinished_marker`): the same marker for every name a listing gives."""
    from checkpoint_strategy.formats import identify as fm

    assume("/" not in name and name not in (".", ".."))
    assert fm.unfinished_name(name) == os.path.basename(
        fm.unfinished_marker(os.path.join(folder, name))
    )


def test_an_archive_seen_before_gets_its_verdict_again_without_a_second_parse(
    archives, tmp_path, monkeypatch
):
    """The quick level keeps what it found in a small archive by its bytes (filechecks._SCANNED): a copy of
    an archive checked already gives the same findings, entries, pickle and bytes read without being parsed
    again, a damaged copy is parsed (its own findings), and the store stays bounded."""
    monkeypatch.setattr(fc, "_SCANNED", {})
    parsed: list[str] = []
    real = fc._scan_open_zip

    def counting(src, path, *args, **kwargs):
        parsed.append(path)
        return real(src, path, *args, **kwargs)

    monkeypatch.setattr(fc, "_scan_open_zip", counting)
    good = (archives / "scheduler.pt").read_bytes()
    damaged = good[:-10]  # cut short
    first = (
        b"\0" + good[1:]
    )  # the first local header broken: the same last bytes (the store's key) as `good`
    for i, data in enumerate((good, good, damaged, damaged, good, first)):
        (tmp_path / f"{i}.pt").write_bytes(data)
    got = [_scan(tmp_path / f"{i}.pt", monkeypatch, in_memory=True) for i in range(6)]
    assert parsed == [str(tmp_path / f"{i}.pt") for i in (0, 2, 5)]
    assert got[0] == got[1] == got[4] and got[0][0] == []
    assert got[2] == got[3] and got[2][0] and got[2][0] != got[0][0]
    assert got[5][0] and got[5][0] != got[2][0]
    assert got[5][:4] == _scan(tmp_path / "5.pt", monkeypatch, in_memory=False)[:4]
    # the same verdicts as a parse from the file
    assert got[1][:4] == _scan(tmp_path / "1.pt", monkeypatch, in_memory=False)[:4]
    assert got[3][:4] == _scan(tmp_path / "3.pt", monkeypatch, in_memory=False)[:4]
    monkeypatch.setattr(fc, "SCANNED_MAX", 2)
    for i in range(5):
        (tmp_path / f"o{i}.pt").write_bytes(good[:-22] + good[-22:-2] + bytes([0, i]))
        fc.scan_zip(str(tmp_path / f"o{i}.pt"), zr.Counter())
        assert len(fc._SCANNED) <= 2


def test_validate_checkpoint_given_a_path_lists_its_folder_once(tmp_path, monkeypatch):
    """validate_checkpoint(folder): identify's listing is the checker's (an HF Trainer folder is listed once, not
    once to identify it and again to check it), with the same verdict as the checker listing it itself."""
    from checkpoint_strategy.validate.engine import validate_checkpoint

    root = _damaged_run(tmp_path / "run")
    folder = str(next(p for p in sorted(root.iterdir()) if p.is_dir() and not p.is_symlink()))
    want = validate_checkpoint(folder)
    listed: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir
    monkeypatch.setattr(
        os, "scandir", lambda p=".": (listed.append(os.fspath(p)), real_scandir(p))[1]
    )
    monkeypatch.setattr(
        os, "listdir", lambda p=".": (listed.append(os.fspath(p)), real_listdir(p))[1]
    )
    got = validate_checkpoint(folder)
    assert listed.count(folder) == 1, listed
    assert got.model_dump() == want.model_dump() and got.status == "valid"
