"""One notion of "safe to resume from" (retention/safety.py), on the real HF run with an unrecovered
spike at step 121 (checkpoint-120 already holds spiked weights) and on its self-recovering twin."""

from __future__ import annotations

import json

import pytest

from checkpoint_strategy.retention import safety

POST = [f"checkpoint-{s}" for s in range(120, 201, 10)]


def test_validate_headlines_the_newest_safe_checkpoint(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    r = cli_run("validate", str(run))
    assert r.rc == 0, r.err
    first = r.out.splitlines()[1]
    assert first == (
        f"=> Resume from: {run}/checkpoint-110 (step 110): newest valid, resumable checkpoint before "
        "the loss spike at step 121; 11 safe rollback points"
    )
    assert "Do not resume: 9 checkpoints after the spike at step 121" in r.out.splitlines()[2]
    assert r.out.count("note: after the spike at step 121: do not resume") == 9
    data = cli_run("validate", str(run), "--format", "json").json()
    (s,) = data["safety"]
    assert (
        s["newest_safe"] == f"{run}/checkpoint-110"
        and s["newest_safe_resumable"]
        and s["safe"] == 11
    )
    assert [p.rsplit("/", 1)[1] for p in s["post_onset"]] == POST
    assert s["onset_step"] == 121 and s["spike_status"] == "rollback"
    off = cli_run("validate", str(run), "--no-spike-check", "--format", "json").json()["safety"][0]
    assert off["newest_safe"].endswith("checkpoint-200") and off["post_onset"] == []


def test_validate_one_checkpoint_has_no_run_headline(hf_run, cli_run):
    r = cli_run("validate", str(hf_run.output_dir / "checkpoint-150"), "--format", "json")
    assert r.json()["safety"] == []


def test_self_recovered_run_is_safe_to_the_newest(hf_run_self_recovering, cli_run):
    s = cli_run("validate", str(hf_run_self_recovering.output_dir), "--format", "json").json()[
        "safety"
    ][0]
    assert (
        s["newest_safe"].endswith("checkpoint-200")
        and s["post_onset"] == []
        and s["onset_step"] is None
    )


def test_release_gate_fails_a_post_onset_checkpoint(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    bad = cli_run("release-gate", str(run / "checkpoint-120"), "--format", "json")
    assert bad.rc == 1 and bad.json()["gate"] == "fail"
    check = [c for c in bad.json()["checks"] if c["name"] == "not after an unrecovered loss spike"][
        0
    ]
    assert not check["ok"] and "after the spike at step 121: do not resume" in check["detail"]
    good = cli_run("release-gate", str(run / "checkpoint-110"), "--format", "json")
    assert good.rc == 0 and good.json()["gate"] == "pass"
    assert cli_run("release-gate", str(run / "checkpoint-120"), "--no-spike-check").rc == 0


def test_on_event_names_post_onset_checkpoints(hf_run, copy_of, cli_run, tmp_path):
    run = copy_of(hf_run.output_dir, "run")
    ev = tmp_path / "ev.json"
    ev.write_text(
        json.dumps(
            {
                "event": "LOSS_SPIKE",
                "step": 121,
                "value": 10.1,
                "threshold": 2.5,
                "severity": "critical",
            }
        )
    )
    out = cli_run(
        "on-event",
        str(ev),
        "--checkpoints",
        str(run),
        "--log",
        str(run / "checkpoint-200" / "trainer_state.json"),
        "--format",
        "json",
    ).json()
    note = [n for n in out["notes"] if n.startswith("after the spike at step 121: do not resume")]
    assert note and "checkpoint-120" in note[0] and note[0].endswith(f"{run}/checkpoint-110")


def test_after_onset_is_recovers_cut():
    from checkpoint_strategy.formats.models import SpikeGuard

    g = SpikeGuard(log="x", status="rollback", onset_step=121, cutoff_step=119, note="")
    assert not safety.after_onset(119, g) and safety.after_onset(120, g)
    assert safety.safe_to_resume("valid", True, 110, g) and not safety.safe_to_resume(
        "valid", True, 120, g
    )
    assert not safety.safe_to_resume("valid", False, 110, g) and not safety.safe_to_resume(
        "invalid", True, 110, g
    )
    grad_only = SpikeGuard(
        log="x", status="wait", onset_step=121, note=""
    )  # no cut-off: not a loss event
    assert not safety.after_onset(150, grad_only)
    recovered = SpikeGuard(
        log="x", status="self_recovered", onset_step=121, cutoff_step=119, note=""
    )
    assert not safety.after_onset(150, recovered)


def test_last_valid_checkpoint_skips_post_onset_checkpoints(hf_run, copy_of):
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    run = copy_of(hf_run.output_dir, "run")
    assert last_valid_checkpoint(run) == str(run / "checkpoint-110")
    assert last_valid_checkpoint(run, spike_check=False) == str(run / "checkpoint-200")


def test_last_valid_checkpoint_of_a_recovered_run_is_the_newest(hf_run_self_recovering):
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    assert last_valid_checkpoint(hf_run_self_recovering.output_dir).endswith("checkpoint-200")


def test_the_adviser_is_passed_in_and_never_silently_missing(hf_run, copy_of, tmp_path):
    """checkpoints/ does not import recovery/ (docs/DEVELOPING.md, Layers): the spike check takes the adviser
    from its caller. A log found without one is a TypeError, not a run that looks spike-free; no log needs none."""
    from checkpoint_strategy.recovery import advise
    from checkpoint_strategy.retention import prune

    run = copy_of(hf_run.output_dir, "run")
    valid = [(s, str(run / f"checkpoint-{s}")) for s in range(10, 201, 10)]
    guard = safety.read_spike(valid, advise=advise)
    assert (guard.status, guard.onset_step) == ("rollback", 121)
    with pytest.raises(TypeError, match="advise=checkpoint_strategy.recovery.advise"):
        safety.read_spike(valid)
    with pytest.raises(TypeError, match="no adviser was passed"):
        prune(run, keep_last=2)
    assert prune(run, keep_last=2, spike_check=False).spike_guard is None
    assert (
        safety.read_spike([(10, str(tmp_path))]) is None
    )  # no trainer_state.json: nothing to read


def test_a_spike_still_inside_its_wait_window_is_unresolved_for_prune(tmp_path, cli_run):
    """The README's sample run (fast: no framework), its log read 40 steps after the level shift at step 2110:
    recover says wait (inside the wait window). Wait is unresolved: checkpoint-2500 and -3000 were saved after the
    onset and do not count toward keep_last (kept, as post-onset), checkpoint-2000 is the rollback point, and
    keep_last=2 keeps the two newest safe ones, 2000 and 1000. (Treating wait as resolved, the mutant of issue 40,
    counts 3000 and 2500 as the window and deletes checkpoint-1000.)"""
    from test_examples import build_inputs

    build_inputs(tmp_path)
    early = tmp_path / "early.jsonl"
    early.write_text(
        "".join(
            line + "\n"
            for line in (tmp_path / "train.jsonl").read_text().splitlines()
            if json.loads(line)["step"] <= 2150
        )
    )
    run = tmp_path / "run"
    r = cli_run("prune", run, "--keep-last", "2", "--log", early, "--apply", "--format", "json")
    assert r.rc == 0, r.err
    rep = r.json()
    guard = rep["spike_guard"]
    assert (guard["status"], guard["onset_step"], guard["protected"]) == (
        "wait",
        2110,
        "checkpoint-2000",
    )
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint-1000",
        "checkpoint-2000",
        "checkpoint-2500",
        "checkpoint-3000",
    ]
    reasons = {e["name"]: " ".join(e["reasons"]) for e in rep["keep"]}
    assert "within keep_last=2 newest resumable" in reasons["checkpoint-1000"]
    assert (
        "rollback point before the unrecovered loss spike at step 2110"
        in reasons["checkpoint-2000"]
    )
    for post in ("checkpoint-2500", "checkpoint-3000"):
        assert "after the spike at step 2110: do not resume" in reasons[post]
        assert "not counted by keep_last" in reasons[post]
