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
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.hf import checkpoint_rank_gap
from checkpoint_strategy.formats.models import OptimizerSteps, RunShape
from checkpoint_strategy.formats.optstep import judge, read_optimizer_steps
from checkpoint_strategy.formats.runshape import read_run_shape, shape_change
from checkpoint_strategy.recovery.advice import _fin, _show, log_info
from checkpoint_strategy.recovery.logs import Columns, LogSeries, read_log
from checkpoint_strategy.recovery.models import VerifyResumeReport


def verify_resume(
    log_path,
    resume_step: int,
    *,
    log_format: str = "auto",
    step_key: Optional[str] = None,
    loss_key: Optional[str] = None,
    lr_key: Optional[str] = None,
    run: Optional[str] = None,
    pre_points: int = 20,
    post_points: int = 5,
    tolerance: float = 0.05,
    lr_tolerance: float = 0.10,
    checkpoints: Optional[Sequence[str]] = None,
) -> VerifyResumeReport:
    """Check the loss (and lr) right after resuming at `resume_step` against the level before it.

    log_path as for `advise`. If the log has a restart segment that starts just after resume_step
    (steps repeat), the pre-save window comes from the older segment and the post-resume window
    from the new one; otherwise both come from the merged timeline. pre_points/post_points: logged
    values in each window. checkpoints: folders (or checkpoint paths) holding the checkpoint resumed from
    and the resumed run's later checkpoints: their optimizer step counters and world size / global batch are
    compared (`_checkpoint_checks`). Returns a VerifyResumeReport (verdict "ok" or "suspicious").
    Raises UsageError on bad input.
    """
    _check_options(resume_step, pre_points, post_points, tolerance, lr_tolerance)
    series = read_log(
        log_path,
        log_format=log_format,
        columns=Columns(step=step_key, loss=loss_key, lr=lr_key, run=run),
    )
    win = _windows(series, resume_step, pre_points, post_points)
    loss = _loss_check(win, resume_step, tolerance)
    lr = _lr_check(win, lr_tolerance)
    ck = _checkpoint_checks(checkpoints, resume_step) if checkpoints else _CkCheck()
    suspicious, reasons = _verdict(win, loss, lr, ck, resume_step, tolerance)
    return _report(series, resume_step, win, loss, lr, ck, suspicious, reasons)


def _verdict(
    win: _Windows, loss: _LossCheck, lr: _LrCheck, ck: _CkCheck, resume_step: int, tolerance: float
) -> tuple[bool, list[str]]:
    """Whether the resume looks suspicious, and why (or why not); the checkpoints' warnings and a missing restart
    segment are added to `win.warnings`."""
    reasons = loss.reasons + lr.reasons
    suspicious = loss.jump or loss.drop or bool(lr.discontinuity)
    if not suspicious:
        reasons.append(
            f"loss {_show(loss.post_level)} after the resume vs {_show(loss.pre_level)} before the save: "
            f"within the band {_show(loss.band)} (max of {tolerance:.0%} and 3 standard errors)"
            + ("; learning rate continues the schedule" if lr.discontinuity is False else "")
        )
    reasons.extend(ck.reasons)
    win.warnings.extend(ck.warnings)
    suspicious = suspicious or ck.suspicious
    if not win.restart_found:
        win.warnings.append(
            f"no restart segment found at step {resume_step}: compared the continuous timeline "
            "(if the resumed run logs to a new file, append it to the old one or pass the merged log)"
        )
    return suspicious, reasons


def _report(
    series: LogSeries,
    resume_step: int,
    win: _Windows,
    loss: _LossCheck,
    lr: _LrCheck,
    ck: _CkCheck,
    suspicious: bool,
    reasons: list[str],
) -> VerifyResumeReport:
    """The report of the checks: its one-line summary, then every figure."""
    summary = (
        f"resume at step {resume_step} looks {'suspicious' if suspicious else 'ok'}: loss "
        f"{_show(loss.pre_level)} -> {_show(loss.post_level)}"
        + (f" ({loss.rel:+.1%})" if loss.rel is not None else "")
        + (
            f", lr {lr.before:.3g} -> {lr.after:.3g}"
            if lr.before is not None and lr.after is not None
            else ""
        )
        + ck.summary
    )
    raw_s, pre_idx, post_idx = win.steps, win.pre_idx, win.post_idx
    return VerifyResumeReport(
        verdict="suspicious" if suspicious else "ok",
        summary=summary,
        log=log_info(series),
        resume_step=resume_step,
        restart_found=win.restart_found,
        pre_steps=[int(raw_s[pre_idx[0]]), int(raw_s[pre_idx[-1]])],
        post_steps=[int(raw_s[post_idx[0]]), int(raw_s[post_idx[-1]])],
        pre_loss=loss.pre_level,
        post_loss=loss.post_level,
        change=_fin(loss.change),
        relative_change=_fin(loss.rel),
        noise=loss.noise,
        band=loss.band,
        jump=loss.jump,
        drop=loss.drop,
        lr_before=lr.before,
        lr_after=lr.after,
        lr_expected=lr.expected,
        lr_discontinuity=lr.discontinuity,
        reasons=reasons,
        warnings=win.warnings,
        checkpoints=ck.steps,
        optimizer_reset=ck.reset,
        shape_before=ck.before,
        shape_after=ck.after,
        batch_changed=ck.batch_changed,
    )


def _check_options(resume_step, pre_points, post_points, tolerance, lr_tolerance) -> None:
    if not isinstance(resume_step, int) or isinstance(resume_step, bool) or resume_step < 0:
        raise UsageError(f"--resume-step must be a whole number >= 0, got {resume_step!r}")
    for name, v, lo, hi in (
        ("--pre-points", pre_points, 3, 10**6),
        ("--post-points", post_points, 1, 10**6),
    ):
        if not isinstance(v, int) or not lo <= v <= hi:
            raise UsageError(f"{name} must be a whole number {lo}..{hi}, got {v!r}")
    for name, v in (("--tolerance", tolerance), ("--lr-tolerance", lr_tolerance)):
        fv = _fin(v)
        if fv is None or not 0 <= fv <= 100:
            raise UsageError(f"{name} must be a number in [0, 100], got {v!r}")


@dataclass
class _Windows:
    """The timeline compared (steps, losses, lrs) and the entries before the save and after the resume."""

    steps: np.ndarray
    loss: np.ndarray
    lr: Optional[np.ndarray]
    pre_idx: np.ndarray
    post_idx: np.ndarray
    restart_found: bool
    warnings: list[str] = field(default_factory=list)


def _windows(series: LogSeries, resume_step: int, pre_points: int, post_points: int) -> _Windows:
    """The pre-save and post-resume windows: across a restart segment starting just after the resume step
    (steps repeat), else on the merged timeline. Raises UsageError when either window is empty."""
    raw_s, seg, raw_loss = series.raw_steps, series.raw_segment, series.raw_loss
    assert raw_s is not None and seg is not None and raw_loss is not None, (
        "read_log keeps the file's order"
    )
    warnings: list[str] = []
    starts = np.flatnonzero(np.diff(seg, prepend=seg[0]) != 0)
    hit = [
        int(i) for i in starts if resume_step <= raw_s[i] <= resume_step + 3 * series.log_interval
    ]
    if hit:
        i0 = hit[-1]
        before_mask = np.zeros(len(raw_s), dtype=bool)
        before_mask[:i0] = True
        # keep the older timeline only (latest-wins among the earlier segments)
        pre_idx = _timeline(raw_s, np.flatnonzero(before_mask & (raw_s <= resume_step)))
        post_idx = np.flatnonzero((seg == seg[i0]) & (raw_s > resume_step))
        win = _Windows(raw_s, raw_loss, series.raw_lr, pre_idx, post_idx, True, warnings)
    else:
        steps = series.steps
        win = _Windows(
            steps,
            series.loss,
            series.lr,
            np.flatnonzero(steps <= resume_step),
            np.flatnonzero(steps > resume_step),
            False,
            warnings,
        )
        if len(series.restarts):
            warnings.append(
                f"no restart starts near step {resume_step}; restarts at "
                + ", ".join(str(r["step"]) for r in series.restarts[:5])
            )
    if len(win.pre_idx) == 0:
        raise UsageError(
            f"no loss logged at or before step {resume_step} (log covers "
            f"{int(series.steps[0])}-{int(series.steps[-1])}); expected the step the run resumed from"
        )
    if len(win.post_idx) == 0:
        raise UsageError(
            f"no loss logged after step {resume_step} (log ends at {int(series.steps[-1])}); "
            "run verify-resume once the resumed run has logged a few steps"
        )
    win.pre_idx = win.pre_idx[-pre_points:]
    win.post_idx = win.post_idx[:post_points]
    return win


@dataclass
class _LossCheck:
    pre_level: float
    noise: float
    band: float
    post_level: Optional[float]
    change: Optional[float]
    rel: Optional[float]
    jump: bool
    drop: bool
    reasons: list[str]


def _loss_check(win: _Windows, resume_step: int, tolerance: float) -> _LossCheck:
    """The post-resume loss level against the pre-save level and its band (see the module docstring)."""
    pre = win.loss[win.pre_idx]
    pre = pre[np.isfinite(pre)]
    if len(pre) == 0:
        raise UsageError(
            f"the losses before step {resume_step} are all NaN/inf; no level to compare with"
        )
    pre_level = float(np.median(pre))
    noise = float(1.4826 * np.median(np.abs(pre - pre_level))) if len(pre) >= 3 else 0.0
    post_all = win.loss[win.post_idx]
    post_finite = post_all[np.isfinite(post_all)]
    nonfinite = len(post_finite) < len(post_all)
    if len(pre) < 5:
        win.warnings.append(
            f"only {len(pre)} loss values before the resume: the comparison is rough"
        )
    se = 1.2533 * noise / math.sqrt(len(post_all))
    band = max(tolerance * abs(pre_level), 3.0 * se)
    post_level = _fin(np.median(post_finite)) if (len(post_finite) and not nonfinite) else None
    out = _LossCheck(pre_level, noise, band, post_level, None, None, False, False, [])
    if post_level is None:
        out.jump = True
        out.reasons.append("the loss after the resume is NaN/inf: the resumed state is broken")
        return out
    out.change = change = post_level - pre_level
    out.rel = change / abs(pre_level) if pre_level != 0 else None
    if change > band:
        out.jump = True
        out.reasons.append(
            f"jump: loss {_show(post_level)} after the resume vs {_show(pre_level)} before the save "
            f"(+{_show(change)}, band {_show(band)}); a fresh Adam moves every weight by about lr on "
            "its first step: was the optimizer state loaded?"
        )
    elif change < -band:
        out.drop = True
        out.reasons.append(
            f"drop: loss {_show(post_level)} after the resume vs {_show(pre_level)} before the save "
            f"({_show(change)}, band {_show(band)}); a sudden drop suggests an optimizer reset or a "
            "data loader restarting on data it has already seen"
        )
    return out


@dataclass
class _LrCheck:
    before: Optional[float] = None
    after: Optional[float] = None
    expected: Optional[float] = None
    discontinuity: Optional[bool] = None
    reasons: list[str] = field(default_factory=list)


def _lr_check(win: _Windows, lr_tolerance: float) -> _LrCheck:
    """The first post-resume lr against the pre-save schedule extrapolated to its step (None: lr not logged)."""
    out = _LrCheck()
    raw_lr, raw_s, pre_idx, post_idx = win.lr, win.steps, win.pre_idx, win.post_idx
    if raw_lr is None:
        return out
    ok_pre = np.flatnonzero(np.isfinite(raw_lr[pre_idx]))
    ok_post = np.flatnonzero(np.isfinite(raw_lr[post_idx]))
    if not (len(ok_pre) and len(ok_post)):
        return out
    b_i = pre_idx[ok_pre[-1]]
    a_i = post_idx[ok_post[0]]
    out.before, out.after = _fin(raw_lr[b_i]), _fin(raw_lr[a_i])
    expected = out.before
    if len(ok_pre) >= 2:
        p_i = pre_idx[ok_pre[-2]]
        ds = float(raw_s[b_i] - raw_s[p_i])
        if ds > 0:
            slope = (float(raw_lr[b_i]) - float(raw_lr[p_i])) / ds
            expected = float(raw_lr[b_i]) + slope * float(raw_s[a_i] - raw_s[b_i])
    out.expected = _fin(expected)
    if out.before is None or out.after is None or out.expected is None:
        return out
    scale = max(abs(out.expected), abs(out.before))
    out.discontinuity = bool(scale > 0 and abs(out.after - out.expected) > lr_tolerance * scale)
    if out.discontinuity:
        out.reasons.append(
            f"learning rate {out.after:.3g} after the resume vs {out.expected:.3g} expected from "
            f"the schedule ({out.before:.3g} before the save): the scheduler state was not "
            "restored; with the HF Trainer this happens when optimizer.pt or scheduler.pt "
            "is missing from the checkpoint, and then the optimizer state (Adam's moments) "
            "was lost too"
        )
    return out


def _timeline(raw_s: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Of the entries `idx` (file order), keep each step's latest, rewinding at restarts."""
    out: list[int] = []
    for i in idx:
        s = raw_s[i]
        while out and raw_s[out[-1]] >= s:
            out.pop()
        out.append(int(i))
    return np.array(out, dtype=np.int64)


# --------------------------------------------------------------------------- the checkpoints' own evidence

#: checkpoints after the resume step that are read (the first ones: the resume's effect shows there)
MAX_AFTER = 10


@dataclass
class _CkCheck:
    """What --checkpoints adds: optimizer step counters, world size / global batch before and after."""

    steps: list[OptimizerSteps] = field(default_factory=list)
    reset: Optional[bool] = None
    before: Optional[RunShape] = None
    after: Optional[RunShape] = None
    batch_changed: Optional[bool] = None
    suspicious: bool = False
    summary: str = ""
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _found(paths: Sequence[str]) -> list:
    """Every checkpoint at or under `paths` (formats.discover), with a step, oldest first."""
    out, seen = [], set()
    for p in paths:
        if not os.path.lexists(p):
            raise UsageError(
                f"--checkpoints {p!r} does not exist: expected a checkpoint or a folder of checkpoints"
            )
        found, _unrecognised = fm.discover(p)
        for f in found:
            # the same checkpoint through two --checkpoints (or a symlink): once
            real = os.path.realpath(f.path)
            name = os.path.basename(os.path.normpath(f.path))
            # a save still being written
            in_flight = name.startswith("tmp-") or fm.ORBAX_TMP in name
            if f.role == "checkpoint" and f.step is not None and real not in seen and not in_flight:
                seen.add(real)
                out.append(f)
    if not out:
        raise UsageError(
            f"no checkpoints found in {', '.join(map(repr, paths))}: expected checkpoint-N, step-N, "
            "global_stepN or *step=N.ckpt entries"
        )
    return sorted(out, key=lambda f: (f.step, f.path))


def _checkpoint_checks(paths: Sequence[str], resume_step: int) -> _CkCheck:
    """The resumed-from checkpoint (step == resume_step, else the newest before it) and the first MAX_AFTER
    checkpoints after it: optimizer step counters judged against resume_step, and the run shape compared."""
    found = _found(paths)
    out = _CkCheck()
    earlier = [f for f in found if f.step <= resume_step]
    later = [f for f in found if f.step > resume_step][:MAX_AFTER]
    base = earlier[-1] if earlier else None
    if base is not None:
        b = read_optimizer_steps(base.path, base.format)
        out.steps.append(b)
        if b.verdict in ("behind", "ahead"):
            out.warnings.append(
                f"the checkpoint resumed from ({base.path}) is already off: {b.reason}"
            )
        if base.step != resume_step:
            out.warnings.append(
                f"no checkpoint at step {resume_step}; compared with {base.path} (step {base.step})"
            )
    if not later:
        out.warnings.append(
            f"no checkpoint after step {resume_step} in --checkpoints: the resumed run's optimizer "
            "state cannot be checked until it saves once"
        )
    _torn(out, base, later)
    for f in later:
        out.steps.append(judge(read_optimizer_steps(f.path, f.format), resume_step))
    _judge_later(out, out.steps[1:] if base is not None else out.steps, resume_step)
    if base is not None and later:
        out.before, out.after = (
            read_run_shape(base.path, base.format),
            read_run_shape(later[0].path, later[0].format),
        )
        lines, changed = shape_change(out.before, out.after)
        known = out.before.global_batch is not None and out.after.global_batch is not None
        out.batch_changed = changed if known else None
        (out.reasons if changed else out.warnings).extend(lines)
        out.suspicious = out.suspicious or changed
        if changed:
            out.summary += "; global batch changed"
    return out


def _torn(out: _CkCheck, base, later: list) -> None:
    """A warning for each checkpoint a rank did not finish (runfacts.rank_gap: a per-rank file the run's world size
    needs is missing): resumed from, the ranks without their file started from a fresh RNG stream."""
    for f in ([base] if base is not None else []) + later:
        gap = checkpoint_rank_gap(f.path)
        if gap is not None:
            what = "the checkpoint resumed from" if f is base else "a checkpoint after the resume"
            out.warnings.append(
                f"{what} ({os.path.basename(os.path.normpath(f.path))}) is incomplete: {gap.file} "
                f"missing: {gap.what()}"
            )


def _judge_later(out: _CkCheck, later: list[OptimizerSteps], resume_step: int) -> None:
    """Verdicts of the checkpoints after the resume: reset / ahead are suspicious, behind is a warning; a counter
    lower than the resumed-from checkpoint's is a reset even where the training step is not recorded."""
    base = out.steps[0] if len(out.steps) > len(later) else None
    for s in later:
        if (
            s.verdict == "unknown"
            and base is not None
            and None not in (base.optimizer_step, s.optimizer_step)
            and s.optimizer_step < base.optimizer_step  # type: ignore[operator]
        ):
            s.verdict = "reset"
            s.reason = (
                f"optimizer step counter went down from {base.optimizer_step} (the checkpoint resumed from) "
                f"to {s.optimizer_step}: the optimizer started from nothing at the resume"
            )
    judged = [s for s in later if s.verdict != "unknown"]
    if judged:
        out.reset = any(s.verdict == "reset" for s in judged)
    for verdict, lines in (
        ("reset", out.reasons),
        ("ahead", out.reasons),
        ("behind", out.warnings),
    ):
        hit = [s for s in later if s.verdict == verdict]
        if hit:
            more = (
                f" (and {len(hit) - 1} later checkpoint{'s' if len(hit) > 2 else ''} likewise)"
                if len(hit) > 1
                else ""
            )
            lines.append(f"{hit[0].path}: {hit[0].reason}{more}")
    out.suspicious = out.suspicious or any(s.verdict in ("reset", "ahead") for s in later)
    _scheduler_restart(out, later, resume_step)
    if out.reset:
        out.summary += f"; optimizer state reset at step {resume_step}"
    elif judged and all(s.verdict == "consistent" for s in judged):
        out.reasons.append(
            f"optimizer step counter continues across the resume ({judged[0].path}: "
            f"{judged[0].reason})"
        )
    elif later and not judged:
        out.warnings.append(
            "the checkpoints after the resume record no optimizer step counter or no training "
            "step: the optimizer state could not be checked from them"
        )


def _scheduler_restart(out: _CkCheck, later: list[OptimizerSteps], resume_step: int) -> None:
    """An LR scheduler stepped once per optimizer step (HF Trainer, torchtitan) whose last_epoch counts only the
    steps since the resume started its schedule over (warm-up again): suspicious. Lightning's may step per epoch:
    not judged."""
    for s in later:
        if (
            s.format not in ("hf-trainer", "dcp", "torchtitan")
            or s.scheduler_step is None
            or s.training_step is None
            or not 0 < resume_step < s.training_step
        ):
            continue
        if s.scheduler_step <= s.training_step - resume_step:
            out.suspicious = True
            out.reasons.append(
                f"{s.path}: LR scheduler last_epoch {s.scheduler_step} at training step "
                f"{s.training_step}: the schedule restarted at the resume from step {resume_step} "
                "(warm-up and decay start over)"
            )
        return
