"""recover on real public training logs (tests/data/real-logs/manifest.json: repo, path, commit, the
label and why). Runs that diverge or shift must get a rollback with the right kind and onset and a
resume point before the trouble; runs that do not must be told to keep training.

An entry with "known_wrong" is a log on which recover gives the wrong answer today: its right answer is
an xfail (strict, so a fix shows up as XPASS and the entry must be updated), and its "current" answer
is asserted as it is, so any change in that wrong behaviour is seen too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_strategy.recovery import advise

DATA = Path(__file__).parent / "data" / "real-logs"
MANIFEST = json.loads((DATA / "manifest.json").read_text(encoding="utf-8"))
LOGS = MANIFEST["logs"]
KINDS = {"spike", "divergence", "level_shift", "nonfinite", "collapse"}


def _advise(entry, checkpoints):
    return advise(DATA / entry["file"], checkpoints, loss_key=entry.get("loss_key"))


def _params(entries):
    return [
        pytest.param(
            e,
            id=e["file"],
            marks=[pytest.mark.xfail(strict=True, reason=e["known_wrong"])]
            if "known_wrong" in e
            else [],
        )
        for e in entries
    ]


def test_the_corpus_is_big_enough_and_sourced():
    bad = [e for e in LOGS if e["expect"]["rollback"]]
    good = [e for e in LOGS if not e["expect"]["rollback"]]
    assert len(bad) >= 8 and len(good) >= 12
    assert {e["label"] for e in good} >= {"clean", "overfitting"}
    # the bad set is not one repository's one failure mode
    assert len({e["repo"] for e in bad}) >= 4
    assert {k for e in bad for k in e["expect"]["kinds"]} >= {
        "divergence",
        "level_shift",
        "nonfinite",
    }
    assert (
        max(sum(e["repo"] == r for e in bad) for r in {e["repo"] for e in bad}) <= len(bad) // 2 + 1
    )
    for e in LOGS:
        assert (DATA / e["file"]).is_file()
        assert (
            len(e["commit"]) == 40
            and int(e["commit"], 16) >= 0
            and "/" in e["repo"]
            and e["path"]
            and e["reason"]
        )
        exp = e["expect"]
        if exp["rollback"]:
            # one kind, or two only where the log supports both
            assert set(exp["kinds"]) <= KINDS and 1 <= len(exp["kinds"]) <= 2
            assert exp["onset"][0] <= exp["onset"][1]
        if "known_wrong" in e:
            assert e["known_wrong"] and set(e["current"]) >= {"status", "verdict"}
    assert len({(e["repo"], e["path"]) for e in LOGS}) == len(LOGS)
    assert len({e["file"] for e in LOGS}) == len(LOGS)


@pytest.mark.parametrize("entry", _params(LOGS))
def test_recover_gives_the_right_answer(entry):
    exp = entry["expect"]
    r = _advise(entry, [])
    if exp["rollback"]:
        assert r.status in ("rollback", "no_clean_checkpoint"), r.summary
        assert r.self_recovered is False and r.verdict in ("diverged", "recovering")
        assert r.spike.kind in exp["kinds"], (r.spike.kind, r.spike.detail)
        lo, hi = exp["onset"]
        assert lo <= r.spike.onset_step <= hi, (r.spike.onset_step, r.spike.detail)
        if "verdict" in exp:
            verdicts = exp["verdict"] if isinstance(exp["verdict"], list) else [exp["verdict"]]
            assert r.verdict in verdicts, r.verdict_detail
        # with checkpoints every 50 steps, the resume point is the newest one before the onset
        steps = list(range(0, r.log.last_step + 1, 50))[1:]
        r2 = _advise(entry, steps)
        before = (
            [s for s in steps if s <= r.checkpoints.cutoff_step]
            if r.checkpoints.cutoff_step
            else []
        )
        if before:
            assert (
                r2.resume_checkpoint is not None
                and r2.resume_checkpoint.step < r2.spike.onset_step <= hi
            )
            if r2.resume_checkpoint.within_tolerance is not True:
                # a curve still falling fast before the onset: no earlier checkpoint is within 10 % of the
                # healthy level, and recover must say so
                assert any("newest clean candidate" in w for w in r2.warnings), r2.warnings
            assert all(
                c.step > r2.spike.onset_step - r2.checkpoints.margin_steps
                for c in r2.checkpoints.post_event
            )
            assert r2.checkpoints.post_event and r2.checkpoints.post_event[-1].step == steps[-1]
    else:
        # a clean run is not headlined as an event: only a grad-norm event (a threshold crossed) has a status
        ok = (exp["status"],) if "status" in exp else ("no_spike",)
        assert r.status in ok, (r.summary, [(s.kind, s.onset_step) for s in r.spikes])
        assert r.verdict == "healthy" and r.resume_checkpoint is None
        if "status" in exp:  # a grad-norm-only event: keep training, nothing to resume from
            assert r.spike.kind == "grad_norm" and "keep training" in r.summary
        if exp.get("overfitting"):
            assert r.eval is not None and r.eval.overfitting is True
            assert any("overfitting" in line for line in r.reasons)


@pytest.mark.parametrize("entry", [e for e in LOGS if "known_wrong" in e], ids=lambda e: e["file"])
def test_known_wrong_answers_are_still_what_they_were(entry):
    """The wrong answer as recorded: if this fails, recover's behaviour on the log changed (see the
    entry's known_wrong; when the right-answer test XPASSes, drop known_wrong and current)."""
    cur = entry["current"]
    r = _advise(entry, [])
    assert (r.status, r.verdict) == (cur["status"], cur["verdict"]), r.summary
    if "kind" in cur:
        assert (r.spike.kind, r.spike.onset_step) == (cur["kind"], cur["onset"]), r.spike.detail


ROLLBACKS = [e for e in LOGS if e["expect"]["rollback"]]


def _checkpoint_sets(entry):
    """Checkpoints simulated at the log's own steps (the weights the logged loss came from): every logged step,
    every 5th and every 20th."""
    from checkpoint_strategy.recovery.logs import Columns, read_log

    steps = [
        int(s)
        for s in read_log(DATA / entry["file"], columns=Columns(loss=entry.get("loss_key"))).steps
    ]
    return [(k, steps[::k]) for k in (1, 5, 20)]


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["file"]) for e in ROLLBACKS])
def test_the_advised_resume_step_is_at_or_before_the_latest_safe_step(entry):
    """The gate (issue 42): with checkpoints simulated every save interval, recover never advises a step after
    the labelled latest safe step (the last logged step before the trouble began, read from the curve before
    the tool ran: the entry's safe_how), and never more than one save interval before the newest checkpoint the
    log shows clean (one before the latest safe step: checkpoint N's loss is logged after N, in the entry that
    shows the trouble). No checkpoint at all (a restart from scratch) counts as step 0. Entries whose kind or
    verdict is known wrong are gated too: a wrong kind must not move the resume step. No exception is allowed."""
    safe = entry["expect"]["latest_safe_step"]
    for k, steps in _checkpoint_sets(entry):
        r = _advise(entry, steps)
        res = r.resume_checkpoint.step if r.resume_checkpoint is not None else 0
        clean = [s for s in steps if s < safe]
        save = steps[1] - steps[0] if len(steps) > 1 else 1
        newest = clean[-1] if clean else 0
        assert res <= safe, (k, res, safe, r.summary)
        assert res >= newest - save, (k, res, newest, save, r.summary)


def test_every_rollback_entry_has_a_latest_safe_step_and_how_it_was_read():
    assert len(ROLLBACKS) >= 25
    # the gate holds for every entry: none may be excused (issue 42: "none after the latest safe step")
    assert not any("gate_known_wrong" in e for e in ROLLBACKS)
    for e in ROLLBACKS:
        assert isinstance(e["expect"]["latest_safe_step"], int) and e["safe_how"]
        assert e["expect"]["latest_safe_step"] < e["expect"]["onset"][1]
