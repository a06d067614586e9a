"""LightningCheckpointStrategy on real tiny pytorch_lightning runs (CPU)."""

from __future__ import annotations

import json
import os
import shutil

import callbackruns
import pytest

from checkpoint_strategy.callbacks import last_valid_checkpoint
from checkpoint_strategy.formats.marker import MARKER_SUFFIX
from checkpoint_strategy.validate import validate_checkpoint

pytestmark = pytest.mark.slow
TRIGGERS = ["loss_spike_detected", "gradient_norm_exceeded"]
EMERGENCY = "epoch=0-step=46-emergency.ckpt"


@pytest.fixture(scope="module")
def pl_run(tmp_path_factory):
    """every 10 steps, keep_last 2, milestone 25; step 30's file truncated right after its save; the
    weights blown up at the end of step 45 (no recovery by step 60); validation in the background."""
    root = tmp_path_factory.mktemp("cb-pl")
    ckpts = root / "ckpts"
    seen = {}

    def corrupt(path):
        if path.endswith("step=30.ckpt"):
            seen["before"] = callbackruns.lightning_steps(ckpts)
            with open(path, "r+b") as fh:
                fh.truncate(os.path.getsize(path) // 2)

    policy = {
        "frequency": "every_10_steps",
        "keep_last": 2,
        "keep_milestone": [25],
        "emergency_save_on": TRIGGERS,
        "async_save": True,
    }
    cb, trainer, _m = callbackruns.lightning_train(
        ckpts,
        policy,
        max_steps=60,
        spike_step=45,
        spike_scale=10.0,
        hooks={"after_save_hook": corrupt},
        handoff_dir=str(root / "state"),
    )
    return ckpts, cb, trainer, root / "state", seen


def test_model_checkpoint_configured(pl_run):
    _d, cb, trainer, _s, _seen = pl_run
    mc = trainer.checkpoint_callback
    assert mc.save_top_k == -1 and mc._every_n_train_steps == 10


def test_retention_emergency_and_corruption(pl_run):
    ckpts, cb, _t, state, seen = pl_run
    names = callbackruns.lightning_steps(ckpts)
    # milestone 25, invalid 30 (kept), rollback point 40, the emergency save, keep_last 2 = 50 and 60
    assert names == sorted(
        [
            "epoch=0-step=25.ckpt",
            "epoch=0-step=30.ckpt",
            "epoch=0-step=40.ckpt",
            EMERGENCY,
            "epoch=0-step=50.ckpt",
            "epoch=0-step=60.ckpt",
        ]
    )
    rec = {os.path.basename(r.path): r for r in cb.core.records}
    assert (
        rec["epoch=0-step=30.ckpt"].status == "invalid"
        and rec["epoch=0-step=30.ckpt"].deleted == []
    )
    assert validate_checkpoint(ckpts / "epoch=0-step=30.ckpt").status == "invalid"
    emergency = [r for r in cb.core.records if r.emergency]
    assert [(os.path.basename(r.path), r.emergency) for r in emergency] == [
        (EMERGENCY, "loss_spike_detected")
    ]
    mark = json.loads((ckpts / (EMERGENCY + MARKER_SUFFIX)).read_text())
    assert (mark["kind"], mark["event"], mark["step"]) == ("emergency", "loss_spike_detected", 46)
    doc = json.loads((state / "checkpoint-strategy.json").read_text())
    assert any("step=30" in r for r in doc["pending_risks"])


def test_recover_does_not_choose_the_emergency_save(pl_run):
    from checkpoint_strategy.recovery import advise

    ckpts, _cb, _t, _s, _seen = pl_run
    rep = advise(str(ckpts / ".checkpoint-strategy-metrics.jsonl"), checkpoints=str(ckpts))
    assert rep.status in ("wait", "rollback")
    assert rep.resume_checkpoint.step == 40 and "emergency" not in (
        rep.resume_checkpoint.path or ""
    )


def test_torn_newest_skipped_and_fit_resumes_with_optimizer_state(pl_run, tmp_path):
    import copy

    import pytorch_lightning as pl
    import torch

    src, _cb, _t, _s, _seen = pl_run
    ckpts = tmp_path / "ckpts"
    shutil.copytree(src, ckpts)
    newest = ckpts / "epoch=0-step=60.ckpt"
    with open(newest, "r+b") as fh:  # torn write of the newest file
        fh.truncate(os.path.getsize(newest) - 200)
    # the weights blew up at step 45 (unrecovered): the callback's loss log beside the checkpoints says so, and the
    # newest checkpoint before it is the resume point (issue 39: it was 50); the torn 60 is skipped either way
    assert last_valid_checkpoint(ckpts) == str(ckpts / "epoch=0-step=40.ckpt")
    ckpt = last_valid_checkpoint(ckpts, spike_check=False)
    assert ckpt == str(ckpts / "epoch=0-step=50.ckpt")
    saved = torch.load(ckpt, weights_only=False)["optimizer_states"][0]["state"]  # cross-check only
    seen = {}

    class Peek(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            if "step" not in seen:
                seen["step"] = trainer.global_step
                seen["state"] = copy.deepcopy(trainer.optimizers[0].state_dict()["state"])

    policy = {"frequency": "every_10_steps", "keep_last": 2}
    callbackruns.lightning_train(
        ckpts, policy, max_steps=60, resume=ckpt, extra_callbacks=[Peek()], handoff_dir=None
    )
    assert seen["step"] == 50
    k = next(iter(saved))
    assert (
        torch.equal(seen["state"][k]["exp_avg"], saved[k]["exp_avg"])
        and saved[k]["exp_avg"].abs().sum() > 0
    )


def test_save_checkpoint_unwrapped_after_fit(pl_run):
    _d, _cb, trainer, _s, _seen = pl_run
    assert "save_checkpoint" not in vars(trainer)


def test_best_model_path_survives_keep_last(tmp_path):
    """ModelCheckpoint(monitor=..., mode="max") on the training loss: its best is the worst loss, an early
    checkpoint that keep_last=1 would otherwise delete. The monitoring ModelCheckpoint is left as set
    (save_top_k=1: only its best is a best; widened to -1 every file it saved would be one)."""
    ckpts = tmp_path / "ckpts"
    policy = {"frequency": "every_10_steps", "keep_last": 1}
    cb, trainer, _m = callbackruns.lightning_train(
        ckpts, policy, max_steps=40, monitor="train_loss", monitor_every=10, handoff_dir=None
    )
    mc = trainer.checkpoint_callback
    best = os.path.basename(mc.best_model_path)
    assert mc.save_top_k == 1 and best and not best.startswith("epoch=0-step=40")
    left = callbackruns.lightning_steps(ckpts)
    assert best in left and "epoch=0-step=40.ckpt" in left and len(left) == 2
    assert any(
        "best_model_path" in " ".join(r) or "top-k" in " ".join(r)
        for r in cb.core.records[-1].kept_reasons.values()
    )


def test_async_checkpoint_io_validated_after_the_write(tmp_path):
    """With AsyncCheckpointIO the save returns before the file is written; the callback validates
    only after the plugin's writer thread finished it."""
    from pytorch_lightning.plugins.io import AsyncCheckpointIO

    ckpts = tmp_path / "ckpts"
    policy = {"frequency": "every_10_steps", "keep_last": 2, "async_save": True}
    cb, _t, _m = callbackruns.lightning_train(
        ckpts, policy, max_steps=40, plugins=[AsyncCheckpointIO()], handoff_dir=None
    )
    # "gone": pruned by an earlier job before its own validation ran (the worker starts slowly)
    assert len(cb.core.records) == 4 and not cb.core.problems
    assert {r.status for r in cb.core.records} <= {"valid", "gone"} and cb.core.records[
        -1
    ].status == "valid"
    assert callbackruns.lightning_steps(ckpts) == ["epoch=0-step=30.ckpt", "epoch=0-step=40.ckpt"]


def test_nan_loss_triggers_no_emergency_save(tmp_path, caplog):
    """Lightning: every weight NaN after step 25, so every later loss is NaN: a NaN state is never saved
    as an emergency checkpoint (the HF twin is in test_callbacks_hf.py)."""
    import logging

    ckpts = tmp_path / "ckpts"
    policy = {"frequency": "every_10_steps", "keep_last": 2, "emergency_save_on": TRIGGERS}
    with caplog.at_level(logging.WARNING, logger="checkpoint_strategy.callbacks"):
        cb, trainer, module = callbackruns.lightning_train(
            ckpts, policy, max_steps=40, nan_step=25, handoff_dir=None
        )
    assert all(p.isnan().all() for p in module.parameters()), "the run must really hold NaN weights"
    assert not any(r.emergency for r in cb.core.records)
    assert not [n for n in os.listdir(ckpts) if "emergency" in n or n.endswith(MARKER_SUFFIX)]
    assert any("NaN/inf" in m and "no emergency save" in m for m in caplog.messages)


def test_join_timeout_is_reported_at_the_end(tmp_path, caplog):
    """Background validation still running when training ends (the worker lingers 3 s per phase, the
    join timeout is 0.5 s): the end says so, as an ERROR line and one of the run's problems."""
    import logging

    policy = {"frequency": "every_10_steps", "keep_last": 2, "async_save": True}
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        cb, _trainer, _m = callbackruns.lightning_train(
            tmp_path / "ckpts",
            policy,
            max_steps=20,
            join_timeout=0.5,
            hooks={"phase_delay": 3.0},
            handoff_dir=None,
        )
    line = "validation of the last saves did not finish within 0.5 s"
    assert any(line in p for p in cb.core.problems), cb.core.problems
    assert any(r.levelno == logging.ERROR and line in r.getMessage() for r in caplog.records)
    assert any("end of training" in m for m in caplog.messages)


def test_export_plus_callback_leaves_the_milestone_checkpointer_alone(tmp_path):
    """Exactly what `export --framework lightning` prints, plus LightningCheckpointStrategy as its notes
    recommend: the milestone ModelCheckpoint keeps its period and its files, no false errors."""
    import realruns

    from checkpoint_strategy.callbacks import LightningCheckpointStrategy
    from checkpoint_strategy.export import export_plan, render_export
    from checkpoint_strategy.planning.options import validate_arguments
    from checkpoint_strategy.planning.planner import plan

    report = plan(
        validate_arguments(
            {
                "step_seconds": 1.0,
                "budget_gb": 10.0,
                "total_steps": 40,
                "frequency": 5,
                "keep_last": 2,
                "milestones": [10, 20, 30, 40],
            }
        )
    )
    export = export_plan(report, "lightning", None)
    code = render_export(export, "python")
    assert "LightningCheckpointStrategy" in code and "milestones_kwargs" in code
    ns: dict = {}
    exec(compile(code, "exported", "exec"), ns)  # our own emitted settings
    cb = LightningCheckpointStrategy(report, handoff_dir=None)
    mcs = []

    def callbacks(dirpath):
        mcs.extend(ns["checkpoint_callbacks"](dirpath))
        return [*mcs, cb]

    run = realruns.run_lightning_with_callbacks(
        tmp_path, callbacks, max_steps=40, plugins=ns["trainer_plugins"]()
    )
    assert cb.core.problems == []
    milestone = next(m for m in mcs if m.filename == "milestone-{step}")
    assert (milestone._every_n_train_steps, milestone.save_top_k) == (10, -1)  # left alone
    assert [n for n in run.names if n.startswith("milestone-") and n.endswith(".ckpt")] == [
        f"milestone-step={s}.ckpt" for s in (10, 20, 30, 40)
    ]
    rolling = sorted(n for n in run.names if n.startswith("step=") and n.endswith(".ckpt"))
    assert rolling == [
        "step=10.ckpt",
        "step=20.ckpt",
        "step=30.ckpt",
        "step=35.ckpt",
        "step=40.ckpt",
    ]
    deleted = {d for r in cb.core.records for d in r.deleted}
    assert all(
        r.status == "valid" or (r.status == "gone" and os.path.basename(r.path) in deleted)
        for r in cb.core.records
    ), [(r.path, r.status) for r in cb.core.records]
