"""validate reports the world size a checkpoint was saved with (formats/worldsize.py) and, with
--target-gpus N, what must stay constant and what changes."""

from __future__ import annotations

import json
import shutil


def test_dcp_checkpoint_saved_by_one_rank(dcp_checkpoint, cli_run):
    rep = cli_run("validate", str(dcp_checkpoint), "--format", "json").json()
    (h,) = rep["hardware"]
    assert (
        h["world_size"] == 1
        and h["layout"] == "dcp"
        and h["shards"] == 1
        and "rank 0" in h["evidence"]
    )
    text = cli_run("validate", str(dcp_checkpoint), "--target-gpus", "8").out
    assert "Saved world size:\n  - 1 process: DCP shard files 1 written by rank 0" in text
    assert (
        "Moving to 8 GPUs (saved with 1):" in text
        and "shards: 1 dcp shard files: nothing to convert" in text
    )
    # one answer (issue 42): DCP reshards on load, so no convert line; the optional full copy goes beside the folder
    move = cli_run(
        "validate", str(dcp_checkpoint), "--target-gpus", "8", "--format", "json"
    ).json()["hardware_move"]
    assert move["convert"] is None and "  - convert:" not in text
    outside = f"{dcp_checkpoint.parent}-{dcp_checkpoint.name}-full.pt --to full"
    assert any(outside in c for c in move["changes"]), move["changes"]
    assert "global batch = per-device batch x gradient accumulation x world size" in text


def test_hf_checkpoint_with_per_rank_rng_files(hf_run, copy_of, cli_run):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-110")
    for rank in range(4):
        shutil.copy2(ckpt / "rng_state.pth", ckpt / f"rng_state_{rank}.pth")
    (ckpt / "rng_state.pth").unlink()
    (ckpt / "training_args.json").write_text(
        json.dumps({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 2})
    )
    rep = cli_run("validate", str(ckpt), "--target-gpus", "16", "--format", "json").json()
    assert rep["checkpoints"][0]["status"] == "valid"
    (h,) = rep["hardware"]
    assert (
        h["world_size"] == 4
        and h["rng_files"] == 4
        and "4 rng_state_N.pth files (ranks 0-3)" in h["evidence"]
    )
    move = rep["hardware_move"]
    assert move["saved_world_size"] == 4 and move["target_gpus"] == 16
    assert "(saved: 16 x 2 x 4 = 128)" in move["keep_constant"][0]
    assert move["set_on_target"] == [
        "on 16 GPUs set per-device batch x gradient accumulation = 8 (e.g. per-device 8, "
        "accumulation 1)"
    ]
    assert any(c.startswith("per-rank RNG files: 4 saved, 16 ranks") for c in move["changes"])
    same = cli_run("validate", str(ckpt), "--target-gpus", "4", "--format", "json").json()[
        "hardware_move"
    ]
    assert any("same world size (4)" in c for c in same["changes"])
    odd = cli_run("validate", str(ckpt), "--target-gpus", "48", "--format", "json").json()[
        "hardware_move"
    ]
    assert "128 is not divisible by 48 GPUs" in odd["set_on_target"][0]


def test_single_process_hf_run_and_bad_target(hf_run, cli_run):
    rep = cli_run("validate", str(hf_run.output_dir / "checkpoint-110"), "--format", "json").json()
    assert rep["hardware"][0]["world_size"] == 1 and rep["hardware_move"] is None
    cli_run(
        "validate", str(hf_run.output_dir / "checkpoint-110"), "--target-gpus", "0"
    ).usage_error("--target-gpus")


def test_validators_listing_gives_what_a_walk_gives(hf_run, dcp_checkpoint, tmp_path):
    """validate keeps its listing of a folder that held only regular files (`Seen.flat_names`), and the world size
    read from it is the one a walk of the folder reads; a folder with a subfolder, a link in it, or a symlinked
    checkpoint is walked as before."""
    from checkpoint_strategy.formats.worldsize import saved_world_size
    from checkpoint_strategy.validate.engine import validate_paths

    run = tmp_path / "run"
    shutil.copytree(hf_run.output_dir / "checkpoint-110", run / "checkpoint-110")
    ranks = shutil.copytree(run / "checkpoint-110", run / "checkpoint-120")
    for rank in range(3):
        shutil.copy2(ranks / "rng_state.pth", ranks / f"rng_state_{rank}.pth")
    (ranks / "rng_state.pth").unlink()
    nested = shutil.copytree(ranks, run / "checkpoint-130")
    shutil.copytree(dcp_checkpoint, nested / "pytorch_model_fsdp_0")
    linked = shutil.copytree(run / "checkpoint-110", run / "checkpoint-140")
    (linked / "rng_state_7.pth").symlink_to(linked / "rng_state.pth")
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(ranks, tmp_path / "elsewhere" / "checkpoint-150")
    (run / "checkpoint-150").symlink_to(tmp_path / "elsewhere" / "checkpoint-150")
    results = {
        r.path.rsplit("-", 1)[1]: r for r in validate_paths([str(run)], progress=False).checkpoints
    }
    assert set(results) == {"110", "120", "130", "140", "150"}
    flat = {step for step, r in results.items() if r._seen.flat_names is not None}
    assert flat == {"110", "120"}, flat
    for step, r in results.items():
        walked = saved_world_size(r.path, r.format)
        assert saved_world_size(r.path, r.format, r._seen.flat_names) == walked, step
    assert (
        results["120"]._seen.flat_names
        and saved_world_size(
            results["120"].path, "hf-trainer", results["120"]._seen.flat_names
        ).world_size
        == 3
    )


def test_every_name_a_layout_pattern_matches_passes_the_prefix_filter():
    """saved_world_size tries its patterns only on names starting with one of `_PREFIXES`: a pattern
    whose names start otherwise would never be tried (a ZeRO, DCP, rank-RNG or Megatron checkpoint read
    as telling nothing). Names drawn from each pattern itself, and near misses that must stay unmatched."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from checkpoint_strategy.formats import deepspeed as ds
    from checkpoint_strategy.formats import worldsize as ws

    patterns = (ws._RNG, ws._DISTCP, ds.ZERO_FILE, ws._MEGATRON)

    @settings(max_examples=200, deadline=None)
    @given(st.one_of(*(st.from_regex(p, fullmatch=True) for p in patterns)))
    def check(name):
        assert name.startswith(ws._PREFIXES), name

    check()
    assert "mp_rank_00_model_states.pt".startswith(ws._PREFIXES)
    for near_miss in (
        "xrng_state_1.pth",
        "rng_state_1.pth.tmp",
        "_0_0.distcp",
        "zero_pp_rank_0_optim_states.pt",
    ):
        assert not any(p.match(near_miss) for p in patterns), near_miss


def test_flat_listing_fast_path_agrees_with_the_walk(tmp_path):
    """A folder of regular files given as the validator's listing (flat_names) and walked from disk give the
    same answer for every mix of layout names, the common Trainer folder (no pattern name) included."""
    from checkpoint_strategy.formats.worldsize import saved_world_size

    layouts = {
        "trainer": ["optimizer.pt", "rng_state.pth", "trainer_state.json"],
        "no-rng": ["optimizer.pt", "trainer_state.json"],
        "ranks": ["rng_state_0.pth", "rng_state_1.pth", "rng_state.pth"],
        "dcp": ["__0_0.distcp", "__1_0.distcp", ".metadata", "rng_state_0.pth"],
        "zero": [
            "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ],
    }
    for label, names in layouts.items():
        folder = tmp_path / label
        folder.mkdir()
        for n in names:
            (folder / n).write_bytes(b"")
        for fmt in ("hf-trainer", "dcp"):
            walked = saved_world_size(str(folder), fmt)
            assert saved_world_size(str(folder), fmt, sorted(names)) == walked, (label, fmt)
    assert (
        saved_world_size(str(tmp_path / "trainer"), "hf-trainer", ["rng_state.pth"]).world_size == 1
    )
    assert saved_world_size(str(tmp_path / "no-rng"), "hf-trainer", ["optimizer.pt"]) is None
    assert (
        saved_world_size(
            str(tmp_path / "ranks"), "hf-trainer", ["rng_state_0.pth", "rng_state_1.pth"]
        ).world_size
        == 2
    )


def test_deepspeed_model_states_names_one_predicate():
    """`deepspeed.model_states`, asked by the checker, the optimizer-step reader and the run-shape reader: each
    model-parallel rank's mp_rank_XX_model_states.pt; with shards, ZeRO-3's per-rank model-state shards too (the
    checker checks them all), never the optimizer shards."""
    from checkpoint_strategy.formats import deepspeed as ds

    rank = "mp_rank_01_model_states.pt"
    shard = "zero_pp_rank_3_mp_rank_00_model_states.pt"
    assert ds.model_states(rank) and ds.model_states(rank, shards=True)
    assert not ds.model_states(shard) and ds.model_states(shard, shards=True)
    assert ds.zero_shard(shard, "model") == (3, 0)
    for other in (
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "mp_rank_00_model_states.pt.tmp",
        "latest",
    ):
        assert not ds.model_states(other, shards=True), other
