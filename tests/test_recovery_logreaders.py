"""Log readers on the shapes real logs take: Lightning metrics.csv with interleaved LR/validation rows,
JSON lines without a learning rate, HF trainer_state.json from a resumed run (LR restart, eval
entries, NaN tokens, best_model_checkpoint), entries the sliced parser must not trust, and
micro-batch rows that repeat a step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import advise, records
from checkpoint_strategy.recovery.logs import read_log


def test_lightning_interleaved_rows_carry_the_lr_and_the_val_loss(tmp_path):
    rows = ["epoch,lr-AdamW,step,train_loss_step,train_loss_epoch,val_loss"]
    rng = np.random.default_rng(0)
    for s in range(0, 2000):
        if s % 50 == 0:
            rows.append(
                f"{s // 500},{1e-3 if s < 1500 else 2e-4},{s},,,"
            )  # LearningRateMonitor row
        rows.append(f"{s // 500},,{s},{2 + 0.02 * rng.standard_normal():.4f},,")  # train row
        if s % 500 == 499:
            rows.append(
                f"{s // 500},,{s},,{2.01:.4f},{1.9 + 0.01 * (s // 500):.4f}"
            )  # epoch-end + val row
    p = tmp_path / "metrics.csv"
    p.write_text("\n".join(rows) + "\n")
    s = read_log(p)
    assert s.loss_key == "train_loss_step" and s.lr_key == "lr-AdamW"
    assert len(s.steps) == 2000 and s.restarts == []
    assert s.lr[0] == 1e-3 and s.lr[1499] == 1e-3 and s.lr[1500] == 2e-4 and np.isfinite(s.lr).all()
    assert s.eval_key == "val_loss" and list(s.eval_steps) == [499, 999, 1499, 1999]
    r = advise(p, [])
    assert r.status == "no_spike" and r.eval.points == 4


def test_jsonl_without_a_learning_rate(tmp_path):
    p = tmp_path / "train.jsonl"
    y = 2 + 0.01 * np.random.default_rng(1).standard_normal(600)
    y[400:] *= 2.0
    p.write_text("".join(json.dumps({"iter": i, "loss": float(v)}) + "\n" for i, v in enumerate(y)))
    r = advise(p, "100,200,300,390")
    assert r.log.lr_key is None and r.status == "rollback" and r.spike.onset_step == 400
    assert r.resume_checkpoint.step == 390 and r.spike.cause is None


def _hf(entries, **top):
    return json.dumps(
        {
            "best_metric": top.get("best_metric"),
            "best_model_checkpoint": top.get("best"),
            "epoch": 3.0,
            "global_step": entries[-1]["step"],
            "log_history": entries,
            "logging_steps": 10,
            "stateful_callbacks": {"TrainerControl": {"args": {"x": 1}}},
        },
        indent=2,
        allow_nan=True,
    )


def test_hf_resumed_run_with_lr_restart_eval_and_nan_tokens(tmp_path):
    rng = np.random.default_rng(2)
    hist = []
    for s in range(10, 3010, 10):
        lr = 1.4e-3 * (1 - s / 1500) if s <= 1500 else 1.4e-3  # decayed to 0, restarted on resume
        loss = 2.0 * (1 + 0.01 * rng.standard_normal()) * (3 if s > 1630 else 1)
        epoch = s / 1000 if s <= 1500 else (s - 1500) / 1000  # epoch jumps back on the resume
        hist.append(
            {
                "epoch": epoch,
                "grad_norm": float("nan") if s == 1640 else 0.5,
                "learning_rate": lr,
                "loss": round(loss, 4),
                "step": s,
            }
        )
        if s % 500 == 0:
            hist.append(
                {
                    "epoch": epoch,
                    "eval_loss": 1.9 if s <= 1500 else 5.0,
                    "eval_runtime": 1.0,
                    "step": s,
                }
            )
    p = tmp_path / "trainer_state.json"
    p.write_text(_hf(hist, best="out/checkpoint-1000", best_metric=1.9))
    assert "NaN" in p.read_text()
    s = read_log(p)
    assert s.best_model_checkpoint == "out/checkpoint-1000" and s.eval_key == "eval_loss"
    r = advise(p, [(st, f"out/checkpoint-{st}") for st in range(500, 3001, 500)])
    assert r.status == "rollback" and r.spike.onset_step == 1640
    assert (
        r.spike.cause
        == "LR restarted from 0 to 0.0014 at step 1510; the trouble followed at step 1640"
    )
    assert r.resume_checkpoint.step == 1500
    assert any(
        "best_model_checkpoint out/checkpoint-1000 (step 1000), which predates the trouble" in x
        for x in r.reasons
    )
    assert r.eval.overfitting is False and "confirms" in r.eval.note


def test_sliced_and_whole_parses_agree_and_odd_documents_fall_back(tmp_path, monkeypatch):
    hist = [{"loss": 2.0 + (i % 7) / 100, "step": i, "learning_rate": 1e-3} for i in range(1, 3001)]
    hist[10]["note"] = "a string with },{ inside"  # defeats the boundary scan: whole parse
    hist[20]["per_class"] = [{"a": 1}, {"b": [2]}]  # a list of objects inside an entry
    p = tmp_path / "trainer_state.json"
    p.write_text(_hf(hist))
    monkeypatch.setattr(records, "SLICE_RECORDS", 100)
    s = read_log(p)
    assert (
        len(s.steps) == 3000 and s.loss[10] == pytest.approx(2.04) and s.lr_key == "learning_rate"
    )
    hist2 = [{"loss": 2.0 + (i % 7) / 100, "step": i} for i in range(1, 3001)]
    p.write_text(_hf(hist2))
    assert list(read_log(p).steps) == list(range(1, 3001))
    p.write_text(_hf(hist2)[:-200])
    with pytest.raises(UsageError, match="not valid JSON"):
        read_log(p)


def test_repeated_steps_are_micro_batches_not_restarts(tmp_path):
    p = tmp_path / "metrics.csv"
    rows = ["step,train_loss"] + [
        f"{s},{2.0 + (k % 2) * 0.2}" for s in range(1, 301) for k in range(4)
    ]
    p.write_text("\n".join(rows) + "\n")
    s = read_log(p)
    assert s.restarts == [] and len(s.steps) == 300 and s.entries == 1200
    assert s.loss[0] == pytest.approx(2.1)


def test_outputs_that_are_the_log_and_empty_paths_are_refused(tmp_path, capsys):
    from checkpoint_strategy.cli.main import main

    log = tmp_path / "train.jsonl"
    content = "".join(f'{{"step": {i}, "loss": 2.0}}\n' for i in range(1, 50))
    log.write_text(content)
    for flag in ("-o", "--plot"):
        target = log if flag == "-o" else tmp_path / "same.png"
        if flag == "--plot":
            target.symlink_to(log)
        assert main(["recover", str(log), flag, str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is also an input of this command" in err[0]
        assert log.read_text() == content
    assert main(["recover", ""]) == 2
    assert "empty path" in capsys.readouterr().err


@pytest.mark.parametrize("fast", [True, False])
def test_with_and_without_orjson_the_series_are_the_same(tmp_path, monkeypatch, fast):
    if not fast:
        monkeypatch.setattr(records, "_orjson", None)
    hist = [
        {
            "loss": float("nan") if i == 7 else 2 + i / 1000,
            "step": i,
            "grad_norm": float("inf") if i == 9 else 1.0,
        }
        for i in range(1, 5001)
    ]
    p = tmp_path / "trainer_state.json"
    p.write_text(_hf(hist))
    monkeypatch.setattr(records, "SLICE_RECORDS", 700)
    s = read_log(p)
    assert len(s.steps) == 5000 and np.isnan(s.loss[6]) and np.isinf(s.grad_norm[8])
    assert s.loss[4999] == pytest.approx(7.0)
