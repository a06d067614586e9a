"""`recover --plot FILE`: the loss curve and why the advice is what it is (matplotlib, extra `plot`).

One picture: the raw loss (thin) and its rolling median, the healthy level the detector judges
recovery against, every event shaded by kind, every known checkpoint as a tick at the bottom (the
resume point highlighted, post-event ones marked with an x), and the learning rate on a second axis
when the log has one. Log scale when the loss spans more than 30x. matplotlib is imported here only,
through its object API (no global backend, no display), and its absence is reported by the same
code as `tradeoffs --plot` (simulation.plot.require_matplotlib).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Optional

import numpy as np

from checkpoint_strategy.recovery import detect
from checkpoint_strategy.simulation.plot import require_matplotlib
from checkpoint_strategy.storage import write_output

MAX_DRAWN = 20000  # points per line: longer logs are drawn as block min/max envelopes
KIND_COLORS = {
    "spike": "#f5a623",
    "divergence": "#d0021b",
    "level_shift": "#9013fe",
    "nonfinite": "#000000",
    "collapse": "#4a4a4a",
    "grad_norm": "#4a90e2",
}
KIND_NAMES = {
    "spike": "spike",
    "divergence": "divergence",
    "level_shift": "level shift",
    "nonfinite": "NaN/inf",
    "collapse": "collapse",
    "grad_norm": "grad-norm spike",
}


def _thin(steps: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(y)
    if n <= MAX_DRAWN:
        return steps, y
    k = -(-n // (MAX_DRAWN // 2))
    m = n // k
    s = steps[: m * k].reshape(m, k)
    v = y[: m * k].reshape(m, k)
    with np.errstate(invalid="ignore"):
        lo, hi = np.nanmin(v, axis=1), np.nanmax(v, axis=1)
    xs = np.repeat(s[:, 0], 2)
    ys = np.empty(2 * m)
    ys[0::2], ys[1::2] = lo, hi
    return xs, ys


def build_figure(report, series, checkpoints: list[tuple[int, Optional[str]]]):
    """The matplotlib Figure for a RecoveryReport and the LogSeries it was computed from."""
    require_matplotlib()
    from matplotlib.figure import Figure

    steps = series.steps.astype(np.float64)
    loss = np.where(np.isfinite(series.loss), series.loss, np.nan)
    fig = Figure(figsize=(11, 5.8), dpi=110, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    _draw_loss(ax, steps, loss)
    _draw_reference(ax, report, series, steps)
    shown_kinds: dict[str, None] = {}
    last = float(steps[-1])
    for s in report.spikes:
        end = float(s.recovered_step) if s.recovered_step is not None else last
        ax.axvspan(
            s.onset_step,
            max(end, s.onset_step + 0.5),
            color=KIND_COLORS[s.kind],
            alpha=0.18,
            lw=0,
            gid=f"event:{s.kind}:{s.onset_step}",
        )
        shown_kinds[s.kind] = None
    post = {c.step for c in report.checkpoints.post_event}
    ck_steps = sorted({s for s, _ in checkpoints})
    _draw_checkpoints(ax, ck_steps, post, report.resume_checkpoint)
    finite = loss[np.isfinite(loss)]
    if len(finite) and finite.min() > 0 and finite.max() / finite.min() > 30:
        ax.set_yscale("log")
    ax.set_xlabel(axis_label("step", series.step_key))
    ax.set_ylabel(axis_label("loss", series.loss_key))
    handles, labels = ax.get_legend_handles_labels()
    _legend_extras(handles, labels, shown_kinds, ck_steps, post, report.resume_checkpoint)
    if series.lr is not None and np.isfinite(series.lr).any():
        _draw_lr(ax, steps, series.lr, handles, labels)
    # outside the axes, to their right: a legend inside covered the spike or the resume label on real logs
    fig.legend(handles, labels, fontsize=8, loc="outside right upper")
    ax.grid(True, alpha=0.25)
    title = f"{report.status.replace('_', ' ')}: {report.summary}"
    ax.set_title(title if len(title) < 120 else title[:117] + "...", fontsize=9.5)
    return fig


def axis_label(name: str, key: Optional[str]) -> str:
    """ "loss (train_loss)", or "loss" when the log's column is called that (not "loss (loss)")."""
    return name if not key or key.strip().lower() == name else f"{name} ({key})"


def lr_limits(lr: np.ndarray) -> Optional[tuple[float, float]]:
    """The right axis' range for a learning rate: from 0 to 10 % above its largest value, so a flat (constant)
    learning rate is a flat line at 90 % of the height, not a zoomed axis of its rounding noise; None when the
    values are not all >= 0 or all 0."""
    v = lr[np.isfinite(lr)]
    if not len(v) or v.min() < 0 or v.max() <= 0:
        return None
    return 0.0, float(v.max()) * 1.1


def _draw_loss(ax, steps: np.ndarray, loss: np.ndarray) -> None:
    """The raw loss (thin) and its rolling median."""
    xs, ys = _thin(steps, loss)
    ax.plot(xs, ys, color="#9b9b9b", linewidth=0.6, alpha=0.7, label="loss (raw)", gid="raw")
    k = max(detect.SMOOTH_POINTS, min(51, len(loss) // 50 | 1))
    if len(loss) < k:
        return

    from numpy.lib.stride_tricks import sliding_window_view

    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sm = np.nanmedian(sliding_window_view(loss, k), axis=1)
    sx, sy = _thin(steps[k - 1 :], sm)
    ax.plot(sx, sy, color="#1f4e79", linewidth=1.4, label=f"loss (median of {k})", gid="smoothed")


def _draw_reference(ax, report, series, steps: np.ndarray) -> None:
    """The healthy level the detector judges recovery against, frozen at the onset of unrecovered trouble (with
    the band the loss must come back into)."""
    window = detect.effective_window(len(series.loss), report.thresholds.window)
    ref = detect._ffill(detect.healthy_reference(series.loss, window))
    target = (
        report.spike if (report.spike is not None and report.spike.recovered_step is None) else None
    )
    if (
        target is not None and target.reference_loss is not None
    ):  # frozen at the onset of the trouble
        at = int(np.searchsorted(series.steps, target.onset_step))
        ref[at:] = target.reference_loss
        band = target.reference_loss + report.thresholds.tolerance * abs(target.reference_loss)
        ax.hlines(
            band,
            target.onset_step,
            float(steps[-1]),
            color="#2e7d32",
            linewidth=0.8,
            linestyle=":",
            label=f"back within {report.thresholds.tolerance:.0%}",
            gid="band",
        )
    rx, ry = _thin(steps, ref)
    ax.plot(
        rx,
        ry,
        color="#2e7d32",
        linewidth=1.2,
        linestyle="--",
        label="healthy level (reference)",
        gid="reference",
    )


def _draw_checkpoints(ax, ck_steps: list[int], post: set[int], res) -> None:
    """Checkpoints as ticks at the bottom, post-event ones marked x, the resume point as a line."""
    if ck_steps:
        ax.vlines(
            ck_steps,
            0,
            0.035,
            transform=ax.get_xaxis_transform(),
            color="#555555",
            linewidth=0.8,
            gid="checkpoints",
        )
        if post:
            ps = sorted(post)
            ax.plot(
                ps,
                [0.05] * len(ps),
                "x",
                transform=ax.get_xaxis_transform(),
                color="#d0021b",
                markersize=5,
                gid="post_event",
            )
    if res is not None:
        ax.axvline(res.step, color="#2e7d32", linewidth=2.0, gid="resume")
        ax.annotate(
            f"resume: step {res.step}",
            (res.step, 0.93),
            xycoords=ax.get_xaxis_transform(),
            xytext=(6, 0),
            textcoords="offset points",
            fontsize=8,
            color="#2e7d32",
        )


def _legend_extras(
    handles: list,
    labels: list[str],
    shown_kinds: dict[str, None],
    ck_steps: list[int],
    post: set[int],
    res,
) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    for kind in shown_kinds:
        handles.append(Patch(color=KIND_COLORS[kind], alpha=0.3))
        labels.append(KIND_NAMES[kind])
    if ck_steps:
        handles.append(Line2D([], [], color="#555555", marker="|", linestyle="none", markersize=10))
        labels.append(f"checkpoints ({len(ck_steps)})")
    if post:
        handles.append(Line2D([], [], color="#d0021b", marker="x", linestyle="none"))
        labels.append("post-event: do not resume")
    if res is not None:
        handles.append(Line2D([], [], color="#2e7d32", linewidth=2.0))
        labels.append("resume point")


def _draw_lr(ax, steps: np.ndarray, lr: np.ndarray, handles: list, labels: list[str]) -> None:
    """The learning rate on a second axis."""
    from matplotlib.lines import Line2D

    ax2 = ax.twinx()
    lx, ly = _thin(steps, np.where(np.isfinite(lr), lr, np.nan))
    ax2.plot(lx, ly, color="#e67e22", linewidth=0.9, alpha=0.8, gid="lr")
    ax2.set_ylabel("learning rate", color="#e67e22")
    lim = lr_limits(lr)
    if lim is not None:
        ax2.set_ylim(*lim)
    ax2.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3), useOffset=False)
    handles.append(Line2D([], [], color="#e67e22"))
    labels.append("learning rate (right axis)")


def render_curve(report, series, checkpoints, fmt: str) -> bytes:
    fig = build_figure(report, series, checkpoints)
    buf = io.BytesIO()
    metadata = {"Software": None} if fmt == "png" else {"Date": None}
    fig.savefig(buf, format=fmt, metadata=metadata)
    return buf.getvalue()


def write_curve(report, series, checkpoints, target: Path, fmt: str) -> None:
    write_output(
        target,
        render_curve(report, series, checkpoints, fmt),
        "argument --plot",
        inputs=(report.log.path,),
    )
