"""Where the callbacks' runs put things, on real tiny runs (CPU): a Lightning fit with the default logger saves
into lightning_logs/version_N/checkpoints, says so in one WARNING line, and a rerun resumes from the previous
version's last valid checkpoint; the HF callback writes nothing into the working folder by default (no handoff
unless handoff_dir is given)."""

from __future__ import annotations

import logging
import os

import callbackruns
import pytest

from checkpoint_strategy.callbacks import last_valid_checkpoint
from checkpoint_strategy.callbacks.core import StrategyCore
from checkpoint_strategy.errors import UsageError

POLICY = {"frequency": "every_10_steps", "keep_last": 2}


def _where_lines(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "checkpoint_strategy.callbacks" and "checkpoints go to" in r.message
    ]


def test_lightning_default_logger_rerun_resumes_from_the_last_valid_checkpoint(
    tmp_path, caplog, monkeypatch
):
    pl = pytest.importorskip(
        "pytorch_lightning", reason="the Lightning callback needs pytorch_lightning"
    )
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        callbackruns.lightning_train(root, POLICY, max_steps=30, default_logger=True)
    first = root / "lightning_logs" / "version_0" / "checkpoints"
    assert callbackruns.lightning_steps(first) == ["epoch=0-step=20.ckpt", "epoch=0-step=30.ckpt"]
    where = _where_lines(caplog)
    assert len(where) == 1 and where[0].levelno == logging.WARNING, [
        r.message for r in caplog.records
    ]
    msg = where[0].message
    assert str(first) in msg and f"last_valid_checkpoint({str(root / 'lightning_logs')!r})" in msg
    assert "ModelCheckpoint(dirpath=...)" in msg

    newest = first / "epoch=0-step=30.ckpt"  # the run was stopped in the middle of its last save
    with open(newest, "r+b") as fh:
        fh.truncate(os.path.getsize(newest) // 2)
    resume = str(first / "epoch=0-step=20.ckpt")
    version_1 = root / "lightning_logs" / "version_1"  # the rerun's folders, not made yet
    for named in (root, root / "lightning_logs", version_1, version_1 / "checkpoints", first):
        assert last_valid_checkpoint(named) == resume, named

    seen: dict[str, int] = {}

    class Peek(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            seen.setdefault("step", trainer.global_step)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        _cb, trainer, _m = callbackruns.lightning_train(
            root,
            POLICY,
            max_steps=50,
            default_logger=True,
            resume=last_valid_checkpoint(root / "lightning_logs"),
            extra_callbacks=[Peek()],
        )
    assert seen["step"] == 20 and trainer.global_step == 50  # continued, not from step 0
    assert _where_lines(caplog) == []  # ckpt_path given: nothing to say
    assert callbackruns.lightning_steps(version_1 / "checkpoints") == [
        "epoch=0-step=40.ckpt",
        "epoch=0-step=50.ckpt",
    ]
    assert last_valid_checkpoint(root / "lightning_logs") == str(
        version_1 / "checkpoints" / "epoch=0-step=50.ckpt"
    )
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing in the working folder


def test_lightning_own_dirpath_says_nothing_about_versions(tmp_path, caplog, monkeypatch):
    pytest.importorskip(
        "pytorch_lightning", reason="the Lightning callback needs pytorch_lightning"
    )
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        callbackruns.lightning_train(tmp_path / "ckpts", POLICY, max_steps=10)
    assert _where_lines(caplog) == []
    assert sorted(os.listdir(tmp_path)) == ["ckpts"]


def test_hf_callback_writes_nothing_into_the_working_folder_by_default(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="the HF callback needs transformers")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "out"
    callbackruns.hf_train(out, POLICY, max_steps=20)
    assert os.listdir(cwd) == []
    assert not list(out.rglob("*.claude*")) and not (out / ".claude").exists()
    state = tmp_path / "state"  # asked for: written where named
    callbackruns.hf_train(tmp_path / "out2", POLICY, max_steps=10, handoff_dir=str(state))
    assert (state / "checkpoint-strategy.json").is_file() and os.listdir(cwd) == []


def test_handoff_every_without_handoff_dir_is_one_clear_error():
    with pytest.raises(UsageError, match="handoff_every needs handoff_dir"):
        StrategyCore(POLICY, handoff_every=2)
    assert StrategyCore(POLICY).handoff_dir is None
