"""recover on real public training logs (tests/data/real-logs/manifest.json: repo, path, commit, the
label and why). Runs that diverge or shift must get a rollback with the right kind and onset and a
resume point before the trouble; runs that do not must be told to keep training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_strategy.recovery import advise

DATA = Path(__file__).parent / "data" / "real-logs"
MANIFEST = json.loads((DATA / "manifest.json").read_text(encoding="utf-8"))
LOGS = MANIFEST["logs"]


def test_the_corpus_is_big_enough_and_sourced():
    bad = [e for e in LOGS if e["expect"]["rollback"]]
    good = [e for e in LOGS if not e["expect"]["rollback"]]
    assert len(bad) >= 8 and len(good) >= 12
    assert {e["label"] for e in good} >= {"clean", "overfitting"}
    for e in LOGS:
        assert (DATA / e["file"]).is_file()
        assert len(e["commit"]) == 40 and "/" in e["repo"] and e["path"] and e["reason"]
    assert len({(e["repo"], e["path"]) for e in LOGS}) == len(LOGS)


@pytest.mark.parametrize("entry", LOGS, ids=[e["file"] for e in LOGS])
def test_recover_gives_the_right_answer(entry):
    exp = entry["expect"]
    r = advise(DATA / entry["file"], [])
    if exp["rollback"]:
        assert r.status in ("rollback", "no_clean_checkpoint"), r.summary
        assert r.self_recovered is False and r.verdict in ("diverged", "recovering")
        assert r.spike.kind in exp["kinds"], (r.spike.kind, r.spike.detail)
        lo, hi = exp["onset"]
        assert lo <= r.spike.onset_step <= hi, (r.spike.onset_step, r.spike.detail)
        if "verdict" in exp:
            assert r.verdict == exp["verdict"]
        # with checkpoints every 50 steps, the resume point is the newest one before the onset
        steps = list(range(0, r.log.last_step + 1, 50))[1:]
        r2 = advise(DATA / entry["file"], steps)
        before = [s for s in steps if s <= r.checkpoints.cutoff_step] if r.checkpoints.cutoff_step else []
        if before:
            assert r2.resume_checkpoint is not None and r2.resume_checkpoint.step < r2.spike.onset_step <= hi
            assert r2.resume_checkpoint.within_tolerance is True
            assert all(c.step > r2.spike.onset_step - r2.checkpoints.margin_steps for c in r2.checkpoints.post_event)
            assert r2.checkpoints.post_event and r2.checkpoints.post_event[-1].step == steps[-1]
    else:
        assert r.status in ("no_spike", "self_recovered"), (r.summary, [(s.kind, s.onset_step) for s in r.spikes])
        assert r.verdict == "healthy" and r.resume_checkpoint is None
        if exp.get("overfitting"):
            assert r.eval is not None and r.eval.overfitting is True
            assert any("overfitting" in line for line in r.reasons)
