"""Issue 39 items 1-2: "best" is the best as the framework holds it now, and the disk stays bounded.

Real tiny runs on CPU: an HF Trainer with evaluation at every save and load_best_model_at_end (with the
callback, and the same run without it pruned from the CLI), and Lightning with a monitoring
ModelCheckpoint(save_top_k=1) beside the callback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import callbackruns
import pytest
import realruns

from checkpoint_strategy.validate import validate_checkpoint

SAVES, EVERY, KEEP = 12, 2, 2


def _hf_eval_run(out: Path, with_callback: bool):
    """12 saves (every 2 steps), eval at every save, load_best_model_at_end on eval_loss (improving)."""
    from transformers import Trainer

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    args = realruns._training_args(out, max_steps=SAVES * EVERY, save_steps=EVERY)
    args.eval_strategy = "steps"
    args.eval_steps = EVERY
    args.load_best_model_at_end = True
    args.metric_for_best_model = "eval_loss"
    args.greater_is_better = False
    callbacks = []
    cb = None
    if with_callback:
        cb = HFCheckpointStrategy(
            {"frequency": f"every_{EVERY}_steps", "keep_last": KEEP, "async_save": False},
            handoff_dir=None,
        )
        callbacks.append(cb)
    trainer = Trainer(
        model=realruns._tiny_gpt2(),
        args=args,
        train_dataset=realruns._TokenDataset(4096, 16, 64),
        eval_dataset=realruns._TokenDataset(32, 16, 64, seed=1),
        callbacks=callbacks,
    )
    trainer.train()
    return cb, trainer


def _newest_state_best(out: Path) -> str:
    newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((newest / "trainer_state.json").read_text())
    return os.path.basename(state["best_model_checkpoint"])


@pytest.fixture(scope="module")
def hf_eval_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("best-hf")
    cb, trainer = _hf_eval_run(root / "with", with_callback=True)
    _none, plain = _hf_eval_run(root / "plain", with_callback=False)
    return root / "with", cb, trainer, root / "plain", plain


def test_hf_callback_keeps_keep_last_and_the_newest_states_best(hf_eval_runs):
    out, cb, trainer, _plain, _t = hf_eval_runs
    left = sorted(p.name for p in out.glob("checkpoint-*"))
    assert [r.step for r in cb.core.records] == [EVERY * i for i in range(1, SAVES + 1)]
    assert len(left) <= KEEP + 1, left
    best = _newest_state_best(out)
    assert best in left and os.path.basename(trainer.state.best_model_checkpoint) == best
    assert f"checkpoint-{SAVES * EVERY}" in left and f"checkpoint-{(SAVES - 1) * EVERY}" in left
    assert all(validate_checkpoint(out / n).status == "valid" for n in left)


def test_hf_cli_prune_of_the_same_run_ends_the_same_way(hf_eval_runs, cli_run):
    out, _cb, _t, plain, plain_trainer = hf_eval_runs
    assert len(list(plain.glob("checkpoint-*"))) == SAVES  # the Trainer alone keeps every save
    best = _newest_state_best(plain)
    dry = cli_run("prune", str(plain), "--keep-last", str(KEEP), "--format", "json")
    assert dry.rc == 0, dry.err
    report = dry.json()
    assert report["best_checkpoint"] == best
    assert len(report["keep"]) <= KEEP + 1 and len(report["delete"]) >= SAVES - KEEP - 1
    text = cli_run("prune", str(plain), "--keep-last", str(KEEP))
    assert f"Best:          {best}\n" in text.out
    done = cli_run("prune", str(plain), "--keep-last", str(KEEP), "--apply", "--format", "json")
    assert done.rc == 0, done.err
    left = sorted(p.name for p in plain.glob("checkpoint-*"))
    assert len(left) <= KEEP + 1 and best in left
    assert left == sorted(p.name for p in out.glob("checkpoint-*")), (
        "the callback and the CLI agree"
    )
    kinds = {e["name"]: e["reason_kinds"] for e in done.json()["keep"]}
    assert "trainer_best" in kinds[best]
    assert all("trainer_best" not in k for n, k in kinds.items() if n != best), (
        "only the best now is a best"
    )


def test_lightning_monitoring_top_1_is_left_alone_and_the_folder_bounded(tmp_path):
    ckpts = tmp_path / "ckpts"
    policy = {"frequency": "every_10_steps", "keep_last": KEEP, "async_save": False}
    cb, trainer, _m = callbackruns.lightning_train(
        ckpts, policy, max_steps=60, monitor="train_loss", monitor_every=10, handoff_dir=None
    )
    mc = trainer.checkpoint_callback
    assert mc.save_top_k == 1 and mc.monitor == "train_loss"  # not widened to -1
    assert len(mc.best_k_models) == 1
    left = callbackruns.lightning_steps(ckpts)
    assert len(left) <= KEEP + 1, left
    best = os.path.basename(mc.best_model_path)
    assert best in left and "epoch=0-step=60.ckpt" in left and "epoch=0-step=50.ckpt" in left
    assert [r.step for r in cb.core.records if not os.path.basename(r.path).endswith("-v1.ckpt")][
        :6
    ] == [10, 20, 30, 40, 50, 60]


def test_lightning_cli_prune_reads_the_newest_state_only(tmp_path, cli_run):
    """The same run without the callback, its ModelCheckpoint widened to save_top_k=-1 by hand beside a
    top-1 monitor: only the newest file's monitor state names the best; old files with no monitor's say are
    pruned like any others."""
    ckpts = tmp_path / "ckpts"
    _cb, trainer, _m = callbackruns.lightning_train(
        ckpts, {}, max_steps=60, monitor="train_loss", with_callback=False, save_every=10
    )
    best = os.path.basename(trainer.checkpoint_callback.best_model_path)
    before = callbackruns.lightning_steps(ckpts)
    assert before == [best]  # Lightning's own top-1: the only file
    res = cli_run("prune", str(ckpts), "--keep-last", "1", "--format", "json")
    assert res.rc == 0 and res.json()["best_checkpoint"] == best
