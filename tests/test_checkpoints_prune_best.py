"""Issue 39 items 1-2 on the CLI and the keep rules: the trainer's best *now* (the newest valid checkpoint's
state), the kept set bounded, and an old invalid checkpoint that is no save in flight (--delete-invalid).

Real checkpoints: the session's HF Trainer run (hf_run) and a real Lightning run with a monitoring top-2
ModelCheckpoint beside a rolling one (built here once); for the generated folders also the 2-process torchrun HF
run with a torn save (torn_rank_run), DeepSpeed ZeRO-2 (deepspeed_zero2_run) and a 4-shard DCP save (dcp_sharded).
Generated folders are seeded (random.Random(seed)).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import realruns

from checkpoint_strategy.recovery import advise
from checkpoint_strategy.retention import prune as _prune
from checkpoint_strategy.retention import rules as rt
from checkpoint_strategy.validate import validate_checkpoint

FOLDERS = 40  # 8 folders of each of the 5 layouts


def prune(root, **kw):
    return _prune(root, advise=advise, **kw)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()  # hard links: never write through to the session's run
    path.write_bytes(data)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    _rewrite(path, data[: len(data) // 2])


# --------------------------------------------------------------------------- an old truncated optimizer.pt


def _three(hf_run, root: Path) -> Path:
    for step in (170, 180, 190):
        shutil.copytree(
            hf_run.output_dir / f"checkpoint-{step}",
            root / f"checkpoint-{step}",
            copy_function=_link_or_copy,
        )
    _truncate(root / "checkpoint-170" / "optimizer.pt")
    return root


def test_old_truncated_optimizer_is_kept_by_default_and_named_with_its_option(
    hf_run, tmp_path, cli_run
):
    root = _three(hf_run, tmp_path / "run")
    assert validate_checkpoint(root / "checkpoint-170").status == "invalid"
    res = cli_run("prune", str(root), "--keep-last", "1", "--no-spike-check", "--format", "json")
    assert res.rc == 0, res.err
    report = res.json()
    kept = {e["name"]: e for e in report["keep"]}
    assert kept["checkpoint-170"]["reason_kinds"] == ["old_invalid"]
    assert "--delete-invalid" in kept["checkpoint-170"]["reasons"][0]
    assert (
        "in flight" in kept["checkpoint-170"]["reasons"][0]
        and "checkpoint-190" in kept["checkpoint-170"]["reasons"][0]
    )
    assert report["old_invalid"] == ["checkpoint-170"] and report["delete_invalid"] is False
    assert report["old_invalid_bytes"] == kept["checkpoint-170"]["bytes"] > 0
    assert [e["name"] for e in report["delete"]] == ["checkpoint-180"]
    text = cli_run("prune", str(root), "--keep-last", "1", "--no-spike-check").out
    assert (
        "Invalid:       1 invalid or incomplete checkpoint older than a newer valid one (checkpoint-170)"
        in text
    )
    assert "--delete-invalid removes it." in text
    md = cli_run(
        "prune", str(root), "--keep-last", "1", "--no-spike-check", "--format", "markdown"
    ).out
    assert "`--delete-invalid` removes it" in md
    applied = cli_run("prune", str(root), "--keep-last", "1", "--no-spike-check", "--apply")
    assert applied.rc == 0 and sorted(os.listdir(root)) == ["checkpoint-170", "checkpoint-190"]


def test_delete_invalid_removes_the_old_one_with_its_bytes_and_reason(hf_run, tmp_path, cli_run):
    root = _three(hf_run, tmp_path / "run")
    dry = cli_run(
        "prune",
        str(root),
        "--keep-last",
        "2",
        "--no-spike-check",
        "--delete-invalid",
        "--format",
        "json",
    )
    report = dry.json()
    gone = {e["name"]: e for e in report["delete"]}
    assert list(gone) == ["checkpoint-170"] and gone["checkpoint-170"]["reason_kinds"] == [
        "delete_invalid"
    ]
    assert "invalid, older than the valid checkpoint-190" in gone["checkpoint-170"]["reasons"][0]
    assert (
        report["bytes_to_free"] == gone["checkpoint-170"]["bytes"] > 0
        and report["old_invalid"] == []
    )
    done = cli_run(
        "prune", str(root), "--keep-last", "2", "--no-spike-check", "--delete-invalid", "--apply"
    )
    assert done.rc == 0, done.err
    assert sorted(os.listdir(root)) == ["checkpoint-180", "checkpoint-190"]


def test_the_newest_entry_invalid_is_never_deleted(hf_run, tmp_path, cli_run):
    root = _three(hf_run, tmp_path / "run")
    shutil.copytree(
        hf_run.output_dir / "checkpoint-200", root / "checkpoint-200", copy_function=_link_or_copy
    )
    _truncate(root / "checkpoint-200" / "optimizer.pt")
    res = cli_run(
        "prune",
        str(root),
        "--keep-last",
        "1",
        "--no-spike-check",
        "--delete-invalid",
        "--apply",
        "--format",
        "json",
    )
    assert res.rc == 0, res.err
    kinds = {e["name"]: e["reason_kinds"] for e in res.json()["keep"]}
    assert kinds["checkpoint-200"] == ["not_valid"] and "checkpoint-190" in kinds
    assert sorted(os.listdir(root)) == ["checkpoint-190", "checkpoint-200"]


def test_a_tmp_checkpoint_is_in_flight_even_when_old(hf_run, tmp_path):
    root = _three(hf_run, tmp_path / "run")
    shutil.copytree(
        hf_run.output_dir / "checkpoint-160",
        root / "tmp-checkpoint-160",
        copy_function=_link_or_copy,
    )
    _truncate(root / "tmp-checkpoint-160" / "model.safetensors")
    report = prune(root, keep_last=1, spike_check=False, delete_invalid=True, apply=True)
    assert "tmp-checkpoint-160" in os.listdir(root) and "checkpoint-170" not in os.listdir(root)
    assert report.deleted == 2


def test_hf_best_is_the_newest_valid_states_not_an_older_ones(hf_run, tmp_path, cli_run):
    root = tmp_path / "run"
    for step in range(110, 210, 10):
        shutil.copytree(
            hf_run.output_dir / f"checkpoint-{step}",
            root / f"checkpoint-{step}",
            copy_function=_link_or_copy,
        )
        _name_best(
            root / f"checkpoint-{step}", f"checkpoint-{step}"
        )  # each named itself best when saved
    _name_best(root / "checkpoint-190", "checkpoint-130")
    _name_best(root / "checkpoint-200", "checkpoint-150")
    _truncate(
        root / "checkpoint-200" / "model.safetensors"
    )  # the newest is torn: 190's state rules
    res = cli_run("prune", str(root), "--keep-last", "2", "--no-spike-check", "--format", "json")
    report = res.json()
    assert report["best_checkpoint"] == "checkpoint-130"
    assert sorted(e["name"] for e in report["keep"]) == [
        "checkpoint-130",
        "checkpoint-180",
        "checkpoint-190",
        "checkpoint-200",
    ]
    assert "checkpoint-190/trainer_state.json" in report["reasons"]["checkpoint-130"][0]
    assert (
        "Best:          checkpoint-130\n"
        in cli_run("prune", str(root), "--keep-last", "2", "--no-spike-check").out
    )


def _name_best(ckpt: Path, best: str | None) -> None:
    p = ckpt / "trainer_state.json"
    data = json.loads(p.read_text())
    data["best_model_checkpoint"] = None if best is None else f"out/{best}"
    _rewrite(p, json.dumps(data).encode())


# --------------------------------------------------------------------------- generated folders: the bound


def _hf_folder(rng: random.Random, sources: dict[int, Path], root: Path, damage) -> dict:
    """3-9 checkpoint-N copied from `sources` (step -> the real checkpoint copied under that step's name), each
    naming a random best in its own state half the time (the past), `damage(rng, folder, newest)` tearing some
    (returns True when it did); the newest valid state names the best now (or none)."""
    steps = sorted(rng.sample(sorted(sources), rng.randint(3, min(9, len(sources)))))
    names = [f"checkpoint-{s}" for s in steps]
    invalid = []
    for i, (step, name) in enumerate(zip(steps, names, strict=True)):
        shutil.copytree(sources[step], root / name, copy_function=_link_or_copy)
        _set_step(root / name, step)
        if rng.random() < 0.5:  # a best named in an old state: the past
            _name_best(root / name, rng.choice(names))
        if damage(rng, root / name, i == len(steps) - 1):
            invalid.append(name)
    valid = [n for n in names if n not in invalid]
    best = None
    if valid and rng.random() < 0.7:
        best = rng.choice(names)
        _name_best(root / valid[-1], best)
    elif valid:
        _name_best(root / valid[-1], None)
    return {"names": names, "invalid": invalid, "valid": valid, "best": {best} - {None}}


def _set_step(ckpt: Path, step: int) -> None:
    p = ckpt / "trainer_state.json"
    data = json.loads(p.read_text())
    if data.get("global_step") != step:
        data["global_step"] = step
        _rewrite(p, json.dumps(data).encode())


def _truncate_some(rng: random.Random, folder: Path, newest: bool) -> bool:
    if rng.random() < (0.2 if newest else 0.3):
        _truncate(folder / rng.choice(["optimizer.pt", "model.safetensors"]))
        return True
    return False


def _generate_hf(rng: random.Random, hf_run, root: Path) -> dict:
    sources = {s: hf_run.output_dir / f"checkpoint-{s}" for s in hf_run.checkpoint_steps}
    return _hf_folder(rng, sources, root, _truncate_some)


def _generate_torn(rng: random.Random, torn: Path, root: Path) -> dict:
    """Copies of the 2-process run's complete checkpoints (5 and 10) under other steps; rng_state_1.pth deleted
    from some (incomplete: rank 1 did not finish), an optimizer.pt truncated in others."""
    whole = [torn / "checkpoint-5", torn / "checkpoint-10"]
    sources = {s: rng.choice(whole) for s in range(5, 125, 5)}
    incomplete: list[str] = []

    def damage(rng: random.Random, folder: Path, newest: bool) -> bool:
        if (
            rng.random() < 0.2
        ):  # no record of the world size here: the run's other checkpoints tell it
            (folder / "training_args.bin").unlink()
        roll = rng.random()
        if roll < (0.2 if newest else 0.3):
            (folder / "rng_state_1.pth").unlink()
            incomplete.append(folder.name)
            return True
        return _truncate_some(rng, folder, newest) if roll < 0.45 else False

    return {**_hf_folder(rng, sources, root, damage), "incomplete": set(incomplete)}


@pytest.fixture(scope="module")
def pl_top2(tmp_path_factory):
    """A real Lightning run: a rolling ModelCheckpoint (save_top_k=-1, every 5 steps) and a monitoring one
    (top-2 by a seeded random `score`, every 5 steps, the metric in its names) in one folder."""
    scores = random.Random(5)
    return realruns.build_lightning_topk(
        tmp_path_factory.mktemp("pl-top2"),
        lambda _step: scores.random(),
        samples=256,
        max_steps=60,
        top_name="{epoch}-{step}-{score:.3f}",
        every_name="{epoch}-{step}",
    )


def _best_now_lightning(path: Path) -> set[str]:
    import torch

    state = torch.load(path, weights_only=False, map_location="cpu")[
        "callbacks"
    ]  # a test may load to cross-check
    out: set[str] = set()
    for key, st in state.items():
        if key.startswith("ModelCheckpoint") and st.get("monitor") not in (None, "step"):
            out |= {os.path.basename(p) for p in st["best_k_models"]} | {
                os.path.basename(st["best_model_path"])
            }
    return out


def _generate_pl(rng: random.Random, src: Path, root: Path) -> dict:
    every = sorted(os.listdir(src), key=lambda n: (rt.classify_name(n).step, n))
    chosen = sorted(
        rng.sample(every, rng.randint(3, min(10, len(every)))),
        key=lambda n: (rt.classify_name(n).step, n),
    )
    root.mkdir(parents=True)
    invalid = []
    for i, name in enumerate(chosen):
        _link_or_copy(src / name, root / name)
        if rng.random() < (0.2 if i == len(chosen) - 1 else 0.3):
            _truncate(root / name)
            invalid.append(name)
    valid = [n for n in chosen if n not in invalid]
    best = _best_now_lightning(root / valid[-1]) & set(chosen) if valid else set()
    return {"names": chosen, "invalid": invalid, "valid": valid, "best": best}


def _generate_ds(rng: random.Random, ds: Path, root: Path) -> dict:
    """Copies of the real ZeRO-2 tags (global_step3/6) as global_stepN; a per-rank optimizer file deleted
    (incomplete) or truncated (invalid) in some; `latest` names a random tag (the newer ones are in flight:
    DeepSpeed moves it once every rank saved) or is absent."""
    steps = sorted(rng.sample(range(3, 63, 3), rng.randint(3, 8)))
    names = [f"global_step{s}" for s in steps]
    invalid = []
    incomplete: set[str] = set()
    for i, name in enumerate(names):
        shutil.copytree(
            ds / rng.choice(["global_step3", "global_step6"]),
            root / name,
            copy_function=_link_or_copy,
        )
        if rng.random() < (0.2 if i == len(names) - 1 else 0.3):
            shard = rng.choice(sorted((root / name).glob("*optim_states.pt")))
            if rng.random() < 0.5:
                shard.unlink()
                incomplete.add(name)
            else:
                _truncate(shard)
            invalid.append(name)
    latest = rng.choice(names) if rng.random() < 0.85 else None
    extras = set()
    if latest is not None:
        (root / "latest").write_text(latest)
        extras.add("latest")
    pointer_in_flight = set() if latest is None else set(names[names.index(latest) + 1 :])
    valid = [n for n in names if n not in invalid]
    return {
        "names": names,
        "invalid": invalid,
        "valid": valid,
        "best": set(),
        "latest": latest,
        "pointer_in_flight": pointer_in_flight,
        "extras": extras,
        "incomplete": incomplete,
    }


def _generate_dcp(rng: random.Random, dcp: Path, root: Path) -> dict:
    """Copies of the real 4-shard DCP save (step-100/) as step-N; one .distcp shard deleted or truncated in some."""
    steps = sorted(rng.sample(range(100, 2100, 100), rng.randint(3, 8)))
    names = [f"step-{s}" for s in steps]
    invalid = []
    for i, name in enumerate(names):
        shutil.copytree(dcp, root / name, copy_function=_link_or_copy)
        if rng.random() < (0.2 if i == len(names) - 1 else 0.3):
            shard = rng.choice(sorted((root / name).glob("*.distcp")))
            shard.unlink() if rng.random() < 0.5 else _truncate(shard)
            invalid.append(name)
    return {
        "names": names,
        "invalid": invalid,
        "valid": [n for n in names if n not in invalid],
        "best": set(),
    }


def _add_unrecognised(rng: random.Random, root: Path) -> set[str]:
    """Something prune does not recognise (never to be deleted): a file, a folder, or nothing."""
    roll = rng.random()
    if roll < 0.3:
        (root / "notes.txt").write_text("lr 3e-4 looked fine\n")
        return {"notes.txt"}
    if roll < 0.6:
        (root / "eval_results").mkdir()
        (root / "eval_results" / "step-100.json").write_text("{}")
        return {"eval_results"}
    return set()


def _check_bound(
    report, exp: dict, keep_last: int, milestones: list[int], delete_invalid: bool, left: set
) -> None:
    step = {n: rt.classify_name(n).step for n in exp["names"]}
    pointer_in_flight = exp.get(
        "pointer_in_flight", set()
    )  # newer than DeepSpeed's `latest`: not counted
    counted = [n for n in exp["valid"] if n not in pointer_in_flight]
    counted_steps = sorted({step[n] for n in counted})
    if counted:
        newest_valid = max(counted, key=lambda n: (step[n], n))
        assert newest_valid in left and report.newest_valid == newest_valid, (
            "the newest resumable valid"
        )
    assert exp["best"] <= left, "the trainer's best now"
    assert exp.get("extras", set()) <= left, "anything unrecognised (and the resume pointer)"
    latest = {exp["latest"]} if exp.get("latest") else set()
    assert latest <= left, "what DeepSpeed's `latest` names"
    for n in exp["names"]:
        if step[n] in milestones:
            assert n in left, "a milestone"
    # maybe in flight: nothing finished and valid is newer (a tag newer than `latest` is not finished)
    in_flight = {
        n for n in exp["invalid"] if not any(v > step[n] for v in counted_steps)
    } | pointer_in_flight
    assert in_flight <= left, "the newest entry (a save possibly in flight) is never deleted"
    old_invalid = set(exp["invalid"]) - in_flight
    if not delete_invalid:
        assert old_invalid <= left and set(report.old_invalid) == old_invalid
        assert report.old_invalid_bytes == sum(
            e.bytes for e in report.keep if e.name in old_invalid
        )
    window = set(counted_steps[-keep_last:])
    allowed = (
        {n for n in counted if step[n] in window}
        | exp["best"]
        | in_flight
        | latest
        | exp.get("extras", set())
        | {n for n in exp["names"] if step[n] in milestones}
        | (set() if delete_invalid else old_invalid)
    )
    assert left <= allowed, f"kept beyond the bound: {sorted(left - allowed)}"
    assert len(left) <= (
        keep_last * 2
        + len(exp["best"])
        + len(in_flight)
        + len(milestones) * 2
        + len(latest)
        + len(exp.get("extras", set()))
        + (0 if delete_invalid else len(old_invalid))
    )  # two files of one step count as one


LAYOUTS = ("hf", "lightning", "hf-2-ranks", "deepspeed", "dcp")


def _generate(layout: str, rng: random.Random, request, root: Path) -> dict:
    if layout == "lightning":
        exp = _generate_pl(rng, request.getfixturevalue("pl_top2"), root)
    else:
        root.mkdir()
        if layout == "hf":
            exp = _generate_hf(rng, request.getfixturevalue("hf_run"), root)
        elif layout == "hf-2-ranks":
            exp = _generate_torn(rng, request.getfixturevalue("torn_rank_run"), root)
        elif layout == "deepspeed":
            pytest.importorskip("deepspeed", reason="DeepSpeed is in the frameworks extra")
            exp = _generate_ds(rng, request.getfixturevalue("deepspeed_zero2_run"), root)
        else:
            exp = _generate_dcp(rng, request.getfixturevalue("dcp_sharded"), root)
    exp["extras"] = exp.get("extras", set()) | _add_unrecognised(rng, root)
    return exp


@pytest.mark.parametrize("seed", range(FOLDERS))
def test_generated_run_folders_obey_the_bound(
    seed, hf_run, request, tmp_path
):  # hf_run: marks it slow
    """Folders of every layout (seed % 5: HF, Lightning, 2-process HF, DeepSpeed ZeRO-2, DCP), made of real saves;
    after --apply the kept set is within the bound and holds everything needed."""
    rng = random.Random(seed)
    root = tmp_path / "run"
    exp = _generate(LAYOUTS[seed % len(LAYOUTS)], rng, request, root)
    keep_last = rng.randint(1, 3)
    steps = [rt.classify_name(n).step for n in exp["names"]]
    milestones = rng.sample(steps, rng.randint(0, 1))
    delete_invalid = rng.random() < 0.5
    kw = dict(
        keep_last=keep_last, milestones=milestones, spike_check=False, delete_invalid=delete_invalid
    )
    dry = prune(root, **kw)
    status = {e.name: e.status for e in (*dry.keep, *dry.delete)}
    assert {n for n in exp["names"] if status[n] == "valid"} == set(exp["valid"]), status
    assert {n for n in exp["names"] if status[n] == "incomplete"} >= exp.get("incomplete", set()), (
        status
    )
    if (
        not delete_invalid and dry.old_invalid
    ):  # what the report says --delete-invalid removes, it removes
        kept_by = {
            e.name: set(e.reason_kinds) for e in prune(root, **{**kw, "delete_invalid": True}).keep
        }
        assert not [
            n
            for n in dry.old_invalid
            if n in kept_by and not kept_by[n] & {"milestone", "trainer_best", "latest"}
        ], kept_by
    report = prune(root, apply=True, **kw)
    assert report.state == "done" and not report.errors
    assert [e.name for e in report.delete] == [e.name for e in dry.delete]
    left = set(os.listdir(root))
    _check_bound(report, exp, keep_last, milestones, delete_invalid, left)
    for e in report.delete:
        assert e.justified_by in left and e.justified_by in exp["valid"]
        assert e.justified_by not in exp.get("pointer_in_flight", set())
    again = prune(root, **kw)  # idempotent: the bound holds, nothing more to delete
    assert again.delete == []


# --------------------------------------------------------------------------- the keep rules alone (no files)


def _c(name: str, status: str = "valid") -> rt.Candidate:
    m = rt.classify_name(name)
    return rt.Candidate(name, m.step, m.layout, status, status == "valid", metrics=m.metrics)


def _kinds(plan) -> dict[str, tuple[str, list[str]]]:
    return {d.candidate.name: (d.action, [r.kind for r in d.reasons]) for d in plan.decisions}


def test_keep_last_counts_one_file_per_step():
    names = [
        "epoch=0-step=40.ckpt",
        "epoch=0-step=50.ckpt",
        "epoch=0-step=60.ckpt",
        "epoch=0-step=60-v1.ckpt",
    ]
    plan = rt.plan_prune(
        [_c(n) for n in names], rt.Retention(keep_last=2, best={"epoch=0-step=60-v1.ckpt": "top-1"})
    )
    kinds = _kinds(plan)
    assert kinds["epoch=0-step=50.ckpt"] == ("keep", ["keep_last"])
    assert kinds["epoch=0-step=60.ckpt"] == ("keep", ["newest"])
    assert kinds["epoch=0-step=60-v1.ckpt"] == ("keep", ["trainer_best"])
    assert kinds["epoch=0-step=40.ckpt"][0] == "delete"


def test_old_invalid_kept_by_default_deleted_with_the_option_unless_a_rule_keeps_it():
    cs = [
        _c("checkpoint-10", "invalid"),
        _c("checkpoint-20", "incomplete"),
        _c("checkpoint-30"),
        _c("checkpoint-40"),
        _c("checkpoint-50", "invalid"),
    ]
    kinds = _kinds(rt.plan_prune(cs, rt.Retention(keep_last=1)))
    assert kinds["checkpoint-10"] == kinds["checkpoint-20"] == ("keep", ["old_invalid"])
    assert kinds["checkpoint-50"] == ("keep", ["not_valid"])  # the newest entry: maybe in flight
    kinds = _kinds(
        rt.plan_prune(
            cs, rt.Retention(keep_last=1, milestones=frozenset({20}), delete_invalid=True)
        )
    )
    assert kinds["checkpoint-10"] == ("delete", ["delete_invalid"])
    assert kinds["checkpoint-20"] == ("keep", ["milestone"])
    assert kinds["checkpoint-50"] == ("keep", ["not_valid"])
    assert kinds["checkpoint-30"][0] == "delete" and kinds["checkpoint-40"] == ("keep", ["newest"])


def test_a_tag_newer_than_latest_makes_no_older_invalid_one_old():
    """DeepSpeed's tags newer than `latest` are in flight (found by the generated folders, seeds 23 and 28): an
    invalid tag older than only those is no `old_invalid` (the report said --delete-invalid removes it; nothing
    finished stands in for it, so the option kept it)."""
    cs = [_c("global_step5", "invalid"), _c("global_step10", "incomplete"), _c("global_step15")]
    for delete_invalid in (False, True):
        kinds = _kinds(
            rt.plan_prune(
                cs, rt.Retention(keep_last=1, latest="global_step10", delete_invalid=delete_invalid)
            )
        )
        assert kinds["global_step5"] == ("keep", ["not_valid"])
        assert kinds["global_step10"] == ("keep", ["not_valid", "latest"])
        assert kinds["global_step15"] == ("keep", ["in_flight"])
    kinds = _kinds(
        rt.plan_prune(cs, rt.Retention(keep_last=1, latest="global_step15"))
    )  # every rank finished 15
    assert kinds["global_step5"] == kinds["global_step10"] == ("keep", ["old_invalid"])
    kinds = _kinds(
        rt.plan_prune(cs, rt.Retention(keep_last=1, latest="global_step15", delete_invalid=True))
    )
    assert kinds["global_step5"] == kinds["global_step10"] == ("delete", ["delete_invalid"])
