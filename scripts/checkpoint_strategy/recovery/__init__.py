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
    from checkpoint_strategy.recovery.advice import advise as _advise

    return _advise(log_path, checkpoints, **options)


def detect_spikes(steps, loss, grad_norm=None, **thresholds):
    from checkpoint_strategy.recovery.advice import detect_spikes as _detect

    return _detect(steps, loss, grad_norm, **thresholds)


def verify_resume(log_path, resume_step, **options):
    from checkpoint_strategy.recovery.verify import verify_resume as _verify

    return _verify(log_path, resume_step, **options)


def _copy_doc() -> None:
    from checkpoint_strategy.recovery import advice, verify

    advise.__doc__ = advice.advise.__doc__
    detect_spikes.__doc__ = advice.detect_spikes.__doc__
    verify_resume.__doc__ = verify.verify_resume.__doc__
