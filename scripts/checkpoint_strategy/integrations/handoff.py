"""Handoff metadata for session-handoff: build the document, then write the state folder."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Optional

from markupsafe import Markup

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import runfacts, runlog
from checkpoint_strategy.integrations import statefolder
from checkpoint_strategy.integrations.checkpoints import now_iso, scan
from checkpoint_strategy.integrations.models import (
    CheckpointRef,
    PlanSummary,
    RecoveryNote,
    SessionHandoff,
)
from checkpoint_strategy.planning.models import PlanReport
from checkpoint_strategy.planning.planfile import report_from_data
from checkpoint_strategy.render import render, to_json
from checkpoint_strategy.retention import safety
from checkpoint_strategy.retention.safety import UNRESOLVED, default_log
from checkpoint_strategy.storage import ReadError, loads_json

MAX_ROLLBACK_POINTS = 50


def load_plan_file(text: str, source: str) -> PlanReport:
    """The JSON `plan --format json` prints, checked against schemas/plan.schema.json."""
    try:  # NaN/Infinity are not JSON and never in a plan: refused (the handoff document could not hold them)
        data = loads_json(text, f"plan file {source}", allow_nan=False, expect=dict)
    except ReadError as exc:
        raise UsageError(
            f"plan file {source} is {exc.reason}: expected the output of "
            "`checkpoint-strategy plan ... --format json`"
        ) from None
    return report_from_data(data, source)


def _q(path: str) -> str:
    return shlex.quote(path)


def _unresolved(recovery: Optional[RecoveryNote]) -> bool:
    """The recovery adviser says the run is still in trouble (wait, roll back, or no clean checkpoint)."""
    return recovery is not None and recovery.status in UNRESOLVED


def recovery_note(
    log: Optional[str], root: Optional[str], valid: list[CheckpointRef]
) -> tuple[Optional[RecoveryNote], list[str]]:
    """Ask the recovery adviser about the training log: `log`, or the newest log under `root`.

    An explicit --log that cannot be read is bad input (UsageError); a root without a log is
    normal (no note). Only the checkpoints the validator found whole are offered as resume points.
    """
    explicit = log is not None
    log_path = log
    if (
        not explicit
    ):  # the run folder's log as every command finds it (formats/runlog.py), else the root
        log_path = (
            default_log([(c.step, c.path) for c in valid if c.step is not None], root) or root
        )
    if log_path is None:
        return None, []
    checkpoints = None if root is None else [(c.step, c.path) for c in valid if c.step is not None]
    rep, risks = _advise(log_path, checkpoints, explicit, root)
    if rep is None:
        return None, risks
    resume = rep.resume_checkpoint
    note = RecoveryNote(
        log=rep.log.path,
        status=rep.status,
        summary=rep.summary,
        spike_onset_step=rep.spike.onset_step if rep.spike is not None else None,
        wait_until_step=rep.wait_until_step,
        resume_checkpoint=(resume.path or str(resume.step)) if resume is not None else None,
        resume_step=resume.step if resume is not None else None,
    )
    if rep.status in UNRESOLVED and rep.spike is not None:
        _mark_post_onset(rep, valid)
        spiked = [c for c in valid if c.after_spike_onset]
        risks.append(
            f"{rep.summary}"
            + (
                f"; {len(spiked)} checkpoints from step {min(c.step or 0 for c in spiked)} on hold spiked weights"
                if spiked
                else ""
            )
        )
    return note, risks


def _mark_post_onset(rep, valid: list[CheckpointRef]) -> None:
    """after_spike_onset on each valid checkpoint, by the one shared rule (retention/safety.py)."""
    guard = safety.guard_from_report(rep, rep.log.path)
    for c in valid:
        if c.step is not None:
            c.after_spike_onset = safety.after_onset(c.step, guard)


def safe_points(
    valid: list[CheckpointRef],
) -> tuple[Optional[CheckpointRef], list[CheckpointRef], list[CheckpointRef]]:
    """(the checkpoint to resume from, the rollback points, the post-onset ones), newest first:
    rollback points are the valid checkpoints not after an unrecovered spike's onset; the one to
    resume from is the newest resumable of them (else the newest, weights only)."""
    safe = [c for c in valid if not c.after_spike_onset]
    post = [c for c in valid if c.after_spike_onset]
    resumable = [c for c in safe if c.resumable]
    chosen = resumable or safe
    return (chosen[0] if chosen else None), safe, post


def next_commands(
    root: Optional[str],
    log: Optional[str],
    recovery: Optional[RecoveryNote],
    latest: Optional[CheckpointRef],
    bad: list,
    facts_log: Optional[str],
    saved: Sequence[CheckpointRef] = (),
) -> list[str]:
    """The commands the next session runs, in order, each runnable as written (launcher's full
    path, real paths, no placeholders): pin the rollback point first when it may be rotated away."""
    cs = runfacts.launcher()
    root, log = (os.path.abspath(p) if p is not None else None for p in (root, log))
    unresolved = recovery is not None and recovery.status in UNRESOLVED
    commands: list[str] = []
    if latest is not None and (unresolved or runlog.still_running(runlog.run_facts(facts_log))):
        commands.append(
            runfacts.pin_command(latest.path)
            + f"   # pin {os.path.basename(latest.path)} now: the "
            "trainer's rotation (save_total_limit) cannot delete the copy"
        )
    if root is not None and bad:
        commands.append(f"{cs} validate {_q(root)} --level full")
    target = log or root
    if target is not None:
        ck = f" --checkpoints {_q(root)}" if root is not None and log is not None else ""
        when = "" if unresolved else "   # after a loss spike"
        commands.append(f"{cs} recover {_q(target)}{ck}{when}")
        resume_step = (
            recovery.resume_step
            if unresolved and recovery is not None
            else (latest.step if latest is not None else None)
        )
        if resume_step is not None and log is not None:
            resumed, why = resumed_log(log, root, resume_step, saved)
            ck = f" --checkpoints {_q(root)}" if root is not None else ""
            commands.append(
                f"{cs} verify-resume {_q(resumed)} --resume-step {resume_step}{ck}   # {why}"
            )
    return commands


def resumed_log(
    log: str, root: Optional[str], resume_step: int, saved: Sequence[CheckpointRef]
) -> tuple[str, str]:
    """(the resumed run's log, what it is): verify-resume must read the log the *resumed* run writes. An HF
    trainer_state.json stops where its checkpoint was saved: the resumed run's log is the trainer_state.json of
    the first checkpoint it saves after `resume_step` (the same name as the old one at that step, written anew),
    or the run folder (verify-resume reads its newest trainer_state.json) when no later step is known. A log file
    the run appends to (JSON lines, CSV, TensorBoard) is the same file."""
    if os.path.basename(log) != "trainer_state.json" or root is None:
        return log, (
            f"after resuming from step {resume_step} and logging a few steps: the resumed run's log (this "
            "file when the resumed run appends to it; else its new log)"
        )
    later = sorted(
        (c for c in saved if c.step is not None and c.step > resume_step), key=lambda c: c.step or 0
    )
    if not later:
        return root, (
            f"after resuming from step {resume_step} and the resumed run's first save: the newest "
            "trainer_state.json in the run folder is the resumed run's"
        )
    name = os.path.basename(os.path.normpath(later[0].path))
    return (
        os.path.join(os.path.abspath(later[0].path), "trainer_state.json"),
        f"after resuming from step {resume_step} and saving {name} again: its new trainer_state.json is the "
        f"resumed run's log (the one there now is the old run's; resumed into a new output_dir: {name} there)",
    )


def _pin_first(next_step: str, commands: list[str]) -> str:
    """The pin action leads the next step when next_commands put one first."""
    if commands and commands[0].startswith("cp -a "):
        return f"pin now: {commands[0].split('   #')[0]}; then {next_step}"
    return next_step


def _advise(log_path: str, checkpoints, explicit: bool, root: Optional[str]):
    """(the recovery adviser's RecoveryReport or None, risks): a log found by looking under the root that cannot
    be read, or an adviser that is not installed, is a risk line; an explicit --log that cannot is bad input."""
    try:
        from checkpoint_strategy import recovery
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("checkpoint_strategy.recovery"):
            raise
        if explicit:
            raise UsageError(
                "the recovery adviser (checkpoint_strategy.recovery) is not installed: cannot read "
                "--log; install the full checkpoint-strategy package or leave out --log"
            ) from None
        return None, [
            "the recovery adviser is not installed: the training log was not checked for loss spikes"
        ]
    try:
        return recovery.advise(log_path, checkpoints=checkpoints), []
    except UsageError as exc:
        if explicit:
            raise
        if "no training log found" in str(exc):
            return None, []
        return None, [f"training log under {root} not checked for loss spikes: {exc}"]


def build(
    report: Optional[PlanReport],
    root: Optional[str],
    level: str = "quick",
    log: Optional[str] = None,
    now: Optional[str] = None,
) -> SessionHandoff:
    """The checkpoint-strategy.json document (nothing is written here)."""
    now = now or now_iso()
    valid: list[CheckpointRef] = []
    bad: list = []
    note: Optional[str] = None
    if root is not None:
        valid, bad, note = scan(root, level)
    recovery, recovery_risks = recovery_note(log, root, valid)
    latest, safe, post = safe_points(valid)
    risks: list[str] = [f"plan: {w}" for w in report.warnings] if report is not None else []
    if note:
        risks.append(note)
    risks.extend(recovery_risks)
    risks.extend(_checkpoint_risks(root, latest, bad, note))
    log_for_commands = log or (recovery.log if recovery is not None else None)
    commands = next_commands(
        root,
        log_for_commands,
        recovery,
        latest,
        bad,
        recovery.log if recovery is not None else None,
        valid,
    )
    plan = None
    if report is not None:
        plan = PlanSummary(
            frequency_steps=report.frequency_steps,
            keep_last=report.keep_last,
            milestone_steps=report.milestone_steps,
            max_data_loss_hours=report.max_data_loss_hours,
            total_storage_gb=report.total_storage_gb,
            fits_budget=report.fits_budget,
        )
    return SessionHandoff(
        generated_at=now,
        policy=report.policy if report is not None else None,
        plan=plan,
        checkpoints_root=root,
        latest_valid_checkpoint=latest,
        rollback_points=safe[:MAX_ROLLBACK_POINTS],
        post_onset_checkpoints=post[:MAX_ROLLBACK_POINTS],
        bad_checkpoints=bad,
        recovery=recovery,
        recovery_commands=commands,
        pending_risks=risks,
        next_step=_pin_first(_next_step(report, root, recovery, latest), commands),
    )


def _checkpoint_risks(
    root: Optional[str], latest: Optional[CheckpointRef], bad: list, note: Optional[str]
) -> list[str]:
    """What the checkpoints on disk put at risk: bad ones, none valid, the latest weights-only or sharded."""
    risks = [f"{b.status} checkpoint {b.path}: {b.reason}" for b in bad]
    if root is not None and latest is None and not note:
        risks.append(
            f"no valid checkpoint under {root}: a failure now restarts training from scratch"
        )
    if latest is not None and not latest.resumable:
        risks.append(
            f"latest valid checkpoint {latest.path} has no optimizer state: resuming from it "
            "restarts Adam's moments from zero"
        )
    if latest is not None and latest.sharded:
        risks.append(
            f"latest valid checkpoint {latest.path} is sharded: resuming needs the same parallel "
            "layout (or a conversion to a full state dict)"
        )
    if bad and latest is not None:
        newer_bad = [
            b
            for b in bad
            if b.step is not None and latest.step is not None and b.step > latest.step
        ]
        if newer_bad:
            risks.append(
                f"the newest checkpoint on disk ({newer_bad[0].path}) is not whole: resume from "
                f"{latest.path}, not from the newest folder"
            )
    return risks


def _next_step(
    report: Optional[PlanReport],
    root: Optional[str],
    recovery: Optional[RecoveryNote],
    latest: Optional[CheckpointRef],
) -> str:
    if recovery is not None and _unresolved(recovery):
        return recovery.summary
    if latest is not None:
        next_step = f"resume training from {latest.path}" + (
            f" (step {latest.step})" if latest.step is not None else ""
        )
        if not latest.resumable:
            next_step += " (weights only: optimizer state restarts)"
        return next_step
    if root is not None:
        return f"check the checkpoints under {root}: none is valid yet"
    if report is not None:
        return (
            f"start training with the checkpoint policy: every {report.frequency_steps} steps, "
            f"keep_last {report.keep_last}"
        )
    return "plan a checkpoint policy"  # pragma: no cover - the CLI requires a plan or --checkpoints


def block_context(doc: SessionHandoff) -> dict:
    """What handoff.md.j2 needs besides the model: the block's markers and the rollback count."""
    return {
        "begin": Markup(statefolder.BEGIN),
        "end": Markup(statefolder.END),
        "total_rollback": len(doc.rollback_points),
    }


def markdown_block(doc: SessionHandoff) -> str:
    return render(doc, "markdown", **block_context(doc))


def log_record(doc: SessionHandoff) -> dict:
    latest = doc.latest_valid_checkpoint
    if latest is not None:
        detail = (
            f"latest valid checkpoint {latest.path}"
            + (f" (step {latest.step}" if latest.step is not None else " (step unknown")
            + (", resumable)" if latest.resumable else ", weights only)")
            + f"; {len(doc.rollback_points)} rollback points"
        )
    elif doc.checkpoints_root is not None:
        detail = f"no valid checkpoint under {doc.checkpoints_root}"
    else:
        detail = "checkpoint policy recorded"
    if doc.policy is not None:
        detail += f"; policy {doc.policy.frequency}, keep_last {doc.policy.keep_last}"
    if doc.pending_risks:
        detail += f"; {len(doc.pending_risks)} pending risks"
    unresolved = _unresolved(doc.recovery)
    status = (
        "warning" if unresolved or (latest is None and doc.checkpoints_root is not None) else "done"
    )
    if unresolved and doc.recovery is not None:
        detail += f"; {doc.recovery.summary}"
    return {
        "ts": doc.generated_at,
        "step": "checkpoint-strategy handoff",
        "status": status,
        "detail": detail,
    }


def write(state_dir: str, doc: SessionHandoff) -> list[str]:
    return statefolder.write_state(
        state_dir,
        statefolder.StateWrite(
            handoff_json=to_json(doc.model_dump(mode="json")),
            risks=doc.pending_risks,
            next_step=doc.next_step,
            block=markdown_block(doc),
            log_record=log_record(doc),
            now=doc.generated_at,
            scope=os.path.realpath(doc.checkpoints_root) if doc.checkpoints_root else None,
        ),
    )
