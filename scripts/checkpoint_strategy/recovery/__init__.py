"""Loss-spike recovery: read a training log, find spikes, say where to resume and check a resume.

Public API (stable):

    advise(log_path, checkpoints=None, **options) -> RecoveryReport
    detect_spikes(steps, loss, grad_norm=None, **thresholds) -> list[Spike]
    verify_resume(log_path, resume_step, **options) -> VerifyResumeReport

See each function's docstring; detection rules and their sources are in recovery/detect.py.
numpy is imported lazily, on first use of a function.
"""

from __future__ import annotations

__all__ = ["advise", "detect_spikes", "verify_resume", "OnlineDetector", "RecoveryOptions"]


def __getattr__(name):
    if name == "OnlineDetector":
        from checkpoint_strategy.recovery.online import OnlineDetector

        return OnlineDetector
    if name == "RecoveryOptions":
        from checkpoint_strategy.recovery.settings import RecoveryOptions

        return RecoveryOptions
    raise AttributeError(name)


def advise(log_path, checkpoints=None, **options):
    """Find loss spikes in a training log and compute the recovery playbook -> RecoveryReport.

    log_path: trainer_state.json, CSV/W&B export, JSON(L), TensorBoard events, or a run/checkpoint
    folder. checkpoints: None (found next to the log), a folder, "500,1000", or a sequence of steps
    or (step, path). Options (keyword): milestones, log_format, step_key, loss_key, grad_norm_key,
    lr_key, run, and options=RecoveryOptions(...) or its fields as keywords (window, z_threshold,
    ratio_threshold, max_ratio, min_rise, tolerance, wait_steps, min_wait_steps, margin, lr_multiplier,
    lr_reduced_steps, grad_clip, skip_past_onset; defaults and bounds in recovery.settings).
    Raises checkpoint_strategy.errors.UsageError (one line) on bad input. Full description:
    checkpoint_strategy.recovery.advice.advise.
    """
    from checkpoint_strategy.recovery.advice import advise as _advise

    return _advise(log_path, checkpoints, **options)


def detect_spikes(steps, loss, grad_norm=None, **thresholds):
    """Spikes in raw arrays (restarts merged, latest wins) -> list[Spike], oldest first.

    thresholds: RecoveryOptions fields (window, z_threshold, ratio_threshold, ...) as keywords.
    """
    from checkpoint_strategy.recovery.advice import detect_spikes as _detect

    return _detect(steps, loss, grad_norm, **thresholds)


def verify_resume(log_path, resume_step, **options):
    """Loss/lr continuity right after resuming at resume_step -> VerifyResumeReport (ok|suspicious)."""
    from checkpoint_strategy.recovery.verify import verify_resume as _verify

    return _verify(log_path, resume_step, **options)
