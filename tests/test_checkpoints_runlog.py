"""One log discovery for a run folder (formats/runlog.py): the order of the kinds, the places it looks
(the folder, the logger's version folder one level up from Lightning's checkpoints/, the newest version folder
below), and never further up; the earlier Lightning versions' checkpoint folders for a rerun; the commands that
use it (recover's checkpoints next to a Lightning log). Real runs: tests/test_callbacks_runlayout.py and the
Lightning DDP run of tests/test_callbacks_multiproc.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.runlog import (
    METRICS_FILE,
    find_run_checkpoints,
    find_run_log,
    versioned_checkpoint_dirs,
)
from checkpoint_strategy.recovery.logs import find_log
from checkpoint_strategy.retention import safety


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def hf_run(root: Path, steps=(10, 20)) -> None:
    for s in steps:
        touch(root / f"checkpoint-{s}" / "trainer_state.json", '{"log_history": []}')


def test_trainer_state_first_then_callback_log_then_metrics_csv_then_events(tmp_path):
    run = tmp_path / "run"
    events = touch(run / "events.out.tfevents.1.host")
    assert find_run_log(run) == str(run)  # TensorBoard: the folder holding the file
    csv = touch(run / "metrics.csv", "step,train_loss\n")
    assert find_run_log(run) == str(csv)
    ours = touch(run / METRICS_FILE, '{"step": 1, "loss": 1.0}\n')
    assert find_run_log(run) == str(ours)
    hf_run(run)
    assert find_run_log(run) == str(run / "checkpoint-20" / "trainer_state.json")
    assert events.exists()


def test_given_checkpoints_the_newest_valid_ones_state_never_an_invalid_newer_one(tmp_path):
    run = tmp_path / "run"
    hf_run(run, (10, 20, 30))
    valid = [
        (10, str(run / "checkpoint-10")),
        (20, str(run / "checkpoint-20")),
    ]  # 30 did not validate
    assert find_run_log(run, valid) == str(run / "checkpoint-20" / "trainer_state.json")
    assert safety.default_log(valid) == str(run / "checkpoint-20" / "trainer_state.json")
    assert find_run_log(run, []) is None  # no valid checkpoint: no HF state, and no other log here
    touch(run / METRICS_FILE)
    assert safety.default_log([], str(run)) == str(run / METRICS_FILE)


def test_lightning_checkpoints_folder_reads_its_own_version_folder_and_nothing_above(tmp_path):
    logger = tmp_path / "lightning_logs"
    ck = logger / "version_3" / "checkpoints"
    touch(ck / "epoch=0-step=10.ckpt")
    touch(tmp_path / "metrics.csv")  # above the run's own logger folder: never read
    touch(logger / "metrics.csv")
    assert find_run_log(ck) is None
    touch(logger / "version_3" / "events.out.tfevents.1.host")
    assert find_run_log(ck) == str(logger / "version_3")
    csv = touch(logger / "version_3" / "metrics.csv")
    assert find_run_log(ck) == str(csv)
    ours = touch(ck / METRICS_FILE)
    assert find_run_log(ck) == str(ours)  # the callbacks' log beside the checkpoints comes first
    assert safety.default_log([(10, str(ck / "epoch=0-step=10.ckpt"))]) == str(
        ours
    )  # the folder holding them


def test_a_folder_named_checkpoints_outside_lightning_reads_only_its_parents_own_entries(tmp_path):
    touch(tmp_path / "metrics.csv")
    ck = tmp_path / "exp" / "checkpoints"
    ck.mkdir(parents=True)
    assert find_run_log(ck) is None  # two levels up: not the run's
    csv = touch(tmp_path / "exp" / "metrics.csv")
    assert find_run_log(ck) == str(csv)


@pytest.mark.parametrize("named", ["root", "logger", "version"])
def test_default_root_dir_logger_or_version_folder_reads_the_newest_version(tmp_path, named):
    logger = tmp_path / "lightning_logs"
    touch(logger / "version_0" / "metrics.csv")
    touch(logger / "version_0" / "checkpoints" / METRICS_FILE)
    new = touch(logger / "version_10" / "metrics.csv")  # 10 > 9 > 2: numbers, not names
    touch(logger / "version_9" / "checkpoints" / METRICS_FILE)
    folder = {"root": tmp_path, "logger": logger, "version": logger / "version_10"}[named]
    assert find_run_log(folder) == str(new)
    ours = touch(logger / "version_10" / "checkpoints" / METRICS_FILE)
    assert find_run_log(folder) == str(ours)


def test_a_set_aside_earlier_loss_log_is_never_read(tmp_path):
    touch(tmp_path / ".checkpoint-strategy-metrics.previous.jsonl", '{"step": 1, "loss": 1.0}\n')
    assert find_run_log(tmp_path) is None
    with pytest.raises(UsageError, match="no training log found") as err:
        find_log(tmp_path)
    assert METRICS_FILE in str(err.value) and "metrics.csv" in str(err.value)


def test_find_log_returns_a_file_as_is_and_a_folders_discovered_log(tmp_path):
    f = touch(tmp_path / "my.csv")
    assert find_log(f) == f
    ours = touch(tmp_path / "ck" / METRICS_FILE)
    assert find_log(tmp_path / "ck") == ours


def test_recover_finds_the_checkpoints_of_a_lightning_version_folders_log(tmp_path):
    version = tmp_path / "lightning_logs" / "version_0"
    csv = touch(version / "metrics.csv")
    touch(version / "checkpoints" / "epoch=0-step=10.ckpt")
    touch(version / "checkpoints" / "epoch=0-step=20.ckpt")
    source, root, found = find_run_checkpoints(csv)
    assert (source, root) == ("folder", str(version / "checkpoints"))
    assert [s for s, _p in found] == [10, 20]
    ours = touch(version / "checkpoints" / METRICS_FILE)
    assert find_run_checkpoints(ours)[1] == str(version / "checkpoints")


def test_versioned_checkpoint_dirs_for_a_rerun(tmp_path):
    logger = tmp_path / "lightning_logs"
    for v in (0, 1, 2):
        (logger / f"version_{v}" / "checkpoints").mkdir(parents=True)
    (logger / "version_3").mkdir()  # a rerun that has not saved yet
    every = [str(logger / f"version_{v}" / "checkpoints") for v in (2, 1, 0)]
    assert versioned_checkpoint_dirs(tmp_path) == every
    assert versioned_checkpoint_dirs(logger) == every
    assert versioned_checkpoint_dirs(logger / "version_3") == every
    assert versioned_checkpoint_dirs(logger / "version_3" / "checkpoints") == every  # not made yet
    assert versioned_checkpoint_dirs(logger / "version_4" / "checkpoints") == every
    assert versioned_checkpoint_dirs(logger / "version_1") == every[1:]  # its own first
    assert versioned_checkpoint_dirs(logger / "version_1" / "checkpoints") == every[2:]
    assert versioned_checkpoint_dirs(tmp_path / "elsewhere") == []
    hf = tmp_path / "hf"
    hf_run(hf)
    assert versioned_checkpoint_dirs(hf) == []
    assert os.path.isdir(logger / "version_3")


def test_recover_on_default_root_dir_finds_the_checkpoints_beside_the_log_it_reads(tmp_path):
    ck = tmp_path / "lightning_logs" / "version_1" / "checkpoints"
    touch(ck / "epoch=0-step=10.ckpt")
    touch(tmp_path / "lightning_logs" / "version_1" / "events.out.tfevents.1.host")
    assert find_run_checkpoints(tmp_path)[1] == str(ck)
    ours = touch(ck / METRICS_FILE)
    assert find_log(tmp_path) == ours and find_run_checkpoints(tmp_path)[1] == str(ck)
    assert find_run_checkpoints(tmp_path / "lightning_logs")[1] == str(ck)
