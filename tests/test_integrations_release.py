"""release-gate: a release-readiness record for one real checkpoint."""

from __future__ import annotations

import hashlib
import json
import subprocess

import jsonschema
import pytest
from cliresult import CLI, checkout_env

from checkpoint_strategy.integrations.release import gate
from checkpoint_strategy.resources import load_schema

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
    assert (
        sums["model.safetensors"]
        == hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    )
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
    from checkpoint_strategy.validate import validate_checkpoint

    ckpt = copy_of(newest(hf_run))
    assert validate_checkpoint(ckpt, manifest="write").manifest == "written"
    rc, data = record(cli_run, ckpt)
    assert (
        rc == 0 and data["integrity"] == "manifest" and data["manifest"].endswith("integrity.json")
    )
    assert data["checksums"] == [] and data["level"] == "full"
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text().replace("gpt2", "gpt3"))
    rc, data = record(cli_run, ckpt)
    assert rc == 1 and data["gate"] == "fail"


def test_python_api(hf_run):
    g = gate(newest(hf_run), require=["safetensors"])
    assert g.gate == "pass" and g.checks[0].ok


@pytest.mark.parametrize(
    "argv, message",
    [
        (["release-gate"], "CHECKPOINT"),
        (["release-gate", "/no/such/checkpoint"], "no such file or folder"),
        (["release-gate", "x", "--require", "gguf"], "--require"),
        (["release-gate", "x", "--level", "deeper"], "--level"),
    ],
)
def test_bad_input_exit_2(cli_run, argv, message):
    rc, out, err = cli_run(*argv)
    assert rc == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_not_a_checkpoint_is_bad_input_not_a_failed_gate(tmp_path, hf_run, cli_run):
    """issue 9: a file that is no checkpoint, a device, a run folder: exit 2 with one line, no record."""
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    for target, words in (
        (junk, "not a recognised checkpoint"),
        ("/dev/zero", "character device"),
        (hf_run.output_dir, "run folder holding"),
    ):
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
    proc = subprocess.run(
        [*CLI, "release-gate", str(newest(hf_run)), "--require", "safetensors", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gate"] == "pass"


# --------------------------------------------------------------------------- what a release ships (issue 27)

HF_TRAINING_STATE = {
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "training_args.bin",
    "trainer_state.json",
}


def test_real_hf_checkpoint_lists_what_not_to_ship_and_the_release_set(hf_run, cli_run):
    """The Trainer's pickles and log are named as not for release, each with why; with --require safetensors the
    release set is the rest, and none of it is a pickle (a torch zip archive)."""
    import zipfile

    ckpt = newest(hf_run)
    rc, data = record(cli_run, ckpt, "--require", "safetensors")
    assert rc == 0
    excluded = {f["file"]: f["reason"] for f in data["not_for_release"]}
    on_disk = {p.name for p in ckpt.iterdir() if p.is_file()}
    assert set(excluded) == HF_TRAINING_STATE & on_disk and {
        "optimizer.pt",
        "training_args.bin",
    } <= set(excluded)
    assert (
        "pickle" in excluded["optimizer.pt"]
        and "weights_only=True" in excluded["training_args.bin"]
    )
    assert set(data["release_set"]) == on_disk - set(excluded)
    assert {"model.safetensors", "config.json"} <= set(data["release_set"])
    assert not any(zipfile.is_zipfile(ckpt / f) for f in data["release_set"])
    text = cli_run("release-gate", ckpt, "--require", "safetensors").out
    assert (
        "Not for release (" in text and f"Release set ({len(data['release_set'])} files): " in text
    )
    assert "  training_args.bin: TrainingArguments as a pickle" in text


def test_without_require_safetensors_no_release_set_but_the_pickles_are_listed(hf_run, cli_run):
    rc, data = record(cli_run, newest(hf_run))
    assert (
        rc == 0
        and data["release_set"] == []
        and {f["file"] for f in data["not_for_release"]} >= {"optimizer.pt"}
    )
    assert "Release set" not in cli_run("release-gate", newest(hf_run)).out


def test_pickled_weights_excluded_only_when_safetensors_are_there(tmp_path):
    from checkpoint_strategy.integrations.release import release_split

    excluded, keep = release_split(
        [
            "model.safetensors",
            "pytorch_model.bin",
            "config.json",
            "tokenizer.json",
            "optimizer.pt",
            "rng_state_3.pth",
            "global_step10/zero_pp_rank_0_mp_rank_00.pt",
        ]
    )
    assert keep == ["config.json", "model.safetensors", "tokenizer.json"]
    reasons = {e.file: e.reason for e in excluded}
    assert (
        "safetensors" in reasons["pytorch_model.bin"]
        and "sharded training state" in reasons["global_step10/zero_pp_rank_0_mp_rank_00.pt"]
    )
    excluded, keep = release_split(["pytorch_model.bin", "config.json", "scheduler.pt"])
    assert keep == ["config.json", "pytorch_model.bin"] and [e.file for e in excluded] == [
        "scheduler.pt"
    ]
    excluded, keep = release_split(
        ["epoch=0-step=10.ckpt"]
    )  # a Lightning checkpoint: never a release file
    assert keep == [] and "optimizer and loop state" in excluded[0].reason


def test_the_sample_run_checkpoint_names_its_release_set(tmp_path, cli_run, monkeypatch):
    """The README's sample (examples/make-example-run.py): the HF Trainer's five training-state files are named,
    the release set is config.json and model.safetensors."""
    from test_examples import build_inputs

    build_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, data = record(cli_run, "run/checkpoint-2000", "--require", "safetensors")
    assert rc == 0 and {f["file"] for f in data["not_for_release"]} == HF_TRAINING_STATE
    assert data["release_set"] == ["config.json", "model.safetensors"]


def test_a_file_name_cannot_forge_a_release_line(hf_run, copy_of, cli_run):
    ckpt = copy_of(newest(hf_run))
    (ckpt / "x.pt\n  model.safetensors: forged").write_bytes(b"not a pickle")
    rc, out, err = cli_run("release-gate", ckpt, "--require", "safetensors")
    assert "\n  model.safetensors: forged" not in out and "forged" in out, out


def test_release_notes_name_the_missing_tokenizer_and_the_trainers_eval_best(
    tmp_path, cli_run, monkeypatch
):
    """Issue 42: the sample checkpoint has no tokenizer: the record says a Hub release needs one (and stops saying
    so once tokenizer files are there); trainer_state.json's best_model_checkpoint is named, this one or another."""
    from test_examples import build_inputs

    build_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "run" / "checkpoint-2000"
    rc, data = record(cli_run, "run/checkpoint-2000", "--require", "safetensors")
    assert (
        rc == 0
        and len(data["notes"]) == 1
        and data["notes"][0].startswith("no tokenizer files in the release set")
    )
    assert (
        "Hub release"
        in cli_run("release-gate", "run/checkpoint-2000", "--require", "safetensors").out
    )
    # without --require safetensors there is no release set to judge: no tokenizer note
    assert record(cli_run, "run/checkpoint-2000")[1]["notes"] == []
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state.update(best_model_checkpoint="out/checkpoint-2000", best_metric=0.41)
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (ckpt / "tokenizer.json").write_text("{}")
    (ckpt / "tokenizer_config.json").write_text("{}")
    rc, data = record(cli_run, "run/checkpoint-2000", "--require", "safetensors")
    assert "tokenizer.json" in data["release_set"]
    assert data["notes"] == [
        "this checkpoint is the trainer's eval-best (best_metric 0.41): best_model_checkpoint "
        "in trainer_state.json"
    ]
    state.update(best_model_checkpoint="out/checkpoint-1000")
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    rc, data = record(cli_run, "run/checkpoint-2000", "--require", "safetensors")
    assert data["notes"][0].startswith(
        "not the trainer's eval-best: trainer_state.json names checkpoint-1000"
    )
