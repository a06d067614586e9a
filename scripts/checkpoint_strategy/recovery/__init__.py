"""Loss-spike recovery: read a training log, find spikes, say where to resume and check a resume.

Public API (stable):

    advise(log_path, checkpoints=None, **options) -> RecoveryReport
    detect_spikes(steps, loss, grad_norm=None, **thresholds) -> list[Spike]
    verify_resume(log_path, resume_step, **options) -> VerifyResumeReport

See each function's docstring; detection rules and their sources are in recovery/detect.py.
numpy is imported lazily, on first use of a function.
"""

from __future__ import annotations

__all__ = ["advise", "detect_spikes", "verify_resume"]


def advise(log_path, checkpoints=None, **options):
    """Find loss spikes in a training log and compute the recovery playbook -> RecoveryReport.

    log_path: trainer_state.json, CSV/W&B export, JSON(L), TensorBoard events, or a run/checkpoint
    folder. checkpoints: None (found next to the log), a folder, "500,1000", or a sequence of steps
    or (step, path). Options (keyword): milestones, log_format, step_key, loss_key, grad_norm_key,
    lr_key, run, window=128, z_threshold=7, ratio_threshold=2.5, max_ratio=10, min_rise=0.05,
    tolerance=0.10, wait_steps=100, min_wait_steps=50, margin=None (log interval + 1),
    lr_multiplier=0.5, lr_reduced_steps=500, grad_clip=0.5, skip_past_onset=20.
    Raises checkpoint_strategy.errors.UsageError (one line) on bad input. Full description:
    checkpoint_strategy.recovery.advice.advise.
    """
    from checkpoint_strategy.recovery.advice import advise as _advise

    return _advise(log_path, checkpoints, **options)


def detect_spikes(steps, loss, grad_norm=None, **thresholds):
    """Spikes in raw arrays (restarts merged, latest wins) -> list[Spike], oldest first.

    thresholds: window, z_threshold, ratio_threshold, max_ratio, min_rise, tolerance.
    """
    from checkpoint_strategy.recovery.advice import detect_spikes as _detect

    return _detect(steps, loss, grad_norm, **thresholds)


def verify_resume(log_path, resume_step, **options):
    """Loss/lr continuity right after resuming at resume_step -> VerifyResumeReport (ok|suspicious)."""
    from checkpoint_strategy.recovery.verify import verify_resume as _verify

    return _verify(log_path, resume_step, **options)
