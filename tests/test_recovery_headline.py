"""recover's text report has one headline, the decision, and nothing in its first lines contradicts it
(issue 27: no "Status: roll back" followed by "Verdict: recovering ..."). After a rollback the next step
is `verify-resume` on the resumed run's log.

Checked on the held-in spike runs (real HF Trainer runs on CPU: tests/realruns.py), on every log of the
real-log corpus (tests/data/real-logs) and on a spike that is coming down too slowly to wait for.
"""

from __future__ import annotations

import json
import math
import random
import re

import pytest
from test_recovery_corpus import DATA, LOGS

TITLES = {
    "no_spike": "KEEP TRAINING",
    "self_recovered": "KEEP TRAINING (self-recovered)",
    "wait": "WAIT (inside the wait window)",
    "rollback": "ROLL BACK",
    "no_clean_checkpoint": "ROLL BACK IMPOSSIBLE (no checkpoint predates the spike)",
}
# words that name a decision or a verdict: the "Loss now" line is evidence and must use none of them
DECISION_WORDS = re.compile(
    r"\b(roll(ed)? back|rollback|keep training|wait:|recovering|recovered|diverged|healthy:)", re.I
)


def check_headline(text: str, rep: dict) -> None:
    lines = text.splitlines()
    assert lines[0] == f"=== Loss-Spike Recovery: {TITLES[rep['status']]} ===", lines[0]
    head = lines[: lines.index("")] if "" in lines else lines
    assert not any(line.startswith(("Status:", "Verdict:")) for line in lines), head
    assert [line for line in lines if line.startswith("=> ")] == [f"=> {rep['summary']}"]
    loss_now = [line for line in head if line.startswith("Loss now:")]
    assert loss_now == [f"Loss now:          {rep['verdict_detail']}"], head
    assert not DECISION_WORDS.search(rep["verdict_detail"]), rep["verdict_detail"]
    if rep["status"] == "rollback":
        assert "resume from" in rep["summary"]
        step = rep["resume_checkpoint"]["step"]
        nxt = rep["actions"][-1]
        assert re.search(rf" verify-resume RESUMED_LOG --resume-step {step}\b", nxt), nxt
        assert nxt.startswith("after resuming") and "RESUMED_LOG: the " in nxt
        assert any(line.strip().endswith(nxt) for line in head), head
    else:
        assert not any("verify-resume" in a for a in rep["actions"]), rep["actions"]
        if rep["status"] in ("no_spike", "self_recovered"):
            assert "keep training" in rep["summary"]


def recover(cli_run, *args) -> tuple[str, dict]:
    """(the text report, the JSON report) of one recover run: the text is rendered from the same report, as
    the command renders it (one run instead of two keeps the corpus sweep in the fast loop)."""
    from checkpoint_strategy.recovery.models import RecoveryReport
    from checkpoint_strategy.render import render

    data = cli_run("recover", *args, "--format", "json")
    assert data.rc == 0 and data.err == "", data.err
    rep = data.json()
    return render(RecoveryReport.model_validate(rep), "text"), rep


@pytest.mark.parametrize("entry", LOGS, ids=[e["file"] for e in LOGS])
def test_one_headline_on_every_corpus_log(entry, cli_run):
    args = [
        str(DATA / entry["file"]),
        "--checkpoints",
        ",".join(str(s) for s in range(50, 100001, 50)),
    ]
    if entry.get("loss_key"):
        args += ["--loss-key", entry["loss_key"]]
    text, rep = recover(cli_run, *args)
    check_headline(text, rep)


def test_a_spike_coming_down_too_slowly_is_rolled_back_without_saying_recovering(tmp_path, cli_run):
    """The case the issue saw: the loss is shrinking back (verdict "recovering") but would be back only
    after the wait window, so the decision is roll back. One headline; the evidence says "coming down"."""
    rng = random.Random(0)
    rows = [
        {
            "step": s,
            "loss": round(
                1 + rng.gauss(0, 0.01) + (2 * math.exp(-0.01 * (s - 1000)) if s >= 1000 else 0), 4
            ),
        }
        for s in range(1, 1071)
    ]
    log = tmp_path / "slow.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text, rep = recover(cli_run, str(log), "--checkpoints", "500,900,950")
    assert (rep["status"], rep["verdict"]) == ("rollback", "recovering")
    check_headline(text, rep)
    assert (
        rep["verdict_detail"].startswith("coming down: ")
        and "only by about step" in rep["verdict_detail"]
    )
    assert "after the wait window (step 1100)" in rep["verdict_detail"]
    assert "RESUMED_LOG: the resumed run's log; slow.jsonl again" in rep["actions"][-1]


def test_held_in_spike_run_rolls_back_and_names_verify_resume(hf_run, cli_run):
    text, rep = recover(cli_run, str(hf_run.output_dir))
    # the case: the loss is shrinking back ("recovering"), too slowly, so the decision is roll back
    assert (rep["status"], rep["verdict"]) == ("rollback", "recovering")
    check_headline(text, rep)
    assert cli_run("recover", str(hf_run.output_dir)).out == text  # what the command itself prints
    assert (
        rep["verdict_detail"].startswith("coming down: ")
        and "after the wait window" in rep["verdict_detail"]
    )
    # an HF log: the resumed run's log is the trainer_state.json of its first new checkpoint, not this one
    assert "trainer_state.json of the first checkpoint the resumed run saves" in rep["actions"][-1]


def test_held_in_self_recovering_run_says_keep_training_once(hf_run_self_recovering, cli_run):
    text, rep = recover(cli_run, str(hf_run_self_recovering.output_dir))
    assert rep["status"] == "self_recovered"
    check_headline(text, rep)


def test_held_in_run_mid_spike_says_wait_once(hf_run_self_recovering, cli_run):
    """The same run as it stood at step 130, just after the onset (checkpoint-130's trainer_state.json):
    wait, and no verify-resume (nothing was resumed)."""
    text, rep = recover(
        cli_run, str(hf_run_self_recovering.output_dir / "checkpoint-130" / "trainer_state.json")
    )
    assert rep["status"] == "wait"
    check_headline(text, rep)


@pytest.mark.parametrize(
    "log, fmt, words",
    [
        (
            "run/checkpoint-300/trainer_state.json",
            "hf",
            "trainer_state.json of the first checkpoint the resumed run saves",
        ),
        ("logs/version_0", "tensorboard", "the resumed run's TensorBoard folder"),
        (
            "metrics.csv",
            "csv",
            "the resumed run's log; metrics.csv again if the resumed run appends to it",
        ),
    ],
)
def test_the_resumed_log_is_named_per_log_kind(log, fmt, words):
    from checkpoint_strategy.recovery.advice import verify_resume_action

    line = verify_resume_action(log, fmt, 250)
    assert " verify-resume RESUMED_LOG --resume-step 250 " in line and words in line
    assert (
        log not in line.split("(RESUMED_LOG")[0]
    )  # never the old run's log as the command's argument
