"""`validate --part K/N` and validate/parts.py: the split of one checkpoint's files into N parts
(the callbacks' per-rank validation uses the same split). The parts are a partition of the files,
balanced by bytes and the same in every process; the verdict over the parts (valid only when every
part is; problems = the union) equals one process's `validate --level full`, on real checkpoints
with and without damage."""

from __future__ import annotations

import os
import random
import zipfile

import pytest

from checkpoint_strategy.formats.manifest import list_files
from checkpoint_strategy.validate import parts


def test_assign_is_a_balanced_deterministic_partition():
    rng = random.Random(3)
    for _ in range(200):
        files = {
            f"d{rng.randint(0, 3)}/f {i}|x": rng.choice([0, 1, rng.randint(1, 10**9)])
            for i in range(rng.randint(0, 40))
        }
        n = rng.randint(1, 9)
        owner = parts.assign(files, n)
        assert set(owner) == set(files) and set(owner.values()) <= set(range(n))
        assert owner == parts.assign(
            dict(reversed(list(files.items()))), n
        )  # listing order does not matter
        loads = [sum(s for f, s in files.items() if owner[f] == k) for k in range(n)]
        assert max(loads) - min(loads) <= max(
            files.values(), default=0
        )  # within one file of each other


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1/0", "a/b", "2", "1/2/3", "-1/2", "1/100001"])
def test_bad_part_exit_2_with_one_line(cli_run, tmp_path, bad):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    cli_run("validate", str(tmp_path), "--part", bad).usage_error("--part")


@pytest.mark.parametrize("other", [["--level", "deep"], ["--manifest", "verify"]])
def test_part_refuses_deep_and_manifest(cli_run, tmp_path, other):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    cli_run("validate", str(tmp_path), "--part", "1/2", *other).usage_error("--part")


def _parts_verdict(cli_run, path, n: int) -> tuple[str, set]:
    statuses, problems = [], set()
    for k in range(1, n + 1):
        res = cli_run("validate", str(path), "--part", f"{k}/{n}", "--format", "json")
        assert res.rc in (0, 1), res.err
        c = res.json()["checkpoints"][0]
        assert c["level"] == "full" and any(f"part {k}/{n}" in note for note in c["notes"])
        statuses.append(c["status"])
        problems |= {(p["file"], p["reason"]) for p in c["problems"]}
    worst = (
        "invalid"
        if "invalid" in statuses
        else "incomplete"
        if "incomplete" in statuses
        else "valid"
    )
    return worst, problems


def _whole(cli_run, path) -> tuple[str, set]:
    c = cli_run("validate", str(path), "--level", "full", "--format", "json").json()["checkpoints"][
        0
    ]
    return c["status"], {(p["file"], p["reason"]) for p in c["problems"]}


def _flip_in_member(path, member_suffix=None) -> None:
    """Flip one byte in the middle of the largest stored member of a torch zip (only its CRC tells)."""
    import struct

    with zipfile.ZipFile(path) as z:
        info = max(
            (i for i in z.infolist() if not i.filename.endswith(".pkl")),
            key=lambda i: i.compress_size,
        )
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset)
        n, m = struct.unpack("<HH", fh.read(30)[26:30])
        at = info.header_offset + 30 + n + m + info.compress_size // 2
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_parts_cover_every_file_once(dcp_sharded):
    files = set(list_files(str(dcp_sharded)))
    assert len([f for f in files if f.endswith(".distcp")]) == 4
    for n in range(1, 6):
        seen = [set(parts.split(str(dcp_sharded), k, n).files()) for k in range(n)]
        assert set().union(*seen) == files and sum(map(len, seen)) == len(files)


@pytest.mark.parametrize("damage", ["none", "truncate", "remove", "flip", "metadata"])
def test_parts_verdict_equals_whole_on_a_4_shard_dcp(cli_run, copy_of, dcp_sharded, damage):
    path = copy_of(dcp_sharded)
    shard = path / "__0_2.distcp"
    if damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    elif damage == "remove":
        shard.unlink()
    elif (
        damage == "flip"
    ):  # the items of a .distcp are torch archives: their CRC-32 tells at full, whole or split
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "metadata":
        (path / ".metadata").write_bytes(b"\x80\x04garbage")
    whole = _whole(cli_run, path)
    for n in (2, 3, 4):
        assert _parts_verdict(cli_run, path, n) == whole, (damage, n)
    assert (whole[0] == "valid") == (damage == "none")


@pytest.mark.parametrize("target", ["optimizer.pt", "rng_state.pth", "model.safetensors"])
def test_parts_verdict_equals_whole_on_an_hf_checkpoint(cli_run, copy_of, hf_run, target):
    path = copy_of(hf_run.output_dir / f"checkpoint-{hf_run.checkpoint_steps[-1]}")
    if target.endswith((".pt", ".pth")):
        _flip_in_member(path / target)  # found by the part that reads it (zip CRC-32)
    else:
        os.truncate(path / target, (path / target).stat().st_size - 7)  # found by every part (size)
    whole = _whole(cli_run, path)
    assert whole[0] != "valid"
    for n in (2, 4):
        assert _parts_verdict(cli_run, path, n) == whole
    if target.endswith((".pt", ".pth")):  # exactly one part of two sees a flipped byte
        seen = [cli_run("validate", str(path), "--part", f"{k}/2").rc for k in (1, 2)]
        assert sorted(seen) == [0, 1]
