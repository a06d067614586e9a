"""`tradeoffs --plot FILE`: peak storage against expected lost hours (matplotlib, optional extra `plot`).

matplotlib is imported only here, and only through its object API (Figure + savefig), so no global
backend is switched and no display is needed (the Agg/SVG renderers draw to memory).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage import write_output

FORMATS = {".png": "png", ".svg": "svg"}
INSTALL_HINT = "pip install 'checkpoint-strategy[plot]'"


def check_plot_path(path: str) -> tuple[Path, str]:
    """The plot file and its format; bad extension or unwritable place: UsageError (before any work)."""
    target = Path(path)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise UsageError(f"argument --plot: expected a file ending in .png or .svg, got {path!r}")
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(
            f"argument --plot: {path!r} is a folder; expected a .png or .svg file name"
        )
    if not parent.is_dir():
        raise UsageError(f"argument --plot: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        raise UsageError(f"argument --plot: cannot write {path!r} (permission denied)")
    return target, fmt


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise UsageError(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None


def _draw_points(ax, points) -> None:
    """Every policy, one colour per keep_last, and the Pareto front ringed in black."""
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    keeps = sorted({p.keep_last for p in points})
    for i, k in enumerate(keeps):
        series = sorted((p for p in points if p.keep_last == k), key=lambda p: p.frequency_steps)
        color = cmap(i / max(1, len(keeps) - 1))
        ax.scatter(
            [p.expected_lost_hours for p in series],
            [p.peak_storage_gb for p in series],
            color=color,
            s=12,
            alpha=0.85,
            label=f"keep_last {k}",
            zorder=2,
        )
    front = [p for p in points if p.pareto]
    ax.scatter(
        [p.expected_lost_hours for p in front],
        [p.peak_storage_gb for p in front],
        s=70,
        facecolors="none",
        edgecolors="black",
        linewidths=1.2,
        label="Pareto front",
        zorder=3,
    )


def _mark_recommended(ax, points) -> None:
    """A red star and a note on the recommended policy, when there is one."""
    rec = next((p for p in points if p.recommended), None)
    if rec is not None:
        ax.scatter(
            [rec.expected_lost_hours],
            [rec.peak_storage_gb],
            marker="*",
            s=260,
            color="red",
            edgecolors="black",
            zorder=4,
            label="recommended",
        )
        ax.annotate(
            f"recommended: every {rec.frequency_steps} steps, keep_last {rec.keep_last}",
            (rec.expected_lost_hours, rec.peak_storage_gb),
            xytext=(12, 12),
            textcoords="offset points",
            fontsize=9,
            arrowprops=dict(arrowstyle="-", color="black", linewidth=0.8),
        )


def _label(ax, report, points) -> None:
    """Axes (log x when the losses span more than 30x), title, grid and legend."""
    xs = [p.expected_lost_hours for p in points]
    if xs and min(xs) > 0 and max(xs) / min(xs) > 30:
        ax.set_xscale("log")
    ax.set_xlabel("expected hours lost over the run (saves, rework, restarts; Daly 2006)")
    ax.set_ylabel("peak checkpoint storage (GB)")
    names = {
        "peak_storage_gb": "storage",
        "expected_lost_hours": "expected loss",
        "max_data_loss_hours": "max loss per failure",
        "spike_window_rescue_probability": "spike rescue",
    }
    objectives = ", ".join(
        names.get(o.split(" ")[0], o.split(" ")[0]) for o in report.pareto_objectives
    )
    ax.set_title(
        f"Checkpoint storage vs safety: {report.total_steps} steps x {report.step_seconds:g} s, "
        f"{len(points)} policies\nPareto front over {objectives}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def render_plot(report, fmt: str) -> bytes:
    """The plot of a TradeoffsReport as PNG or SVG bytes."""
    require_matplotlib()
    from matplotlib.figure import Figure

    if report.checkpoint_size_gb is None:
        raise UsageError(
            "--plot draws storage, which needs the checkpoint size: give --model_size_gb N or --params N"
        )
    points = report.points
    fig = Figure(figsize=(9.5, 5.6), dpi=110, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    _draw_points(ax, points)
    ax.axhline(
        report.storage_budget_gb,
        color="crimson",
        linestyle="--",
        linewidth=1.2,
        label=f"budget {report.storage_budget_gb:g} GB",
    )
    _mark_recommended(ax, points)
    _label(ax, report, points)
    buf = io.BytesIO()
    # stable output for a given input
    metadata = {"Software": None} if fmt == "png" else {"Date": None}
    fig.savefig(buf, format=fmt, metadata=metadata)
    return buf.getvalue()


def write_plot(report, target: Path, fmt: str) -> None:
    write_output(target, render_plot(report, fmt), "argument --plot")
