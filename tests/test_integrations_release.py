"""release-gate: a release-readiness record for one real checkpoint."""

from __future__ import annotations

import hashlib
import json
import subprocess

import jsonschema
import pytest

from checkpoint_strategy.integrations.release import gate
from checkpoint_strategy.resources import load_schema
from cliresult import CLI, checkout_env

SCHEMA = load_schema("release-readiness.schema.json")


def record(cli_run, *argv) -> tuple[int, dict]:
    rc, out, err = cli_run("release-gate", *argv, "--format", "json")
    assert rc in (0, 1), err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    return rc, data


def newest(hf_run):
    """The newest checkpoint safe to release: checkpoint-110 (from 120 on the weights are spiked; see
    tests/test_checkpoints_safety.py for the gate failing those)."""
    return hf_run.output_dir / "checkpoint-110"


def test_real_hf_checkpoint_passes(hf_run, cli_run):
    ckpt = newest(hf_run)
    rc, data = record(cli_run, ckpt, "--require", "safetensors,full_state_dict,resumable")
    assert rc == 0 and data["gate"] == "pass" and data["reasons"] == []
    assert data["loads_ok"] and data["resumable"] and not data["sharded"]
    assert data["step"] == 110 and data["layout"] == "hf-trainer"
    assert data["integrity"] == "checksums"
    sums = {c["file"]: c["sha256"] for c in data["checksums"]}
    assert sums["model.safetensors"] == hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert set(sums) == {p.name for p in ckpt.iterdir() if p.is_file()}
    rc, text, _ = cli_run("release-gate", ckpt, "--require", "safetensors")
    assert rc == 0 and text.startswith("=== Release Gate: PASS ===")
    assert "  [x] checkpoint is whole" in text and "  [x] safetensors present: yes" in text
    rc, md, _ = cli_run("release-gate", ckpt, "--format", "markdown", "--level", "full")
    assert rc == 0 and md.startswith("### Release gate: PASS") and "- [x] checkpoint is whole" in md


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupted_copy_fails(hf_run, copy_of, damage, cli_run):
    ckpt = copy_of(newest(hf_run))
    target = ckpt / ("model.safetensors" if damage != "flip" else "optimizer.pt")
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif damage == "flip":
        raw = bytearray(target.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        target.write_bytes(bytes(raw))
    else:
        target.unlink()
    rc, data = record(cli_run, ckpt, "--level", "full")
    assert rc == 1 and data["gate"] == "fail" and not data["loads_ok"]
    assert data["reasons"] and data["checksums"] == []
    rc, text, _ = cli_run("release-gate", ckpt, "--level", "full")
    assert rc == 1 and "=== Release Gate: FAIL ===" in text and "  [ ] checkpoint is whole" in text


def test_required_format_missing_fails(dcp_checkpoint, safetensors_file, cli_run):
    rc, data = record(cli_run, dcp_checkpoint, "--require", "safetensors")
    assert rc == 1 and data["loads_ok"] and data["sharded"] and "sharded" in data["formats_present"]
    assert data["reasons"] == ["required format safetensors is missing (present: sharded)"]
    rc, data = record(cli_run, safetensors_file, "--require", "safetensors")
    assert rc == 0 and data["formats_present"] == ["safetensors"] and not data["resumable"]
    rc, data = record(cli_run, safetensors_file, "--require", "safetensors,resumable")
    assert rc == 1 and any("optimizer state" in r for r in data["reasons"])


def test_manifest_is_verified_when_present(hf_run, copy_of, cli_run):
    from checkpoint_strategy.checkpoints import validate_checkpoint

    ckpt = copy_of(newest(hf_run))
    assert validate_checkpoint(ckpt, manifest="write").manifest == "written"
    rc, data = record(cli_run, ckpt)
    assert rc == 0 and data["integrity"] == "manifest" and data["manifest"].endswith("integrity.json")
    assert data["checksums"] == [] and data["level"] == "full"
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text().replace("gpt2", "gpt3"))
    rc, data = record(cli_run, ckpt)
    assert rc == 1 and data["gate"] == "fail"


def test_python_api(hf_run):
    g = gate(newest(hf_run), require=["safetensors"])
    assert g.gate == "pass" and g.checks[0].ok


@pytest.mark.parametrize("argv, message", [
    (["release-gate"], "CHECKPOINT"),
    (["release-gate", "/no/such/checkpoint"], "no such file or folder"),
    (["release-gate", "x", "--require", "gguf"], "--require"),
    (["release-gate", "x", "--level", "deeper"], "--level"),
])
def test_bad_input_exit_2(cli_run, argv, message):
    rc, out, err = cli_run(*argv)
    assert rc == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_not_a_checkpoint_is_bad_input_not_a_failed_gate(tmp_path, hf_run, cli_run):
    """issue 9: a file that is no checkpoint, a device, a run folder: exit 2 with one line, no record."""
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    for target, words in ((junk, "not a recognised checkpoint"), ("/dev/zero", "character device"),
                          (hf_run.output_dir, "run folder holding")):
        rc, out, err = cli_run("release-gate", str(target), "--format", "json")
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err


def test_empty_safetensors_does_not_pass(tmp_path, cli_run):
    import struct

    empty = tmp_path / "model.safetensors"
    header = b'{"__metadata__":{"format":"pt"}}'
    empty.write_bytes(struct.pack("<Q", len(header)) + header)
    rc, data = record(cli_run, empty)
    assert rc == 1 and data["gate"] == "fail" and "no tensors" in data["reasons"][0]


def test_real_entry_point(hf_run):
    proc = subprocess.run([*CLI, "release-gate", str(newest(hf_run)),
                           "--require", "safetensors", "--format", "json"], capture_output=True, text=True,
                          timeout=120, env=checkout_env())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gate"] == "pass"
