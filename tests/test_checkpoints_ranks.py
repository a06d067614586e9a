"""A checkpoint a rank did not finish is incomplete everywhere (issue 39 item 3; formats/hf.py `rank_gap`).

The real case: HF Trainer under a 2-process torchrun on CPU (gloo), rank 1 SIGKILLed in its save of checkpoint-15
once rank 0 had written its part (trainer_state.json included): checkpoint-15 has no rng_state_1.pth, checkpoints 5
and 10 have both. Every command and the callbacks' last_valid_checkpoint call it incomplete, none resumes from it or
deletes an older one because of it, and the world size is the run's (training_args.bin, the other checkpoints),
never the count of the torn checkpoint's rank files. The cheap tests give `rank_gap` listings (and sibling folders of
empty files) directly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from checkpoint_strategy.callbacks import last_valid_checkpoint
from checkpoint_strategy.formats.hf import expected_rank_files, rank_gap
from checkpoint_strategy.validate import validate_checkpoint

HF_NAMES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "trainer_state.json",
    "training_args.bin",
]


# --------------------------------------------------------------------------- the real torn run


def test_the_real_torn_save_is_what_the_issue_describes(torn_rank_run):
    names = {d.name: sorted(p.name for p in d.iterdir()) for d in torn_rank_run.iterdir()}
    assert set(names) == {"checkpoint-5", "checkpoint-10", "checkpoint-15"}, names
    for whole in ("checkpoint-5", "checkpoint-10"):
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(names[whole])
    assert (
        "rng_state_0.pth" in names["checkpoint-15"]
        and "rng_state_1.pth" not in names["checkpoint-15"]
    )
    assert (
        "trainer_state.json" in names["checkpoint-15"]
    )  # trainer_state.json is not the last file of a save
    assert expected_rank_files(str(torn_rank_run)) == {
        str(torn_rank_run / "checkpoint-15"): ["rng_state_1.pth"]
    }


@pytest.mark.parametrize("level", ["quick", "full", "deep"])
def test_validate_calls_it_incomplete_at_every_level(torn_rank_run, cli_run, level):
    res = cli_run("validate", str(torn_rank_run), "--level", level, "--format", "json")
    assert res.rc == 1
    by = {Path(c["path"]).name: c for c in res.json()["checkpoints"]}
    assert by["checkpoint-5"]["status"] == by["checkpoint-10"]["status"] == "valid"
    torn = by["checkpoint-15"]
    assert torn["status"] == "incomplete"
    (p,) = torn["problems"]
    assert p["file"] == "rng_state_1.pth" and p["kind"] == "incomplete"
    assert (
        "the run was saved by 2 processes (training_args.bin records 2 processes; checkpoint-10 has "
        "rng_state_0..1); rank 1 did not finish this save"
    ) in p["reason"]
    text = cli_run("validate", str(torn_rank_run), "--level", level).out
    assert f"Resume from: {torn_rank_run / 'checkpoint-10'} (step 10)" in text
    assert "INCOMPLETE " + str(torn_rank_run / "checkpoint-15") in text


@pytest.mark.parametrize("level", ["quick", "full", "deep"])
def test_last_valid_checkpoint_is_the_last_one_every_rank_wrote(torn_rank_run, level):
    assert last_valid_checkpoint(torn_rank_run, level=level) == str(torn_rank_run / "checkpoint-10")
    assert validate_checkpoint(torn_rank_run / "checkpoint-15", level=level).status == "incomplete"


def test_release_gate_scan_lists_it_as_bad(torn_rank_run):
    from checkpoint_strategy.integrations.checkpoints import scan

    valid, bad, _note = scan(str(torn_rank_run))
    assert [Path(v.path).name for v in valid] == ["checkpoint-10", "checkpoint-5"]
    assert [(Path(b.path).name, b.status) for b in bad] == [("checkpoint-15", "incomplete")]
    assert bad[0].reason.startswith("rng_state_1.pth: missing: the run was saved by 2 processes")


def test_recover_skips_it(torn_rank_run, cli_run):
    log = torn_rank_run / "checkpoint-15" / "trainer_state.json"
    rep = cli_run(
        "recover", str(log), "--checkpoints", str(torn_rank_run), "--format", "json"
    ).json()
    assert rep["checkpoints"]["count"] == 2 and rep["checkpoints"]["last_step"] == 10
    assert any(
        w.startswith("checkpoint-15 skipped: incomplete: missing: the run was saved by 2 processes")
        for w in rep["warnings"]
    ), rep["warnings"]


def test_prune_never_deletes_for_it(torn_rank_run, cli_run, copy_of):
    rep = cli_run("prune", str(torn_rank_run), "--keep-last", "1", "--format", "json").json()
    assert rep["newest_valid"] == "checkpoint-10" and rep["justifiers"] == ["checkpoint-10"]
    kept = {k["name"]: k for k in rep["keep"]}
    assert (
        set(kept) == {"checkpoint-10", "checkpoint-15"}
        and kept["checkpoint-15"]["status"] == "incomplete"
    )
    assert [(d["name"], d["justified_by"]) for d in rep["delete"]] == [
        ("checkpoint-5", "checkpoint-10")
    ]
    run = copy_of(torn_rank_run, "run")
    applied = cli_run("prune", str(run), "--keep-last", "1", "--apply", "--format", "json")
    assert applied.rc == 0, applied.out
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-10", "checkpoint-15"]


def test_verify_resume_warns_of_the_torn_checkpoint_and_keeps_the_run_world_size(
    torn_rank_run, cli_run, copy_of
):
    log = torn_rank_run / "checkpoint-15" / "trainer_state.json"
    rep = cli_run(
        "verify-resume",
        str(log),
        "--resume-step",
        "10",
        "--checkpoints",
        str(torn_rank_run),
        "--format",
        "json",
    ).json()
    assert any(
        w.startswith(
            "a checkpoint after the resume (checkpoint-15) is incomplete: rng_state_1.pth missing: "
            "the run was saved by 2 processes"
        )
        for w in rep["warnings"]
    ), rep["warnings"]
    text = cli_run(
        "verify-resume", str(log), "--resume-step", "10", "--checkpoints", str(torn_rank_run)
    ).out
    assert "World size / global batch: 2 / 32 before -> 2 / 32 after" in text  # not "-> 1 / 16"
    run = copy_of(torn_rank_run, "run")
    (
        run / "checkpoint-10" / "rng_state_1.pth"
    ).unlink()  # as if the run had resumed from a torn checkpoint-10
    resumed = cli_run(
        "verify-resume",
        str(run / "checkpoint-15" / "trainer_state.json"),
        "--resume-step",
        "10",
        "--checkpoints",
        str(run),
        "--format",
        "json",
    ).json()
    assert any(
        w.startswith(
            "the checkpoint resumed from (checkpoint-10) is incomplete: rng_state_1.pth missing"
        )
        for w in resumed["warnings"]
    ), resumed["warnings"]


def test_target_gpus_reports_the_run_world_size(torn_rank_run, cli_run):
    for target in (
        torn_rank_run,
        torn_rank_run / "checkpoint-15",
    ):  # the run, and the torn checkpoint alone
        move = cli_run("validate", str(target), "--target-gpus", "2", "--format", "json").json()[
            "hardware_move"
        ]
        assert move["saved_world_size"] == 2, (target, move)
        assert "(saved: 16 x 1 x 2 = 32)" in move["keep_constant"][0]
        assert move["set_on_target"] == [
            "on 2 GPUs set per-device batch x gradient accumulation = 16 (e.g. "
            "per-device 16, accumulation 1)"
        ]
        assert any("same world size (2)" in c for c in move["changes"])


def test_one_complete_two_rank_checkpoint_alone_stays_valid(torn_rank_run, tmp_path, cli_run):
    shutil.copytree(torn_rank_run / "checkpoint-10", tmp_path / "checkpoint-10")
    assert validate_checkpoint(tmp_path / "checkpoint-10").status == "valid"
    assert cli_run("validate", str(tmp_path)).rc == 0
    assert expected_rank_files(str(tmp_path)) == {}
    assert last_valid_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_deleting_a_rank_file_from_a_copy_is_caught_with_or_without_training_args(
    torn_rank_run, tmp_path
):
    for name in ("checkpoint-5", "checkpoint-10"):
        shutil.copytree(torn_rank_run / name, tmp_path / name)
    (tmp_path / "checkpoint-10" / "rng_state_1.pth").unlink()
    res = validate_checkpoint(tmp_path / "checkpoint-10")
    assert (
        res.status == "incomplete"
        and "training_args.bin records 2 processes; checkpoint-5 has rng_state_0..1"
        in res.problems[0].reason
    )
    (
        tmp_path / "checkpoint-10" / "training_args.bin"
    ).unlink()  # no record of the launch: the run's other save
    res = validate_checkpoint(tmp_path / "checkpoint-10")
    assert [p.file for p in res.problems if p.kind == "incomplete"] == ["rng_state_1.pth"]
    assert "saved by 2 processes (checkpoint-5 has rng_state_0..1)" in res.problems[0].reason
    assert last_valid_checkpoint(tmp_path) == str(tmp_path / "checkpoint-5")


# --------------------------------------------------------------------------- runs that must stay valid


def test_a_single_process_run_has_no_rank_gap(hf_run, cli_run):
    assert expected_rank_files(str(hf_run.output_dir)) == {}
    rep = cli_run("validate", str(hf_run.output_dir), "--format", "json").json()
    assert not [p for c in rep["checkpoints"] for p in c["problems"] if "rng_state" in p["file"]]


def test_a_run_resumed_on_fewer_processes_stays_valid(hf_world_change, cli_run):
    """2 processes to checkpoint-4 (rng_state_0/1.pth), resumed by 1 to checkpoint-6 (rng_state.pth): each save is
    whole for the world size that made it (its training_args.bin says which)."""
    assert expected_rank_files(str(hf_world_change)) == {}
    rep = cli_run("validate", str(hf_world_change), "--format", "json").json()
    assert {c["status"] for c in rep["checkpoints"]} == {"valid"}


# --------------------------------------------------------------------------- rank_gap on listings


def _run(tmp_path: Path, **checkpoints: list[str]) -> Path:
    for name, files in checkpoints.items():
        folder = tmp_path / name.replace("_", "-")
        folder.mkdir()
        for f in files:
            (folder / f).write_bytes(b"")
    return tmp_path


def _ranks(*ranks: int) -> list[str]:
    return HF_NAMES + [f"rng_state_{r}.pth" for r in ranks]


def test_rank_gap_declared_world_size(tmp_path):
    me = str(tmp_path / "checkpoint-15")
    assert rank_gap(me, _ranks(0, 1), 2) is None
    gap = rank_gap(me, _ranks(0), 2)
    assert gap.missing == ["rng_state_1.pth"] and gap.world == 2
    assert gap.what() == (
        "the run was saved by 2 processes (training_args.bin records 2 processes); rank 1 did not "
        "finish this save (not a resume point)"
    )
    gap = rank_gap(me, _ranks(0, 2), 4)
    assert gap.missing == ["rng_state_1.pth", "rng_state_3.pth"]
    assert gap.what().startswith(
        "2 rank files (rng_state_1.pth, rng_state_3.pth): the run was saved by 4 processes"
    )
    assert rank_gap(me, HF_NAMES + ["rng_state.pth"], 1) is None  # one process
    assert rank_gap(me, HF_NAMES, 2) is None  # save_only_model: no rng files at all
    assert rank_gap(me, _ranks(0, 1, 2, 3), 1) is None  # more files than recorded: none missing


def test_rank_gap_from_the_run_when_nothing_is_recorded(tmp_path):
    run = _run(
        tmp_path,
        checkpoint_5=_ranks(0, 1, 2, 3),
        checkpoint_10=_ranks(0, 1, 2, 3),
        checkpoint_15=_ranks(0, 1),
    )
    gap = rank_gap(str(run / "checkpoint-15"), _ranks(0, 1))
    assert gap.missing == ["rng_state_2.pth", "rng_state_3.pth"] and gap.world == 4
    assert (
        "(checkpoint-10 has rng_state_0..3)" in gap.what()
        and "ranks 2, 3 did not finish" in gap.what()
    )
    assert rank_gap(str(run / "checkpoint-10"), _ranks(0, 1, 2, 3)) is None
    assert expected_rank_files(str(run)) == {
        str(run / "checkpoint-15"): ["rng_state_2.pth", "rng_state_3.pth"]
    }


def test_rank_gap_never_takes_the_world_size_from_the_torn_folder_alone(tmp_path):
    alone = _run(tmp_path, checkpoint_15=_ranks(0))
    gap = rank_gap(
        str(alone / "checkpoint-15"), _ranks(0)
    )  # rng_state_0.pth: a save of 2 or more processes
    assert (
        gap.missing == ["rng_state_1.pth"] and "this folder holds rng_state_0.pth" in gap.evidence
    )
    assert rank_gap(str(alone / "checkpoint-15"), _ranks(0, 2)).missing == [
        "rng_state_1.pth"
    ]  # a gap


def test_siblings_that_are_links_torn_or_single_process_are_no_evidence(tmp_path):
    run = _run(
        tmp_path,
        checkpoint_5=_ranks(0, 1, 2),
        checkpoint_10=["rng_state.pth"],
        checkpoint_15=_ranks(0, 1),
    )
    (tmp_path / "elsewhere").mkdir()
    elsewhere = _run(tmp_path / "elsewhere", checkpoint_1=_ranks(*range(8)))
    (run / "checkpoint-20").symlink_to(elsewhere / "checkpoint-1")
    gap = rank_gap(str(run / "checkpoint-15"), _ranks(0, 1))
    assert gap.world == 3 and gap.missing == [
        "rng_state_2.pth"
    ]  # checkpoint-5's three, not the link's eight


# --------------------------------------------------------------------------- DeepSpeed ZeRO-3, 2 ranks


@pytest.fixture(scope="module")
def zero3_two_ranks(tmp_path_factory) -> Path:
    """global_step4/ of a real DeepSpeed ZeRO-3 run with 2 processes (a per-rank model-state and optimizer shard)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the frameworks extra")
    import convertruns

    return convertruns.build_zero(tmp_path_factory.mktemp("zero3"), stage=3, world=2)


@pytest.mark.parametrize("kind", ["model", "optim"])
def test_zero3_rank_shard_missing_is_incomplete(zero3_two_ranks, tmp_path, kind):
    run = tmp_path / "run"
    shutil.copytree(zero3_two_ranks.parent, run)
    assert validate_checkpoint(run / "global_step4").status == "valid"
    (run / "global_step4" / f"zero_pp_rank_1_mp_rank_00_{kind}_states.pt").unlink()
    res = validate_checkpoint(run / "global_step4")
    assert res.status == "incomplete"
    (p,) = res.problems
    assert p.file == f"zero_pp_rank_1_mp_rank_00_{kind}_states.pt"
    assert (
        "ranks present: [0]; the run's data-parallel size is 2: dp_world_size 2 in the model states"
        in p.reason
    )
    assert last_valid_checkpoint(run) is None
