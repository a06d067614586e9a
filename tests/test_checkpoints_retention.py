"""The keep rules (retention/rules.py): names, pure plans, and a randomized prune over
generated run folders built from copies of the real HF Trainer run."""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats.reasonkinds import REASON_KINDS
from checkpoint_strategy.recovery import advise
from checkpoint_strategy.retention import prune as _prune
from checkpoint_strategy.retention import rules as rt

prune = functools.partial(
    _prune, advise=advise
)  # as prune_cli and the callbacks call it (the adviser is passed in)

# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name, layout, step",
    [
        ("checkpoint-500", "hf-trainer", 500),
        ("tmp-checkpoint-500", "hf-trainer", 500),
        ("global_step42", "deepspeed", 42),
        ("iter_0001000", "megatron", 1000),
        ("step-7", "torchtitan", 7),
        ("1200", "orbax", 1200),
        ("1200.orbax-checkpoint-tmp-1712345", "orbax", 1200),
        ("epoch=0-step=10.ckpt", "lightning", 10),
        ("epoch=2-step=300-v1.ckpt", "lightning", 300),
        ("epoch=0-step=10-val_loss=0.123.ckpt", "lightning", 10),
        ("step=10-val_loss=-1.5e-03.ckpt", "lightning", 10),
        ("last.ckpt", "lightning", None),
        ("epoch=3.ckpt", "lightning", None),
    ],
)
def test_known_names(name, layout, step):
    m = rt.classify_name(name)
    assert m is not None and (m.layout, m.step) == (layout, step)


@pytest.mark.parametrize(
    "name",
    [
        "checkpoint-50-KEEP-before-lr-change",
        "best-checkpoint-100.bak",
        "checkpoint-100 (copy)",
        "final-model-step=50.safetensors",
        "checkpoint-10\n",
        "checkpoint-１０",
        "iter_1000",
        "iter_00010000",
        "global_step",
        "checkpoint-",
        "step_10",
        "step=10",
        "ckpt_100",
        "100 ",
        "epoch=0-step=1.5.ckpt",
        "epoch=0--step=10.ckpt",
        "epoch=0-step=10-.ckpt",
        "epoch=0-epoch=1.ckpt",
        "model.ckpt",
        "epoch=x.ckpt",
        "epoch=0-step=10.ckpt.bak",
        "last.ckpt.tmp",
        ".deleting-0123456789abcdef",
    ],
)
def test_unknown_names_are_not_recognised(name):
    assert rt.classify_name(name) is None


def test_lightning_metrics_and_template():
    m = rt.classify_name("epoch=0-step=10-val_loss=0.123-val_acc=0.9.ckpt")
    assert (
        m.metrics == ("val_loss", "val_acc")
        and m.template == "epoch={}-step={}-val_loss={}-val_acc={}"
    )


# --------------------------------------------------------------------------- pure plans


def C(name, step, *, resumable=True, status="valid", layout="hf-trainer", **kw):  # noqa: N802
    return rt.Candidate(name, step, layout, status, resumable, **kw)


def test_weights_only_newest_does_not_count_when_resumable_ones_exist():
    cs = [C("c10", 10), C("c20", 20), C("c30", 30, resumable=False)]
    plan = rt.plan_prune(cs, rt.Retention(keep_last=1))
    assert {d.candidate.name: d.action for d in plan.decisions} == {
        "c10": "delete",
        "c20": "keep",
        "c30": "keep",
    }
    assert plan.newest.name == "c20" and plan.counts_resumable
    assert [r.kind for r in plan.decisions[2].reasons] == ["unjustified"]


def test_a_weights_only_post_onset_checkpoint_never_justifies_deleting_a_resumable_one():
    # found by the randomized prune (seed 194): no safe checkpoint left, so keep_last counted valid ones,
    # and the post-onset window let a newer weights-only checkpoint justify deleting the only resumable one
    cs = [
        C("checkpoint-50", 50, status="invalid"),
        C("checkpoint-130", 130),
        C("checkpoint-190", 190, resumable=False),
    ]
    post = {"checkpoint-130": "after the spike", "checkpoint-190": "after the spike"}
    plan = rt.plan_prune(cs, rt.Retention(keep_last=1, post_onset=post))
    assert not plan.delete
    kinds = {d.candidate.name: [r.kind for r in d.reasons] for d in plan.decisions}
    assert kinds["checkpoint-130"] == ["post_onset"] and kinds["checkpoint-190"] == ["unjustified"]


def test_symlink_targets_latest_and_in_flight_are_kept_and_never_counted():
    cs = [
        C("global_step5", 5, layout="deepspeed"),
        C("global_step10", 10, layout="deepspeed"),
        C("global_step15", 15, layout="deepspeed"),
        C("global_step20", 20, layout="deepspeed"),
        C("best", None, layout=None, symlink=True, links_to="global_step5"),
        C("elsewhere", None, layout=None, symlink=True, outside=True),
    ]
    plan = rt.plan_prune(cs, rt.Retention(keep_last=1, latest="global_step10"))
    kinds = {d.candidate.name: [r.kind for r in d.reasons] for d in plan.decisions}
    assert kinds["global_step5"] == ["link_target"] and kinds["global_step10"][:1] == ["latest"]
    assert kinds["global_step15"] == ["in_flight"] and kinds["global_step20"] == ["in_flight"]
    assert kinds["best"] == ["symlink"] and kinds["elsewhere"] == ["symlink"]
    assert plan.newest.name == "global_step10" and not plan.delete
    moved = rt.plan_prune(cs, rt.Retention(keep_last=1, latest="global_step20"))
    assert sorted(d.candidate.name for d in moved.delete) == ["global_step10", "global_step15"]
    assert {d.justified_by for d in moved.delete} == {"global_step20"}


def test_extra_rules_only_add_keep_reasons():
    def keep_even_hundreds(c, ctx):
        return rt.Reason("milestone", "hundreds") if c.step and c.step % 100 == 0 else None

    cs = [C("c100", 100), C("c150", 150), C("c200", 200)]
    one = rt.Retention(keep_last=1)
    plan = rt.plan_prune(cs, one, rules=rt.AnyOf(*one.rules().rules, keep_even_hundreds))
    assert [d.candidate.name for d in plan.delete] == ["c150"]
    # even with no policy rules at all, the safety rules and "a newer one stands in" still hold
    plan = rt.plan_prune(cs + [C("x", None, layout=None)], rt.Retention(keep_last=1), rules=())
    assert [d.candidate.name for d in plan.delete] == ["c100", "c150"]


def test_bad_retention_and_duplicates():
    from checkpoint_strategy.errors import UsageError
    from checkpoint_strategy.retention.request import PruneRequest

    for bad in (
        0,
        -1,
        True,
        "3",
        2.0,
    ):  # checked once, where every option of a prune is: PruneRequest
        with pytest.raises(UsageError, match="--keep-last must be an integer of at least 1"):
            PruneRequest(root="run", keep_last=bad)
    with pytest.raises(ValueError):
        rt.plan_prune([C("a", 1), C("a", 2)], rt.Retention(keep_last=1))


_candidates = st.lists(
    st.builds(
        lambda step, resumable, status, layout, symlink, metric: dict(
            step=step,
            resumable=resumable,
            status=status,
            layout=layout,
            symlink=symlink,
            metric=metric,
        ),
        step=st.one_of(st.none(), st.integers(0, 60)),
        resumable=st.booleans(),
        status=st.sampled_from(["valid", "valid", "valid", "invalid", "incomplete", None]),
        layout=st.sampled_from(["hf-trainer", "hf-trainer", "lightning", None]),
        symlink=st.booleans(),
        metric=st.booleans(),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(
    raw=_candidates,
    keep_n=st.integers(1, 5),
    milestones=st.frozensets(st.integers(0, 60), max_size=4),
    best_i=st.integers(0, 30),
    rollback_i=st.integers(0, 30),
)
def test_plan_invariants(raw, keep_n, milestones, best_i, rollback_i):
    cs = [
        rt.Candidate(
            f"n{i}",
            r["step"],
            r["layout"],
            r["status"],
            r["resumable"],
            r["symlink"],
            ("val_loss",) if r["metric"] and r["layout"] == "lightning" else (),
        )
        for i, r in enumerate(raw)
    ]
    best = {f"n{best_i}": "best"}
    plan = rt.plan_prune(
        cs,
        rt.Retention(keep_last=keep_n, milestones=milestones, best=best, rollback=f"n{rollback_i}"),
    )
    deleted = {d.candidate.name for d in plan.delete}
    counted = [
        c for c in cs if c.layout and not c.symlink and c.status == "valid" and c.step is not None
    ]
    resumable = [c for c in counted if c.resumable]
    pool = resumable or counted
    for d in plan.delete:
        c = d.candidate
        assert (
            c.layout
            and not c.symlink
            and c.status == "valid"
            and c.step is not None
            and not c.metrics
        )
        assert c.step not in milestones and c.name not in best and c.name != f"n{rollback_i}"
        j = next(x for x in cs if x.name == d.justified_by)
        assert j.step > c.step and j.name not in deleted and not j.symlink and j.status == "valid"
        if resumable:
            assert j.resumable
    if pool:
        top = max(c.step for c in pool)
        assert all(c.name not in deleted for c in pool if c.step == top)
        # the keep_last newest counted checkpoints survive
        ranked = sorted(pool, key=lambda c: (c.step, c.name))[-keep_n:]
        assert not deleted & {c.name for c in ranked}
    else:
        assert not deleted
    for d in plan.decisions:
        assert d.reasons and all(r.kind in REASON_KINDS for r in d.reasons)


# --------------------------------------------------------------------------- generated run folders
# Issues 9, 28 and 29: >= 200 generated folders (FOLDERS seeds), each pruned with --apply, 0 violations.

FOLDERS = 200


def _link_or_copy(src: str, dst: str) -> None:
    """Hard links keep 200 folders cheap; every file a generator changes is unlinked first (never written
    through a link)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _smooth_state(path: Path) -> None:
    """Rewrite a real trainer_state.json so its loss never spikes (a run without a spike)."""
    data = json.loads(path.read_text())
    for i, rec in enumerate(data.get("log_history", [])):
        if "loss" in rec:
            rec["loss"] = round(2.0 / (1 + 0.01 * rec.get("step", i)), 4)
    _rewrite(path, json.dumps(data).encode())


def _damage(rng: random.Random, ckpt: Path, kind: str) -> None:
    if kind == "weights":
        for n in ("optimizer.pt", "scheduler.pt"):
            (ckpt / n).unlink()
    elif kind == "incomplete":  # half copied: the weights never arrived
        (ckpt / "model.safetensors").unlink()
    elif kind == "truncated":
        f = ckpt / rng.choice(["model.safetensors", "optimizer.pt"])
        data = f.read_bytes()
        _rewrite(f, data[: rng.randint(0, len(data) - 1)])
    elif kind == "corrupt":  # past its headers: only the CRC-32 of level full sees it
        from test_checkpoints_prune_guards import flip_tensor_byte

        flip_tensor_byte(ckpt / "optimizer.pt")


def _add_checkpoints(rng, hf_run, root: Path, outside: Path, steps, expect: dict) -> None:
    for i, step in enumerate(steps):
        kind = rng.choices(
            ["resumable", "weights", "incomplete", "truncated", "symlink", "unrecognised"],
            weights=[8, 2, 1, 1, 1, 1],
        )[0]
        if i == len(steps) - 1 and rng.random() < 0.25:
            kind = "corrupt"
        src = hf_run.output_dir / f"checkpoint-{step}"
        name = f"checkpoint-{step:05d}" if rng.random() < 0.15 else f"checkpoint-{step}"
        if kind == "symlink":
            shutil.copytree(src, outside / name, copy_function=_link_or_copy)
            (root / name).symlink_to(outside / name)
            expect["symlinks"].append(name)
            continue
        if kind == "unrecognised":
            name = rng.choice(
                [
                    f"checkpoint-{step}-KEEP",
                    f"checkpoint-{step} (copy)",
                    f"best-checkpoint-{step}.bak",
                    f"checkpoint-{step}|x",
                    f"checkpoint-{step}\nDELETE",
                ]
            )
            expect["unrecognised"].append(name)
        shutil.copytree(src, root / name, copy_function=_link_or_copy)
        _damage(rng, root / name, kind)
        if kind in ("resumable", "corrupt"):
            expect["resumable_valid" if kind == "resumable" else "corrupt"].append((step, name))
        if kind in ("incomplete", "truncated"):
            expect["incomplete"].append(name)
        if kind in ("resumable", "weights", "corrupt"):  # valid at the quick level
            expect["valid_names"].append(name)
        if not expect["spike"] and (root / name / "trainer_state.json").exists():
            _smooth_state(root / name / "trainer_state.json")


def _add_links_and_best(rng, root: Path, outside: Path, expect: dict) -> None:
    ckpts = sorted(
        n
        for n in os.listdir(root)
        if (root / n).is_dir() and not (root / n).is_symlink() and rt.classify_name(n) is not None
    )
    for link in ("best", "latest"):
        if ckpts and rng.random() < 0.5:
            target = rng.choice(ckpts)
            (root / link).symlink_to(target if rng.random() < 0.5 else root / target)
            expect["link_targets"].append(target)
            expect["unrecognised"].append(link)
    if rng.random() < 0.3:
        (root / "elsewhere").symlink_to(outside)
        expect["unrecognised"].append("elsewhere")
    recognised = [n for n in ckpts if (root / n / "trainer_state.json").exists()]
    for (
        state
    ) in recognised:  # every state names a best when it was saved (most often itself): the past
        if rng.random() < 0.5:
            _name_best(root / state, rng.choice(ckpts))
    valid = [n for n in recognised if n in expect["valid_names"]]
    if (
        valid and rng.random() < 0.6
    ):  # the Trainer's best now: the newest valid checkpoint's state names it
        best = rng.choice(ckpts)
        _name_best(root / max(valid, key=lambda n: rt.classify_name(n).step), best)
        expect["best"] = best


def _name_best(ckpt: Path, best: str) -> None:
    p = ckpt / "trainer_state.json"
    data = json.loads(p.read_text())
    data["best_model_checkpoint"] = f"somewhere/{best}"
    _rewrite(p, json.dumps(data).encode())


def _generate(rng: random.Random, hf_run, base: Path, spike: bool) -> dict:
    """A run folder of real checkpoints in every state prune meets; returns what must survive."""
    root, outside = base / "run", base / "outside"
    root.mkdir(parents=True)
    outside.mkdir()
    (outside / "precious.txt").write_text("not prune's")
    steps = sorted(rng.sample(hf_run.checkpoint_steps, rng.randint(3, 10)))
    expect: dict = {
        "resumable_valid": [],
        "corrupt": [],
        "best": None,
        "unrecognised": [],
        "symlinks": [],
        "incomplete": [],
        "link_targets": [],
        "spike": spike,
        "valid_names": [],
    }
    _add_checkpoints(rng, hf_run, root, outside, steps, expect)
    _add_links_and_best(rng, root, outside, expect)
    if rng.random() < 0.5:
        (root / "README.md").write_text("notes")
        expect["unrecognised"].append("README.md")
    expect["milestone_steps"] = rng.sample(steps, rng.randint(0, 2))
    expect["keep_last"] = rng.randint(1, 3)
    expect["spike_check"] = rng.random() < 0.8
    return expect


def _tree(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.lstat().st_size) for p in folder.rglob("*"))


def _check_spike_rules(report, expect: dict, left: set) -> None:
    guard = report.spike_guard
    cutoff = guard.cutoff_step if guard is not None and guard.cutoff_step is not None else None
    safe = [(s, n) for s, n in expect["resumable_valid"] if cutoff is None or s <= cutoff]
    post = sorted((s, n) for s, n in expect["resumable_valid"] if cutoff is not None and s > cutoff)
    assert {n for _s, n in post[-expect["keep_last"] :]} <= left, (
        "the keep_last newest post-onset are kept"
    )
    for e in report.delete:  # a post-onset checkpoint never justifies deleting a safe one
        if cutoff is not None and e.step is not None and e.step <= cutoff:
            assert rt.classify_name(e.justified_by).step <= cutoff, (e.name, e.justified_by)
    if safe and not expect["corrupt"]:
        assert max(safe)[1] in left and report.newest_valid == max(safe)[1]
        assert {n for _s, n in sorted(safe)[-expect["keep_last"] :]} <= left
    if guard is not None and guard.protected:
        assert guard.protected in left
    if not expect["spike"]:
        assert guard is None or guard.protected is None


@pytest.mark.parametrize("seed", range(FOLDERS))
def test_randomized_prune_keeps_what_must_survive(seed, hf_run, tmp_path):
    rng = random.Random(seed)
    expect = _generate(rng, hf_run, tmp_path, spike=seed % 2 == 0)
    root, outside = tmp_path / "run", tmp_path / "outside"
    outside_before = _tree(outside)
    kw = dict(
        keep_last=expect["keep_last"],
        milestones=expect["milestone_steps"],
        spike_check=expect["spike_check"],
    )
    dry = prune(root, **kw)
    report = prune(root, apply=True, **kw)
    left = set(os.listdir(root))
    assert report.state in ("done", "failed")
    if (
        report.state == "failed"
    ):  # only ever: the corrupt newest justified the deletions; nothing deleted
        assert expect["corrupt"] and report.deleted == 0
        assert all("CRC-32" in p.reason and "nothing deleted" in p.reason for p in report.errors)
    else:
        assert not report.errors
        assert [e.name for e in report.delete] == [e.name for e in dry.delete], (
            "dry run and --apply agree"
        )
    resumable = sorted(expect["resumable_valid"])
    if (
        resumable
    ):  # the newest resumable valid checkpoint (the older good one when the newest is corrupt)
        assert resumable[-1][1] in left
    _check_spike_rules(report, expect, left)
    for step in expect["milestone_steps"]:
        assert not {f"checkpoint-{step}", f"checkpoint-{step:05d}"} & {
            e.name for e in report.delete
        }
    if expect["best"]:
        assert expect["best"] in left
    for name in expect["link_targets"]:
        assert name in left
    for link in ("best", "latest"):
        if (root / link).is_symlink():
            assert (root / link).resolve().exists(), f"{link} dangles"
    assert set(expect["unrecognised"]) <= left
    assert set(expect["incomplete"]) <= left
    assert set(expect["symlinks"]) <= left
    assert {n for _s, n in expect["corrupt"]} <= left
    assert _tree(outside) == outside_before
    assert (
        report.deleted
        == len({e.name for e in report.delete} - left)
        == len([e for e in report.delete if e.deleted])
    )
    for e in report.delete:  # whatever justified a deletion is still there
        assert e.justified_by in left


# The not-slow subset: DeepSpeed tags (real torch.save archives, tests/layouts.py), with `latest`.

DS_STEPS = tuple(range(5, 65, 5))


@pytest.fixture(scope="module")
def ds_template(tmp_path_factory):
    import layouts

    return layouts.build_deepspeed(tmp_path_factory.mktemp("ds-template") / "ds", steps=DS_STEPS)


def _ds_generate(rng: random.Random, template: Path, base: Path) -> dict:
    root, outside = base / "run", base / "outside"
    root.mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("not prune's")
    steps = sorted(rng.sample(DS_STEPS, rng.randint(2, 8)))
    expect: dict = {"valid": [], "kept": [], "corrupt": None}
    for i, step in enumerate(steps):
        kind = rng.choices(["ok", "truncated", "half", "unrecognised"], weights=[8, 1, 1, 1])[0]
        if i == len(steps) - 1 and rng.random() < 0.3:
            kind = "corrupt"
        name = f"global_step{step:04d}" if rng.random() < 0.15 else f"global_step{step}"
        if kind == "unrecognised":
            name += "-KEEP"
        shutil.copytree(template / f"global_step{step}", root / name, copy_function=_link_or_copy)
        optim = sorted((root / name).glob("*optim_states.pt"))
        if kind == "truncated":
            data = optim[0].read_bytes()
            _rewrite(optim[0], data[: len(data) // 2])
        elif kind == "half":  # the model states never arrived
            (root / name / "mp_rank_00_model_states.pt").unlink()
        elif kind == "corrupt":
            from test_checkpoints_prune_guards import flip_tensor_byte

            flip_tensor_byte(optim[0])
            expect["corrupt"] = name
        (expect["valid"] if kind == "ok" else expect["kept"]).append((step, name))
    tags = [
        n for _s, n in expect["valid"] + ([(0, expect["corrupt"])] if expect["corrupt"] else [])
    ]
    expect["latest"] = rng.choice(tags) if tags and rng.random() < 0.8 else None
    if expect["latest"]:
        (root / "latest").write_text(expect["latest"])
    for link in ("best", "last"):
        if tags and rng.random() < 0.4:
            target = rng.choice(tags)
            (root / link).symlink_to(target)
            expect["kept"].append((0, target))
    if rng.random() < 0.3:
        (root / "elsewhere").symlink_to(outside)
    expect["keep_last"] = rng.randint(1, 3)
    expect["milestones"] = rng.sample(steps, rng.randint(0, 1))
    return expect


@pytest.mark.parametrize("seed", range(8))
def test_randomized_deepspeed_prune_keeps_latest_and_link_targets(seed, ds_template, tmp_path):
    rng = random.Random(1000 + seed)
    expect = _ds_generate(rng, ds_template, tmp_path)
    root, outside = tmp_path / "run", tmp_path / "outside"
    before_root, outside_before = set(os.listdir(root)), _tree(outside)
    kw = dict(keep_last=expect["keep_last"], milestones=expect["milestones"], spike_check=False)
    dry = prune(root, **kw)
    report = prune(root, apply=True, **kw)
    left = set(os.listdir(root))
    if report.state == "failed":
        assert expect["corrupt"] and report.deleted == 0 and left == before_root
        assert all("CRC-32" in p.reason for p in report.errors)
    else:
        assert report.state == "done" and not report.errors
        assert [e.name for e in report.delete] == [e.name for e in dry.delete]
    latest = expect["latest"]
    if latest:
        assert latest in left
        newer = {n for s, n in expect["valid"] if s > rt.classify_name(latest).step}
        assert newer <= left, "tags newer than latest are in flight"
    valid = sorted(expect["valid"])
    if valid:
        assert valid[-1][1] in left
    assert {n for _s, n in expect["kept"]} <= left
    for s in expect["milestones"]:
        assert not {f"global_step{s}", f"global_step{s:04d}"} & {e.name for e in report.delete}
    assert {"latest", "best", "last", "elsewhere"} & before_root <= left
    for link in ("best", "last"):
        if (root / link).is_symlink():
            assert (root / link).resolve().exists()
    assert _tree(outside) == outside_before
    for e in report.delete:
        assert e.justified_by in left
