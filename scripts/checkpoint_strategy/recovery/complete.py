"""recover's advice completed for the run it read: what the run's own files say (max_steps, the old
max_grad_norm), the detected framework, and the ready actions (pin the rollback checkpoint, move the
post-onset ones aside). Applied by the `recover` command after `advise`; reads only JSON files
(trainer_state.json, training_args.json), never training_args.bin (a pickle), never runs anything.
"""

from __future__ import annotations

import os
from typing import Optional

from checkpoint_strategy.formats import runfacts, runlog
from checkpoint_strategy.recovery.advice import overrides
from checkpoint_strategy.recovery.models import RecoveryReport

_THEN = "then: LR x"


def framework_of(report: RecoveryReport) -> Optional[str]:
    """hf_trainer when the log is a trainer_state.json or the checkpoints are checkpoint-N folders;
    lightning when they are .ckpt files or the log is Lightning's metrics.csv; else None."""
    paths = [
        c.path
        for c in [report.resume_checkpoint, *report.checkpoints.post_event]
        if c is not None and c.path
    ]
    if report.log.format == "hf" or any(
        os.path.basename(os.path.normpath(p)).startswith("checkpoint-") for p in paths
    ):
        return "hf_trainer"
    if (
        any(p.endswith(".ckpt") for p in paths)
        or os.path.basename(report.log.path) == "metrics.csv"
    ):
        return "lightning"
    return None


def _clip_windows(report: RecoveryReport, max_steps: int) -> None:
    resume = report.resume_checkpoint
    if resume is None or report.lr_reduced_steps is None or report.skip_batches is None:
        return
    r = resume.step
    until = min(r + report.lr_reduced_steps, max_steps)
    report.lr_reduced_steps = max(0, until - r)
    report.lr_reduced_until_step = max(r, until)
    report.skip_batches = [
        report.skip_batches[0],
        max(report.skip_batches[0], min(report.skip_batches[1], max_steps)),
    ]


def _then_line(report: RecoveryReport) -> str:
    assert report.resume_checkpoint is not None and report.skip_batches is not None
    r, (s0, s1) = report.resume_checkpoint.step, report.skip_batches
    was = f" (was {report.previous_grad_clip:g})" if report.previous_grad_clip is not None else ""
    m = report.max_steps
    to = (
        f" (clipped to the run's max_steps {m})"
        if m is not None and report.lr_reduced_until_step == m
        else ""
    )
    return (
        f"then: LR x{report.lr_multiplier:g} for steps {r + 1}-{report.lr_reduced_until_step}{to}, skip or "
        f"reshuffle the batches of steps {s0}-{s1} ({s1 - s0 + 1} batches; PaLM skipped ~200-500), gradient "
        f"clipping {report.grad_clip:g}{was}"
    )


def _actions(report: RecoveryReport) -> list[str]:
    resume = report.resume_checkpoint
    out: list[str] = []
    if resume is None:
        return out
    if resume.path:
        out.extend(_rollback_actions(report, resume.path))
    if report.status == "rollback":
        out.append(verify_resume_action(report.log.path, report.log.format, resume.step))
    return out


def verify_resume_action(log: str, log_format: str, step: int) -> str:
    """The step after a rollback: check the resume kept the optimizer state, on the *resumed* run's log."""
    if log_format == "hf":
        where = (
            "the trainer_state.json of the first checkpoint the resumed run saves (not this run's: it stops "
            "before the resume)"
        )
    elif log_format == "tensorboard":
        where = "the resumed run's TensorBoard folder (the folder of the events file it writes)"
    else:
        where = (
            f"the resumed run's log; {os.path.basename(log)} again if the resumed run appends to it"
        )
    return (
        f"after resuming and logging a few steps: {runfacts.launcher()} verify-resume RESUMED_LOG "
        f"--resume-step {step}   (RESUMED_LOG: {where})"
    )


def _rollback_actions(report: RecoveryReport, path: str) -> list[str]:
    """Pin the resume point, move the post-onset checkpoints aside (or resume into a new folder)."""
    out: list[str] = []
    name = os.path.basename(os.path.normpath(path))
    out.append(
        f"pin {name} now: {runfacts.pin_command(path)}   (if the job is still running, copy it now: "
        "its rotation may delete it; HF: or raise save_total_limit)"
    )
    post = [c.path for c in report.checkpoints.post_event if c.path]
    onset = report.spike.onset_step if report.spike is not None else None
    move = runfacts.move_aside_command(post, report.checkpoints.root, onset)
    if move:
        out.append(
            f"move the {len(post)} post-onset checkpoints aside (a trainer resuming from the newest would "
            f"pick one): {move}"
        )
        where = {
            "hf_trainer": "a new output_dir",
            "lightning": "a new ModelCheckpoint dirpath",
        }.get(report.framework or "", "HF: a new output_dir; Lightning: a new dirpath")
        out.append(
            f"or resume into a new output folder ({where}) so the post-onset checkpoints are never picked"
        )
    return out


def _sharded_note(path: str) -> list[str]:
    """A resume checkpoint saved as DCP or ZeRO shards: the exact convert command for another GPU count."""
    from checkpoint_strategy.formats.worldsize import convert_command, saved_world_size

    saved = saved_world_size(path, "")
    command = convert_command(saved.path, saved.layout) if saved is not None else None
    if saved is None or command is None:
        return []
    return [
        f"{os.path.basename(os.path.normpath(path))} is {saved.layout} shards written by "
        f"{saved.world_size or 'an unknown number of'} process(es): to resume on another GPU count, {command}"
    ]


def complete(report: RecoveryReport) -> RecoveryReport:
    """Fill framework, max_steps, previous_grad_clip, run_facts and actions; clip the LR and skip
    windows to max_steps and rebuild the snippets with what is known (nothing invented)."""
    facts = runlog.run_facts(report.log.path)
    report.framework = framework_of(report)  # type: ignore[assignment]
    report.max_steps = facts.int("max_steps")
    report.previous_grad_clip = facts.get("max_grad_norm")
    report.run_facts = {k: facts.source[k] for k in sorted(facts.source)}
    resume = report.resume_checkpoint
    if resume is not None and resume.path:
        report.warnings += _sharded_note(resume.path)
    if (
        resume is None
        or report.skip_batches is None
        or report.lr_multiplier is None
        or report.grad_clip is None
    ):
        return report
    if report.max_steps is not None:
        _clip_windows(report, report.max_steps)
    assert report.lr_reduced_steps is not None
    report.overrides = overrides(
        resume.path,
        resume.step,
        report.skip_batches,
        report.lr_multiplier,
        report.lr_reduced_steps,
        report.grad_clip,
        report.previous_grad_clip,
    )
    report.reasons = [_then_line(report) if x.startswith(_THEN) else x for x in report.reasons]
    report.actions = _actions(
        report
    )  # after framework: the wording names the framework's own setting
    return report
