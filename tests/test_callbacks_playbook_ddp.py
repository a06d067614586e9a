"""The playbooks that run themselves under 2 processes (issue 43): train_with_recovery (HF Trainer under torchrun) and
fit_with_recovery (Lightning Trainer(strategy="ddp", devices=2)), gloo on CPU, with a poisoned batch at step
PB_POISON on every rank (tests/callbackruns.py hf_playbook_ddp / pl_playbook_ddp).

Each rank writes out/result-<rank>.json: the playbook's answer, each train/fit call with the checkpoint it resumed
from and the step its first batch came at, the steps whose forward pass ran, where its poisoned batch came, the
held-out loss and a fingerprint of its weights. Asserted from them: both ranks roll back together (same step,
same checkpoint, same skipped steps, same train calls), finish max_steps with the same weights, nothing hangs (the
run is bounded by the subprocess timeout), and the final loss is within 15% of a clean 2-process run's; rank 0
alone writes the loss log. With three poisoned steps and max_rollbacks=2 (the runner's poison_steps= and
max_rollbacks= options): a second rollback, then both ranks stop at the limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import callbackruns
import cliresult
import pytest
from callbackruns import PB_POISON, PB_STEPS

from checkpoint_strategy.formats.runlog import METRICS_FILE

pytest.importorskip("torch")

RUN_TIMEOUT = 420
PROGRAM = str(Path(callbackruns.__file__).resolve())


def run2(
    kind: str, out: Path, poison: bool, *extra: str, timeout: float = RUN_TIMEOUT
) -> tuple[dict, dict, str]:
    """One 2-process run (kind hf_playbook: torchrun; pl_playbook: Lightning starts rank 1 itself), bounded by
    `timeout` (a hang fails the test, every process of the run killed): cliresult.two_ranks. Each rank's result."""
    out.mkdir(parents=True, exist_ok=True)
    args = [kind, str(out), "poison" if poison else "clean", *extra]
    what = f"the 2-process {kind} run"
    return cliresult.two_ranks(PROGRAM, args, out, what, kind == "hf_playbook", timeout)


def check_together(r0: dict, r1: dict, out: Path, ckpt_name) -> dict:
    """Both ranks rolled back at the same step to the same checkpoint, skipped the same steps, finished with the
    same weights; the rollback itself is the playbook's (onset at the poisoned step, skip to onset + 20)."""
    for r in (r0, r1):
        assert r["global_step"] == PB_STEPS and r["stopped"] is None, r["stopped"]
        assert r["poisoned"] == [
            PB_POISON
        ]  # each rank met its poisoned batch once: the resumed pass skips it
    assert r0["rollbacks"] == r1["rollbacks"] and 1 <= len(r0["rollbacks"]) <= 2
    rb = r0["rollbacks"][0]
    assert rb["onset"] == PB_POISON and rb["resume_step"] < PB_POISON
    assert rb["checkpoint"] == str(out / ckpt_name(rb["resume_step"]))
    assert (
        r0["calls"]
        == r1["calls"]
        == [
            {"resume": None, "from_step": 0},
            {"resume": rb["checkpoint"], "from_step": rb["resume_step"]},
        ]
    )
    assert (
        r0["skipped_steps"]
        == r1["skipped_steps"]
        == list(range(rb["resume_step"] + 1, PB_POISON + 21))
    )
    assert (
        r0["forward"] == r1["forward"]
    )  # the same steps trained, in the same order, on both ranks
    second = r0["forward"][r0["forward"].index(rb["step"]) + 1 :]
    assert second == [
        s for s in range(rb["resume_step"] + 1, PB_STEPS + 1) if s not in r0["skipped_steps"]
    ]
    at = r0["at"]  # (JSON keys: the step, as text)
    assert (
        at[str(rb["resume_step"])] == at[str(PB_POISON + 20)]
    )  # the skipped steps moved no weight
    assert at[str(PB_POISON + 20)] != at[str(PB_POISON + 21)]  # the first trained one did
    assert (
        r0["weights"] == r1["weights"] and r0["at"] == r1["at"]
    )  # DDP's ranks hold the same model throughout
    return rb


def check_one_log(out: Path) -> None:
    """Rank 0 alone writes the loss log: each action once, each step's loss once per pass."""
    recs = [json.loads(x) for x in (out / METRICS_FILE).read_text().splitlines()]
    events = [r["event"] for r in recs if "event" in r]
    assert (
        events
        == ["checkpoint-strategy:spike", "checkpoint-strategy:rollback"]
        + ["checkpoint-strategy:resume_check"] * 2
    ), events
    cut = next(i for i, r in enumerate(recs) if r.get("event") == "checkpoint-strategy:rollback")
    first = [r["step"] for r in recs[:cut] if "event" not in r]
    assert first == sorted(set(first)) and first[-1] >= PB_POISON, first[-5:]


@pytest.mark.slow
def test_hf_torchrun_every_rank_rolls_back_to_the_same_checkpoint_at_the_same_step(tmp_path):
    clean0, clean1, _ = run2("hf_playbook", tmp_path / "clean", poison=False)
    assert clean0["rollbacks"] == [] == clean1["rollbacks"] and clean0["global_step"] == PB_STEPS
    r0, r1, err = run2("hf_playbook", tmp_path / "out", poison=True)
    check_together(r0, r1, tmp_path / "out", lambda s: f"checkpoint-{s}")
    assert r0["trains"] == r1["trains"] == 2
    assert abs(r0["eval"] - clean0["eval"]) <= 0.15 * clean0["eval"], (r0["eval"], clean0["eval"])
    check_one_log(tmp_path / "out")
    assert err.count("rollback 1/3 to checkpoint-") == 1  # rank 0 alone says it


@pytest.mark.slow
def test_hf_torchrun_a_second_rollback_then_max_rollbacks_stops_every_rank(tmp_path):
    """Three poisoned steps (150, 300, 450) and max_rollbacks=2: both ranks roll back twice, each time to the
    checkpoint before that onset (checkpoint-100, then checkpoint-250: each checkpoint once), skipping past each
    onset; the third spike finds the limit reached, so both ranks stop at the same step, before max_steps, with
    the reason, and rank 0 alone says so."""
    out = tmp_path / "out"
    r0, r1, err = run2("hf_playbook", out, True, "poison_steps=150,300,450", "max_rollbacks=2")
    assert r0["rollbacks"] == r1["rollbacks"]
    got = [(rb["onset"], rb["checkpoint"], rb["resume_step"], rb["skip"]) for rb in r0["rollbacks"]]
    assert got == [
        (150, str(out / "checkpoint-100"), 100, [101, 170]),
        (300, str(out / "checkpoint-250"), 250, [251, 320]),
    ]
    assert all(rb["step"] > rb["onset"] for rb in r0["rollbacks"])
    assert (
        r0["calls"]
        == r1["calls"]
        == [
            {"resume": None, "from_step": 0},
            {"resume": str(out / "checkpoint-100"), "from_step": 100},
            {"resume": str(out / "checkpoint-250"), "from_step": 250},
        ]
    )
    assert r0["trains"] == r1["trains"] == 3
    skipped = [*range(101, 171), *range(251, 321)]
    for r in (r0, r1):
        assert r["poisoned"] == [
            150,
            300,
            450,
        ]  # each poisoned batch met once: the resumed passes skip it
        assert r["skipped_steps"] == skipped
        assert r["stopped"] is not None and r["stopped"].endswith(
            "(onset 450) after 2 rollbacks (max_rollbacks=2)"
        ), r["stopped"]
    assert r0["stopped"] == r1["stopped"] and r0["global_step"] == r1["global_step"]
    assert 450 < r0["global_step"] < PB_STEPS  # stopped, not run to the end
    assert (
        r0["forward"] == r1["forward"] and r0["weights"] == r1["weights"] and r0["at"] == r1["at"]
    )
    at = r0["at"]  # the weights before each step (JSON keys: the step, as text)
    for resume, last_skipped in (
        (100, 170),
        (250, 320),
    ):  # the skipped steps moved no weight, the next did
        assert at[str(resume)] == at[str(last_skipped)] != at[str(last_skipped + 1)]
    assert err.count("rollback 1/2 to checkpoint-100") == 1
    assert err.count("rollback 2/2 to checkpoint-250") == 1
    assert err.count("after 2 rollbacks (max_rollbacks=2): training stops") == 1
    recs = [json.loads(x) for x in (out / METRICS_FILE).read_text().splitlines()]
    events = [r["event"].split(":")[1] for r in recs if "event" in r]
    assert events == ["spike", "rollback", "resume_check", "resume_check"] * 2 + ["spike", "stop"]


@pytest.mark.slow
def test_lightning_ddp_every_rank_rolls_back_to_the_same_checkpoint_at_the_same_step(tmp_path):
    """Also a finding: Lightning refuses a training_step returning None under DDP (the single-process skip), so a
    skipped step there returns the last loss + 0 x the weights and its zero gradients are dropped (no weight moves,
    asserted by check_together from the weights before and after the skipped steps)."""
    clean0, clean1, _ = run2("pl_playbook", tmp_path / "clean", poison=False)
    assert clean0["rollbacks"] == [] == clean1["rollbacks"] and clean0["global_step"] == PB_STEPS
    r0, r1, err = run2("pl_playbook", tmp_path / "out", poison=True)
    rb = check_together(
        r0, r1, tmp_path / "out", lambda s: f"epoch={s // callbackruns.PB_EPOCH - 1}-step={s}.ckpt"
    )
    assert r0["fits"] == r1["fits"] == 2
    assert abs(r0["eval"] - clean0["eval"]) <= 0.15 * clean0["eval"], (r0["eval"], clean0["eval"])
    check_one_log(tmp_path / "out")
    assert err.count(f"rollback 1/3 to {Path(rb['checkpoint']).name}") == 1  # rank 0 alone says it


@pytest.mark.slow
def test_hf_torchrun_a_resume_check_failing_on_one_rank_stops_every_rank(tmp_path):
    """Rank 1's resume loads no optimizer state (a fresh optimizer), rank 0's does: the live resume check was each
    rank's own verdict, so rank 1 stopped and rank 0 trained on, waiting on DDP's all_reduce with a rank that had
    left (a hang, ended only by the timeout). The check is one verdict of every rank (guard.py resumed): both stop
    at the same step, each with the reason."""
    r0, r1, err = run2("hf_playbook", tmp_path / "out", True, "1", timeout=240)
    rb = r0["rollbacks"][0]
    assert r0["rollbacks"] == r1["rollbacks"] and rb["onset"] == PB_POISON
    assert (
        r0["global_step"] == r1["global_step"] == rb["resume_step"] + 1
    )  # the first step of the resumed train
    assert "rank 1" in r0["stopped"] and "did not restore the optimizer" in r0["stopped"], r0[
        "stopped"
    ]
    assert (
        "did not restore the optimizer" in r1["stopped"] and "step counter is 0" in r1["stopped"]
    ), r1["stopped"]
    assert r0["forward"] == r1["forward"]
    assert (
        err.count("rank 1's resume from") == 1
    )  # rank 0 says why, once (the others' lines are DEBUG)


@pytest.mark.slow
def test_a_signal_reaching_only_rank_1_saves_and_stops_every_rank_together(tmp_path):
    """A plain DDP loop with TrainingGuard (tests/callbackruns.py guard_preempt_ddp): SIGUSR1 reaches rank 1 alone
    at step PREEMPT_STEP. The request rides on the guard's loss all_reduce, so both ranks answer the preemption save
    at that step, report it and stop; no collective timed out (alone, rank 1 left the all_reduce and rank 0 waited
    for it up to rank_timeout, then the ranks' collectives no longer matched). Rank 0 alone writes the record."""
    from checkpoint_strategy.callbacks.preempt import read_record

    out = tmp_path / "out"
    out.mkdir()
    what = "the 2-process preempted run"
    r0, r1, _ = cliresult.two_ranks(PROGRAM, ["guard_preempt", str(out)], out, what, True, 180)
    step = callbackruns.PREEMPT_STEP
    for r in (r0, r1):
        assert r["broken"] is None and r["last"] == step, r
        assert r["stopped"].startswith("preempted by ") and r["stopped"].endswith(
            f"at step {step}"
        ), r["stopped"]
        assert r["saves"] == [[20, "scheduled"], [step, "preemption"]], r["saves"]
        assert r["preempted"]["checkpoint"] == str(out / f"checkpoint-{step}.pt")
    assert r1["preempted"]["signal"] == "SIGUSR1" and "another rank" in r0["preempted"]["signal"]
    assert read_record(out)["step"] == step and (out / f"checkpoint-{step}.pt").exists()


@pytest.mark.slow
def test_lightning_ddp_a_resume_check_failing_on_one_rank_stops_every_rank(tmp_path):
    """As for HF: rank 1's fit resumes the weights, not the optimizer; both ranks stop at the first resumed batch."""
    r0, r1, err = run2("pl_playbook", tmp_path / "out", True, "1", timeout=240)
    rb = r0["rollbacks"][0]
    assert r0["rollbacks"] == r1["rollbacks"] and rb["onset"] == PB_POISON
    assert (
        r0["global_step"] == r1["global_step"] == rb["resume_step"] + 1
    )  # the first batch of the resumed fit
    assert "rank 1" in r0["stopped"] and "did not restore the optimizer" in r0["stopped"], r0[
        "stopped"
    ]
    assert "step counter is 0" in r1["stopped"], r1["stopped"]
    assert err.count("rank 1's resume from") == 1


def _pl_ckpt(step: int, version: str = "") -> str:
    """ModelCheckpoint's name for the save at `step` (an epoch is PB_EPOCH steps); version "-v1": the second save
    at that step (the first name was taken by the rolled-back pass)."""
    return f"epoch={step // callbackruns.PB_EPOCH - 1}-step={step}{version}.ckpt"


@pytest.mark.slow
def test_lightning_ddp_a_second_rollback_then_max_rollbacks_stops_every_rank(tmp_path, cli_run):
    """The HF journey above under Lightning DDP: poisoned steps 150, 300, 450 and max_rollbacks=2. Both ranks roll
    back twice, to the checkpoint before each onset, skip past it, and stop together at the third spike (onset 450)
    with the limit's reason; rank 0 alone writes the loss log and says each action once; recover on that log reports
    both rollbacks. A finding: the first pass decided its rollback at step 250 and ModelCheckpoint then saved its
    spiked weights there as epoch=4-step=250.ckpt (marked); the second pass's clean save at 250 is
    epoch=4-step=250-v1.ckpt. The playbook told the guard of the spiked save too, and the ranks agree on a target by
    its step alone, so the second rollback loaded the spiked checkpoint on every rank (its resume check a jump, the
    third spike at 321, not 450). The second rollback must load the -v1 save and its resume check pass."""
    out = tmp_path / "out"
    r0, r1, err = run2("pl_playbook", out, True, "poison_steps=150,300,450", "max_rollbacks=2")
    assert r0["rollbacks"] == r1["rollbacks"]
    got = [(rb["onset"], rb["checkpoint"], rb["resume_step"], rb["skip"]) for rb in r0["rollbacks"]]
    first, second = str(out / _pl_ckpt(100)), str(out / _pl_ckpt(250, "-v1"))
    assert got == [(150, first, 100, [101, 170]), (300, second, 250, [251, 320])], got
    assert all(rb["step"] > rb["onset"] for rb in r0["rollbacks"])
    assert (
        r0["calls"]
        == r1["calls"]
        == [
            {"resume": None, "from_step": 0},
            {"resume": first, "from_step": 100},
            {"resume": second, "from_step": 250},
        ]
    )
    assert r0["fits"] == r1["fits"] == 3
    skipped = [*range(101, 171), *range(251, 321)]
    for r in (r0, r1):
        # each poisoned batch met once: the resumed fits skip it
        assert r["poisoned"] == [150, 300, 450]
        assert r["skipped_steps"] == skipped
        assert r["stopped"] is not None and r["stopped"].endswith(
            "(onset 450) after 2 rollbacks (max_rollbacks=2)"
        ), r["stopped"]
        checks = [a for a in r["actions"] if a["event"].endswith(":resume_check")]
        assert [(a["checkpoint"], a["verdict"]) for a in checks] == [
            (first, "ok"),
            (first, "ok"),
            (second, "ok"),
            (second, "ok"),
        ], checks  # each resume: the optimizer's step counter, then the loss back within the band
    assert r0["stopped"] == r1["stopped"] and r0["global_step"] == r1["global_step"]
    assert 450 < r0["global_step"] < PB_STEPS  # stopped, not run to the end
    assert (
        r0["forward"] == r1["forward"] and r0["weights"] == r1["weights"] and r0["at"] == r1["at"]
    )
    at = r0["at"]  # the weights before each step (JSON keys: the step, as text)
    # the skipped steps moved no weight, the next did
    for resume, last_skipped in ((100, 170), (250, 320)):
        assert at[str(resume)] == at[str(last_skipped)] != at[str(last_skipped + 1)]
    assert err.count(f"rollback 1/2 to {_pl_ckpt(100)} ") == 1  # rank 0 alone says it
    assert err.count(f"rollback 2/2 to {_pl_ckpt(250, '-v1')} ") == 1
    assert err.count("after 2 rollbacks (max_rollbacks=2): training stops") == 1
    recs = [json.loads(x) for x in (out / METRICS_FILE).read_text().splitlines()]
    events = [r["event"].split(":")[1] for r in recs if "event" in r]
    assert events == ["spike", "rollback", "resume_check", "resume_check"] * 2 + ["spike", "stop"]
    cuts = [i for i, r in enumerate(recs) if r.get("event") == "checkpoint-strategy:rollback"]
    # each fit's losses, each step once (rank 0's alone)
    for a, b in zip([0, *cuts], [*cuts, len(recs)], strict=True):
        steps = [r["step"] for r in recs[a:b] if "event" not in r]
        assert steps == sorted(set(steps)), steps
    rec = cli_run("recover", str(out / METRICS_FILE), "--format", "json")
    assert rec.rc == 0, rec.err
    line = rec.json()["reasons"][0]
    assert line.startswith("the run rolled back by itself 2 time(s)"), line
    for rb in r0["rollbacks"]:
        assert (
            f"at step {rb['step']} (divergence, onset {rb['onset']}) to {Path(rb['checkpoint']).name} "
            f"(step {rb['resume_step']}), steps {rb['skip'][0]}-{rb['skip'][1]} skipped"
        ) in line, line
