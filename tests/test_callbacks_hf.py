"""HFCheckpointStrategy on real tiny HF Trainer runs (CPU): retention, corruption, emergency saves,
NaN, resume from last_valid_checkpoint with the optimizer state."""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import shutil
from pathlib import Path

import callbackruns
import pytest

from checkpoint_strategy.callbacks import last_valid_checkpoint
from checkpoint_strategy.formats.marker import MARKER_NAME, read_marker
from checkpoint_strategy.recovery import advise
from checkpoint_strategy.retention import prune as _prune
from checkpoint_strategy.validate import validate_checkpoint

prune = functools.partial(
    _prune, advise=advise
)  # as prune_cli and the callbacks call it (the adviser is passed in)

pytestmark = pytest.mark.slow

TRIGGERS = ["loss_spike_detected", "gradient_norm_exceeded"]


@pytest.fixture(scope="module")
def retention_run(tmp_path_factory):
    """every 10 steps, keep_last 2, milestones 20 and 35 (35 is off the interval), a best that is the
    oldest checkpoint; 60 steps, validation inline."""
    root = tmp_path_factory.mktemp("cb-hf-ret")
    policy = {
        "frequency": "every_10_steps",
        "keep_last": 2,
        "keep_milestone": [20, 35],
        "async_save": False,
    }
    cb, trainer = callbackruns.hf_train(
        root / "out", policy, max_steps=60, best_oldest=True, handoff_dir=str(root / "state")
    )
    return root / "out", cb, trainer


@pytest.fixture(scope="module")
def spike_run(tmp_path_factory):
    """keep_last 1, async validation; checkpoint-30 truncated right after its save; weights blown up at
    the end of step 45 (the loss logged at step 46 spikes and never recovers)."""
    root = tmp_path_factory.mktemp("cb-hf-spike")
    out = root / "out"
    seen = {}

    def corrupt(path):
        if path.endswith("checkpoint-30"):
            listing = sorted(os.listdir(out))
            seen["before"] = listing
            with open(os.path.join(path, "model.safetensors"), "r+b") as fh:
                fh.truncate(100)

    policy = {
        "frequency": "every_10_steps",
        "keep_last": 1,
        "emergency_save_on": TRIGGERS,
        "async_save": True,
    }
    cb, trainer = callbackruns.hf_train(
        out,
        policy,
        max_steps=60,
        spike_step=45,
        hooks={"after_save_hook": corrupt},
        handoff_dir=str(root / "state"),
    )
    return out, cb, root / "state", seen


def test_framework_rotation_off_and_interval_from_policy(retention_run):
    out, cb, trainer = retention_run
    assert trainer.args.save_total_limit is None
    assert (
        trainer.args.save_steps == 10
        and str(getattr(trainer.args.save_strategy, "value", "")) == "steps"
    )


def test_milestones_best_and_keep_last_survive(retention_run):
    out, cb, trainer = retention_run
    best = os.path.basename(trainer.state.best_model_checkpoint)
    best_step = int(best.split("-")[1])
    assert best_step not in (50, 60, 20), "the test wants a best outside keep_last and milestones"
    assert callbackruns.steps_in(out) == sorted({best_step, 20, 35, 50, 60})
    assert all(
        validate_checkpoint(out / f"checkpoint-{s}").status == "valid"
        for s in callbackruns.steps_in(out)
    )
    assert [r.step for r in cb.core.records] == [10, 20, 30, 35, 40, 50, 60]
    assert all(r.status == "valid" for r in cb.core.records)
    assert cb.core.records[-1].kept_reasons  # the keep reasons of the last prune are recorded


def test_handoff_written_at_end(retention_run):
    out, cb, trainer = retention_run
    doc = json.loads((out.parent / "state" / "checkpoint-strategy.json").read_text())
    assert doc["latest_valid_checkpoint"]["path"].endswith("checkpoint-60")
    assert doc["checkpoints_root"] == str(out)


def test_resume_from_last_valid_skips_half_written_newest(retention_run, tmp_path):
    import torch

    src, _cb, _tr = retention_run
    out = tmp_path / "out"
    shutil.copytree(src, out)
    (out / "checkpoint-60" / "trainer_state.json").unlink()  # the newest save did not finish
    ckpt = last_valid_checkpoint(out)
    assert ckpt == str(out / "checkpoint-50")
    saved = torch.load(
        Path(ckpt) / "optimizer.pt", weights_only=True
    )  # tests may load to cross-check
    seen = {}
    from transformers import TrainerCallback

    class Peek(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kw):
            if "step" not in seen:
                seen["step"] = state.global_step
                opt = getattr(optimizer, "optimizer", optimizer)
                seen["state"] = copy.deepcopy(opt.state_dict()["state"])  # live tensors: copy now
            return control

    policy = {"frequency": "every_10_steps", "keep_last": 2, "async_save": False}
    cb, trainer = callbackruns.hf_train(
        out, policy, max_steps=60, resume=ckpt, extra_callbacks=[Peek()], handoff_dir=None
    )
    assert seen["step"] == 50
    k = next(iter(saved["state"]))
    assert torch.equal(seen["state"][k]["exp_avg"], saved["state"][k]["exp_avg"])
    assert seen["state"][k]["exp_avg"].abs().sum() > 0  # Adam moments restored, not zero
    assert int(seen["state"][k]["step"]) == 50
    # the resumed run saved a fresh, whole checkpoint-60 over the broken one
    assert validate_checkpoint(out / "checkpoint-60").status == "valid"


def test_corrupted_save_is_reported_kept_and_deletes_nothing(spike_run, caplog):
    out, cb, state, seen = spike_run
    rec = {r.step: r for r in cb.core.records}
    assert rec[30].status == "invalid" and "model.safetensors" in rec[30].problem
    assert rec[30].deleted == []
    assert "checkpoint-20" in seen["before"]  # keep_last 1 would have removed it at this save
    # checkpoint-20 went only once a newer checkpoint than the broken one had validated (which job did
    # it depends on how far the background worker lags behind the saves)
    killer = next(r for r in cb.core.records if "checkpoint-20" in r.deleted)
    newest = [
        n for n, why in killer.kept_reasons.items() if any(w.startswith("newest") for w in why)
    ]
    assert newest and int(newest[0].split("-")[1]) >= 40, killer
    assert (out / "checkpoint-30").is_dir()  # kept for inspection
    assert any("checkpoint-30" in p and "INVALID" in p for p in cb.core.problems)
    doc = json.loads((state / "checkpoint-strategy.json").read_text())
    assert any("checkpoint-30" in r and "training callback" in r for r in doc["pending_risks"])


def test_spike_makes_exactly_one_marked_emergency_save(spike_run):
    out, cb, _state, _seen = spike_run
    emergency = [r for r in cb.core.records if r.emergency]
    assert [(r.step, r.emergency) for r in emergency] == [(46, "loss_spike_detected")]
    mark = json.loads((out / "checkpoint-46" / MARKER_NAME).read_text())
    assert (
        mark["kind"] == "emergency"
        and mark["event"] == "loss_spike_detected"
        and mark["step"] == 46
    )
    # keep_last 1 + the rollback point of the unrecovered spike + the emergency save + the invalid one
    assert callbackruns.steps_in(out) == [30, 40, 46, 60]
    note = validate_checkpoint(out / "checkpoint-46").notes
    assert any("emergency save" in n and "not a resume point" in n for n in note)


def test_recover_and_prune_honour_the_marker(spike_run, copy_of):
    from checkpoint_strategy.recovery import advise

    out, _cb, _state, _seen = spike_run
    rep = advise(str(out / "checkpoint-60" / "trainer_state.json"), checkpoints=str(out))
    assert rep.status in ("wait", "rollback") and rep.resume_checkpoint.step == 40
    from checkpoint_strategy.formats.steps import scan

    assert 46 not in [s for s, _p in scan(out)] and 40 in [s for s, _p in scan(out)]
    root = copy_of(out, "copy")
    shutil.rmtree(root / "checkpoint-30")
    report = prune(root, keep_last=1)
    reasons = report.reasons["checkpoint-46"]
    assert any("emergency save" in r and "kept until" in r for r in reasons)
    # checkpoint-60 holds post-spike weights: the newest checkpoint safe to resume from is checkpoint-40
    assert report.newest_valid == "checkpoint-40"
    # once the spike's status is ignored, the emergency save is an ordinary old checkpoint
    report = prune(root, keep_last=1, spike_check=False)
    assert "checkpoint-46" in [e.name for e in report.delete]


def test_last_valid_checkpoint_never_returns_an_emergency_save(spike_run, copy_of):
    out, _cb, _s, _seen = spike_run
    root = copy_of(out, "copy")
    shutil.rmtree(root / "checkpoint-60")
    assert last_valid_checkpoint(root) == str(root / "checkpoint-40")
    assert last_valid_checkpoint(root, include_emergency=True) == str(root / "checkpoint-46")
    assert read_marker(root / "checkpoint-40") is None


def test_nan_loss_triggers_no_emergency_save(tmp_path, caplog):
    policy = {"frequency": "every_10_steps", "keep_last": 2, "emergency_save_on": TRIGGERS}
    with caplog.at_level(logging.WARNING, logger="checkpoint_strategy.callbacks"):
        cb, trainer = callbackruns.hf_train(
            tmp_path / "out", policy, max_steps=50, nan_step=40, handoff_dir=None
        )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert any(v != v for v in losses), "the run must really log NaN losses"
    assert not any(r.emergency for r in cb.core.records)
    assert not any((p / MARKER_NAME).exists() for p in (tmp_path / "out").glob("checkpoint-*"))
    assert any("NaN/inf" in m and "no emergency save" in m for m in caplog.messages)


def test_handoff_every_n_saves_and_unwritable_marker(retention_run, tmp_path):
    from checkpoint_strategy.callbacks._detector import Flag
    from checkpoint_strategy.callbacks.core import StrategyCore

    src, _cb, _tr = retention_run
    root = tmp_path / "out"
    shutil.copytree(src, root)
    state = tmp_path / "state"
    core = StrategyCore(
        {"frequency": "every_10_steps", "keep_last": 2}, handoff_dir=str(state), handoff_every=1
    )
    core.root = str(root)
    core.saved(str(root / "checkpoint-60"), 60)
    doc = json.loads((state / "checkpoint-strategy.json").read_text())
    assert doc["latest_valid_checkpoint"]["path"].endswith("checkpoint-60")
    blocker = tmp_path / "not-a-folder"  # the marker cannot be written (works as root too)
    blocker.write_text("x")
    ok = core.mark_emergency(
        str(blocker / "checkpoint-46"), Flag("loss_spike_detected", 46, 9.0, 1.0)
    )
    assert ok is False and any(
        "skipped" in p and "cannot write its marker" in p for p in core.problems
    )


def test_hostile_folder_names_and_a_symlink_inside(retention_run, tmp_path):
    """Spaces, '|' and a newline in the run folder; a symlinked checkpoint pointing outside."""
    from checkpoint_strategy.callbacks.core import StrategyCore

    src, _cb, _tr = retention_run
    root = tmp_path / "my run |x\nnew"
    shutil.copytree(src, root)
    outside = tmp_path / "outside"
    shutil.copytree(root / "checkpoint-20", outside)
    os.symlink(outside, root / "checkpoint-5")  # older than everything: prune would pick it
    core = StrategyCore(
        {"frequency": "every_10_steps", "keep_last": 1}, handoff_dir=str(tmp_path / "st")
    )
    core.root = str(root)
    core.saved(str(root / "checkpoint-60"), 60)
    rec = core.records[-1]
    assert rec.status == "valid" and "checkpoint-50" in rec.deleted
    assert (
        root / "checkpoint-5"
    ).is_symlink() and outside.is_dir()  # never followed, never deleted
    core.end()
    assert json.loads((tmp_path / "st" / "checkpoint-strategy.json").read_text())[
        "checkpoints_root"
    ] == str(root)
    assert last_valid_checkpoint(root) == str(root / "checkpoint-60")


def test_prune_protect_keeps_named_checkpoints(spike_run, copy_of):
    """prune(protect=...) is how the Lightning callback keeps ModelCheckpoint's best_model_path."""
    out, _cb, _s, _seen = spike_run
    root = copy_of(out, "copy")
    report = prune(
        root,
        keep_last=1,
        spike_check=False,
        protect={"checkpoint-40": "ModelCheckpoint best_model_path"},
    )
    assert "ModelCheckpoint best_model_path" in report.reasons["checkpoint-40"]
    assert "checkpoint-40" in [e.name for e in report.keep]
    report = prune(root, keep_last=1, spike_check=False)
    assert "checkpoint-40" in [e.name for e in report.delete]
