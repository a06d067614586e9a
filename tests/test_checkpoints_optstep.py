"""formats/optstep.py: the verdict table, and hostile files around a real torch optimizer save
(torch.save of a real AdamW state dict, the file the HF Trainer writes as optimizer.pt)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import fuzzcheck
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats.models import OptimizerSteps
from checkpoint_strategy.formats.optstep import dcp_step_keys, judge, read_optimizer_steps


def _s(training, optimizer, skipped=None):
    return OptimizerSteps(
        path="x",
        format="hf-trainer",
        training_step=training,
        optimizer_step=optimizer,
        skipped_steps=skipped,
    )


@pytest.mark.parametrize(
    "training, optimizer, skipped, resume, verdict",
    [
        (40, 40, None, None, "consistent"),
        (40, 38, 2, None, "consistent"),  # DeepSpeed fp16 overflows: skipped steps do not count
        (40, 10, None, 30, "reset"),  # counts only the 10 steps since the resume at 30
        (40, 5, None, 30, "reset"),
        (40, 11, None, 30, "behind"),  # more than the steps since the resume: not this resume
        (40, 10, None, None, "behind"),  # no resume step given: a lag, not a verdict on a resume
        (40, 41, None, 30, "ahead"),
        (None, 40, None, 30, "unknown"),
        (40, None, None, 30, "unknown"),
    ],
)
def test_judge_table(training, optimizer, skipped, resume, verdict):
    s = judge(_s(training, optimizer, skipped), resume)
    assert s.verdict == verdict
    if verdict in ("reset", "behind"):
        assert s.restart_step == training - optimizer
    else:
        assert s.restart_step is None


def test_judge_resume_at_or_after_the_training_step_is_not_a_reset():
    assert judge(_s(30, 0, None), 30).verdict == "behind"
    assert judge(_s(30, 0, None), 0).verdict == "behind"


def test_dcp_step_keys_pick_optimizer_train_and_scheduler_entries():
    fqns = [
        "model.0.weight",
        "optimizer.state.0.weight.step",
        "optimizer.state.0.weight.exp_avg",
        "optimizer.param_groups.0.weight.lr",
        "optim.state.3.step",
        "train_state.step",
        "train_state.ntokens_seen",
        "lr_scheduler.lr_scheduler_0.last_epoch",
        "dataloader.dp_rank_0.step",
        "extra.deep.step",
        "model.step",
    ]
    opt, train, sched = dcp_step_keys(fqns)
    assert opt == ["optimizer.state.0.weight.step", "optim.state.3.step"]
    assert train in (
        "train_state.step",
        "model.step",
    )  # the shortest non-optimizer, non-loader step
    assert sched == "lr_scheduler.lr_scheduler_0.last_epoch"
    assert dcp_step_keys(["model.0.weight"]) == ([], None, None)


@pytest.fixture
def hf_like(tmp_path):
    """checkpoint-5/ with trainer_state.json (global_step 5) and a real AdamW optimizer.pt after 3 steps."""
    import torch

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    folder = tmp_path / "checkpoint-5"
    folder.mkdir()
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    return folder


def test_real_adamw_save_is_read(hf_like):
    s = read_optimizer_steps(str(hf_like))
    assert (s.format, s.training_step, s.optimizer_step) == ("hf-trainer", 5, 3)
    assert s.verdict == "behind" and s.restart_step == 2


def test_truncated_optimizer_file_gives_no_counter_and_no_error(hf_like):
    p = hf_like / "optimizer.pt"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    s = read_optimizer_steps(str(hf_like))
    assert s.optimizer_step is None and s.verdict == "unknown"


def test_fifo_and_symlinked_directory_are_not_read(hf_like, tmp_path):
    (hf_like / "optimizer.pt").unlink()
    os.mkfifo(hf_like / "optimizer.pt")  # would block a reader that opened it
    s = read_optimizer_steps(str(hf_like))
    assert s.optimizer_step is None and s.training_step == 5


def test_nan_step_and_non_integer_global_step_are_ignored(hf_like):
    import torch

    sd = torch.load(hf_like / "optimizer.pt", weights_only=True)
    for one in sd["state"].values():
        one["step"] = torch.tensor(float("nan"))
    torch.save(sd, hf_like / "optimizer.pt")
    (hf_like / "trainer_state.json").write_text(json.dumps({"global_step": "5"}))
    s = read_optimizer_steps(str(hf_like))
    assert s.optimizer_step is None and s.training_step is None and s.verdict == "unknown"


def test_garbage_dcp_metadata_is_unknown(tmp_path):
    folder = tmp_path / "step-10"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"\x80\x04not a pickle at all" * 10)
    (folder / "__0_0.distcp").write_bytes(b"\0" * 64)
    s = read_optimizer_steps(str(folder))
    assert s.verdict == "unknown" and s.optimizer_step is None


# --------------------------------------------------------------------------- the command line, bad input


def _log(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text(
        "".join(json.dumps({"step": i, "loss": 2.0 + 0.001 * (i % 2)}) + "\n" for i in range(1, 41))
    )
    return p


def test_checkpoints_that_do_not_exist_exit_2(tmp_path, cli_run):
    cli_run(
        "verify-resume", _log(tmp_path), "--resume-step", "20", "--checkpoints", tmp_path / "nope"
    ).usage_error("does not exist")


def test_checkpoints_folder_without_checkpoints_exits_2(tmp_path, cli_run):
    (tmp_path / "empty").mkdir()
    cli_run(
        "verify-resume", _log(tmp_path), "--resume-step", "20", "--checkpoints", tmp_path / "empty"
    ).usage_error("no checkpoints found")


def test_output_inside_the_checkpoints_folder_is_refused(tmp_path, cli_run, hf_like):
    cli_run(
        "verify-resume",
        _log(tmp_path),
        "--resume-step",
        "20",
        "--checkpoints",
        hf_like.parent,
        "-o",
        hf_like / "report.txt",
    ).usage_error("")
    assert not (hf_like / "report.txt").exists()


def test_no_checkpoint_after_the_resume_is_a_warning(tmp_path, cli_run, hf_like):
    r = cli_run(
        "verify-resume",
        _log(tmp_path),
        "--resume-step",
        "5",
        "--checkpoints",
        hf_like.parent,
        "--format",
        "json",
    )
    out = r.json()
    assert any("no checkpoint after step 5" in w for w in out["warnings"])
    assert out["optimizer_reset"] is None
    assert any("already off" in w for w in out["warnings"])  # 3 optimizer steps at global step 5


def test_checkpoint_names_with_newlines_and_bars_cannot_forge_report_lines(
    tmp_path, cli_run, hf_like
):
    evil = tmp_path / "a|b\nVerdict: OK"
    evil.mkdir()
    hf_like.rename(evil / "checkpoint-5")
    r = cli_run(
        "verify-resume",
        _log(tmp_path),
        "--resume-step",
        "5",
        "--checkpoints",
        evil,
        "--format",
        "markdown",
    )
    assert r.rc in (0, 1)
    assert "\nVerdict: OK" not in r.out and "a\\|b" in r.out


_REAL: dict[str, bytes] = {}


def _real_optimizer_pt() -> bytes:
    """A real AdamW state dict saved by torch.save after 3 steps (built once)."""
    if "opt" not in _REAL:
        import io

        import torch

        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        _REAL["opt"] = buf.getvalue()
    return _REAL["opt"]


@fuzzcheck.reaches_core()
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=6),
    cut=st.one_of(st.none(), st.floats(0, 1)),
    state=st.sampled_from(
        [
            '{"global_step": 3}',
            '{"global_step": -1}',
            '{"global_step": 1e308}',
            "[]",
            "{",
            '{"global_step": true}',
        ]
    ),
)
def test_fuzz_damaged_optimizer_pt_never_raises(tmp_path, flips, cut, state):
    data = bytearray(_real_optimizer_pt())
    for frac, byte in flips:
        data[int(frac * len(data))] = byte
    if cut is not None:
        data = data[: int(cut * len(data))]
    folder = Path(tempfile.mkdtemp(dir=tmp_path)) / "checkpoint-3"
    folder.mkdir()
    (folder / "optimizer.pt").write_bytes(bytes(data))
    (folder / "trainer_state.json").write_text(state)
    s = read_optimizer_steps(str(folder))
    fuzzcheck.reached(True)
    assert s.verdict in ("consistent", "behind", "ahead", "unknown")
    assert s.optimizer_step is None or isinstance(s.optimizer_step, int)
    if not flips and cut is None and state == '{"global_step": 3}':
        assert (s.training_step, s.optimizer_step, s.verdict) == (3, 3, "consistent")


@pytest.mark.parametrize("optimizers", [1, 2])
def test_lightning_sharded_folder_sums_its_optimizers(tmp_path, optimizers):
    """The folder Lightning's FSDPStrategy(state_dict_type="sharded") writes (pytorch_lightning/strategies/fsdp.py
    save_checkpoint: DCP {"model", "optimizer_<k>"} plus meta.pt with the loop state), written by the real
    torch.distributed.checkpoint and torch.save in one process (FSDP itself needs a GPU in Lightning)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    models = [torch.nn.Linear(4, 2) for _ in range(optimizers)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    for _ in range(4):
        for m, o in zip(models, opts, strict=True):
            m(torch.randn(2, 4)).sum().backward()
            o.step()
    folder = tmp_path / "epoch=0-step=4.ckpt"
    state = {
        "model": models[0].state_dict(),
        **{f"optimizer_{k}": o.state_dict() for k, o in enumerate(opts)},
    }
    dcp.save(state, checkpoint_id=str(folder))
    torch.save({"global_step": 4 * optimizers, "epoch": 0}, folder / "meta.pt")
    s = read_optimizer_steps(str(folder))
    assert s.format == "lightning"
    assert (s.training_step, s.optimizer_step, s.verdict) == (
        4 * optimizers,
        4 * optimizers,
        "consistent",
    )
    assert s.training_step_from == "meta.pt global_step"


def test_a_save_still_in_flight_is_not_read(tmp_path, cli_run, hf_like):
    """tmp-checkpoint-N (the HF Trainer's name while it writes) after the resume: not judged, half-written."""
    (hf_like.parent / "tmp-checkpoint-9").mkdir()
    r = cli_run(
        "verify-resume",
        _log(tmp_path),
        "--resume-step",
        "5",
        "--checkpoints",
        hf_like.parent,
        "--format",
        "json",
    )
    assert [c["path"] for c in r.json()["checkpoints"]] == [str(hf_like)]


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 1e300])
def test_dcp_infinite_or_huge_counters_are_unknown_not_a_crash(tmp_path, bad):
    """A DCP save whose train_state step and scheduler last_epoch are tensors of inf / nan / 1e300 (written by the
    real torch.distributed.checkpoint): int() of them would raise OverflowError/ValueError (exit 3); they are unknown."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    folder = tmp_path / "step-1"
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "train_state": {"step": torch.tensor(bad, dtype=torch.float64)},
        "lr_scheduler": {"last_epoch": torch.tensor(bad, dtype=torch.float64)},
    }
    dcp.save(state, checkpoint_id=str(folder))
    s = read_optimizer_steps(str(folder))
    assert s.optimizer_step == 1
    assert s.training_step is None and s.scheduler_step is None
