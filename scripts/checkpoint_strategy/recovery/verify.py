"""Did a resume keep the optimizer state? Compare the loss just after the resume with the level
just before the save.

* jump: the post-resume loss is above the pre-save level by more than the band. A fresh Adam
  (no optimizer state) moves every weight by about lr on its first step, which shows as a jump.
* drop: below by more than the band. The spec: "sudden drop suggests optimizer reset"; it is also
  what a data loader restarting on already-seen data looks like.
* lr discontinuity (when the learning rate is logged): the first post-resume lr differs from the
  pre-save schedule extrapolated one logging interval on by more than lr_tolerance (10 %): the
  scheduler state was not restored (warm-up restarting, or a constant lr).

band = max(tolerance * |pre level|, 3 standard errors of the post-resume median), with the
standard error 1.2533 * noise / sqrt(post points) and noise = 1.4826 * MAD of the pre-save window.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery.advice import _fin, _show, log_info
from checkpoint_strategy.recovery.logs import Columns, read_log
from checkpoint_strategy.recovery.models import VerifyResumeReport


def verify_resume(log_path, resume_step: int, *, log_format: str = "auto", step_key: Optional[str] = None,  # noqa: C901 - complexity debt, see issue 10
                  loss_key: Optional[str] = None, lr_key: Optional[str] = None, run: Optional[str] = None,
                  pre_points: int = 20, post_points: int = 5, tolerance: float = 0.05,
                  lr_tolerance: float = 0.10) -> VerifyResumeReport:
    """Check the loss (and lr) right after resuming at `resume_step` against the level before it.

    log_path as for `advise`. If the log has a restart segment that starts just after resume_step
    (steps repeat), the pre-save window comes from the older segment and the post-resume window
    from the new one; otherwise both come from the merged timeline. pre_points/post_points: logged
    values in each window. Returns a VerifyResumeReport (verdict "ok" or "suspicious").
    Raises UsageError on bad input.
    """
    if not isinstance(resume_step, int) or isinstance(resume_step, bool) or resume_step < 0:
        raise UsageError(f"--resume-step must be a whole number >= 0, got {resume_step!r}")
    for name, v, lo, hi in (("--pre-points", pre_points, 3, 10**6), ("--post-points", post_points, 1, 10**6)):
        if not isinstance(v, int) or not lo <= v <= hi:
            raise UsageError(f"{name} must be a whole number {lo}..{hi}, got {v!r}")
    for name, v in (("--tolerance", tolerance), ("--lr-tolerance", lr_tolerance)):
        fv = _fin(v)
        if fv is None or not 0 <= fv <= 100:
            raise UsageError(f"{name} must be a number in [0, 100], got {v!r}")
    series = read_log(log_path, log_format=log_format, columns=Columns(step=step_key, loss=loss_key, lr=lr_key,
                                                                       run=run))
    raw_s, raw_x, seg = series.raw_steps, series.raw_loss, series.raw_segment
    raw_lr = series.raw_lr
    interval = series.log_interval
    n = len(raw_s)
    restart_found = False
    warnings: list[str] = []
    # a restart segment starting just after the resume step
    starts = np.flatnonzero(np.diff(seg, prepend=seg[0]) != 0)
    hit = [int(i) for i in starts if resume_step <= raw_s[i] <= resume_step + 3 * interval]
    if hit:
        i0 = hit[-1]
        restart_found = True
        before_mask = np.zeros(n, dtype=bool)
        before_mask[:i0] = True
        pre_idx = np.flatnonzero(before_mask & (raw_s <= resume_step))
        # keep the older timeline only (latest-wins among the earlier segments)
        pre_idx = _timeline(raw_s, pre_idx)
        post_idx = np.flatnonzero((seg == seg[i0]) & (raw_s > resume_step))
    else:
        steps = series.steps
        pre_idx = np.flatnonzero(steps <= resume_step)
        post_idx = np.flatnonzero(steps > resume_step)
        raw_s, raw_x, raw_lr = steps, series.loss, series.lr
        if len(series.restarts):
            warnings.append(f"no restart starts near step {resume_step}; restarts at "
                            + ", ".join(str(r["step"]) for r in series.restarts[:5]))
    if len(pre_idx) == 0:
        raise UsageError(f"no loss logged at or before step {resume_step} (log covers "
                         f"{int(series.steps[0])}-{int(series.steps[-1])}); expected the step the run resumed from")
    if len(post_idx) == 0:
        raise UsageError(f"no loss logged after step {resume_step} (log ends at {int(series.steps[-1])}); "
                         "run verify-resume once the resumed run has logged a few steps")
    pre_idx = pre_idx[-pre_points:]
    post_idx = post_idx[:post_points]
    pre = raw_x[pre_idx]
    pre = pre[np.isfinite(pre)]
    if len(pre) == 0:
        raise UsageError(f"the losses before step {resume_step} are all NaN/inf; no level to compare with")
    pre_level = float(np.median(pre))
    noise = float(1.4826 * np.median(np.abs(pre - pre_level))) if len(pre) >= 3 else 0.0
    post_all = raw_x[post_idx]
    post_finite = post_all[np.isfinite(post_all)]
    nonfinite = len(post_finite) < len(post_all)
    if len(pre) < 5:
        warnings.append(f"only {len(pre)} loss values before the resume: the comparison is rough")
    se = 1.2533 * noise / math.sqrt(len(post_all))
    band = max(tolerance * abs(pre_level), 3.0 * se)
    reasons: list[str] = []
    post_level = _fin(np.median(post_finite)) if (len(post_finite) and not nonfinite) else None
    change = rel = None
    jump = drop = False
    if post_level is None:
        jump = True
        reasons.append("the loss after the resume is NaN/inf: the resumed state is broken")
    else:
        change = post_level - pre_level
        rel = change / abs(pre_level) if pre_level != 0 else None
        if change > band:
            jump = True
            reasons.append(f"jump: loss {_show(post_level)} after the resume vs {_show(pre_level)} before the save "
                           f"(+{_show(change)}, band {_show(band)}); a fresh Adam moves every weight by about lr on "
                           "its first step: was the optimizer state loaded?")
        elif change < -band:
            drop = True
            reasons.append(f"drop: loss {_show(post_level)} after the resume vs {_show(pre_level)} before the save "
                           f"({_show(change)}, band {_show(band)}); a sudden drop suggests an optimizer reset or a "
                           "data loader restarting on data it has already seen")
    lr_before = lr_after = lr_expected = None
    lr_disc: Optional[bool] = None
    if raw_lr is not None:
        lr_pre = raw_lr[pre_idx]
        ok_pre = np.flatnonzero(np.isfinite(lr_pre))
        lr_post = raw_lr[post_idx]
        ok_post = np.flatnonzero(np.isfinite(lr_post))
        if len(ok_pre) and len(ok_post):
            b_i = pre_idx[ok_pre[-1]]
            a_i = post_idx[ok_post[0]]
            lr_before, lr_after = _fin(raw_lr[b_i]), _fin(raw_lr[a_i])
            expected = lr_before
            if len(ok_pre) >= 2:
                p_i = pre_idx[ok_pre[-2]]
                ds = float(raw_s[b_i] - raw_s[p_i])
                if ds > 0:
                    slope = (float(raw_lr[b_i]) - float(raw_lr[p_i])) / ds
                    expected = float(raw_lr[b_i]) + slope * float(raw_s[a_i] - raw_s[b_i])
            lr_expected = _fin(expected)
            if lr_before is not None and lr_after is not None and lr_expected is not None:
                scale = max(abs(lr_expected), abs(lr_before))
                lr_disc = bool(scale > 0 and abs(lr_after - lr_expected) > lr_tolerance * scale)
                if lr_disc:
                    reasons.append(f"learning rate {lr_after:.3g} after the resume vs {lr_expected:.3g} expected from "
                                   f"the schedule ({lr_before:.3g} before the save): the scheduler state was not "
                                   "restored; with the HF Trainer this happens when optimizer.pt or scheduler.pt "
                                   "is missing from the checkpoint, and then the optimizer state (Adam's moments) "
                                   "was lost too")
    suspicious = jump or drop or bool(lr_disc)
    if not suspicious:
        reasons.append(f"loss {_show(post_level)} after the resume vs {_show(pre_level)} before the save: within "
                       f"the band {_show(band)} (max of {tolerance:.0%} and 3 standard errors)"
                       + ("; learning rate continues the schedule" if lr_disc is False else ""))
    if not restart_found:
        warnings.append(f"no restart segment found at step {resume_step}: compared the continuous timeline "
                        "(if the resumed run logs to a new file, append it to the old one or pass the merged log)")
    summary = (f"resume at step {resume_step} looks {'suspicious' if suspicious else 'ok'}: loss "
               f"{_show(pre_level)} -> {_show(post_level)}"
               + (f" ({rel:+.1%})" if rel is not None else "")
               + (f", lr {lr_before:.3g} -> {lr_after:.3g}" if lr_before is not None and lr_after is not None else ""))
    return VerifyResumeReport(
        verdict="suspicious" if suspicious else "ok", summary=summary, log=log_info(series),
        resume_step=resume_step, restart_found=restart_found,
        pre_steps=[int(raw_s[pre_idx[0]]), int(raw_s[pre_idx[-1]])],
        post_steps=[int(raw_s[post_idx[0]]), int(raw_s[post_idx[-1]])],
        pre_loss=pre_level, post_loss=post_level, change=_fin(change), relative_change=_fin(rel),
        noise=noise, band=band, jump=jump, drop=drop, lr_before=lr_before, lr_after=lr_after,
        lr_expected=lr_expected, lr_discontinuity=lr_disc, reasons=reasons, warnings=warnings)


def _timeline(raw_s: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Of the entries `idx` (file order), keep each step's latest, rewinding at restarts."""
    out: list[int] = []
    for i in idx:
        s = raw_s[i]
        while out and raw_s[out[-1]] >= s:
            out.pop()
        out.append(int(i))
    return np.array(out, dtype=np.int64)
