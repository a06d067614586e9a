"""`recover --plot`: a real PNG/SVG whose drawn elements (matplotlib artists) show the loss, the
healthy level, the events by kind, the checkpoints (resume point, post-event ones) and the LR."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.recovery.advice import advise_series
from checkpoint_strategy.recovery.logs import build_series

pytest.importorskip("matplotlib")
REAL = (
    Path(__file__).parent
    / "data"
    / "real-logs"
    / "CAMELS-CH--lightning_logs--version_71--metrics.csv"
)


def _case():
    rng = np.random.default_rng(6)
    n = 2000
    lr = np.concatenate((np.linspace(1.4e-3, 0.0, 1500), np.full(500, 1.4e-3)))
    y = 2.0 * (1 + 0.01 * rng.standard_normal(n))
    y[700:703] = 9.0  # a blip that comes back
    y[1635:] *= 30.0  # then a jump that stays (30x: log scale)
    series = build_series(np.arange(1, n + 1), y, None, lr, lr_key="lr")
    ck = [(s, f"/r/checkpoint-{s}") for s in range(100, 2001, 100)]
    return advise_series(series, ck), series, ck


def gids(artists):
    return [a.get_gid() for a in artists if a.get_gid()]


def test_figure_draws_events_checkpoints_reference_and_lr():
    from checkpoint_strategy.recovery.plot import build_figure

    report, series, ck = _case()
    assert [s.kind for s in report.spikes] == ["spike", "level_shift"]
    fig = build_figure(report, series, ck)
    ax, ax2 = fig.axes
    names = gids(ax.lines) + gids(ax.patches) + gids(ax.collections)
    assert {"raw", "smoothed", "reference", "resume", "post_event", "checkpoints", "band"} <= set(
        names
    )
    events = [g for g in names if g.startswith("event:")]
    assert events == ["event:spike:701", "event:level_shift:1636"]
    ticks = next(c for c in ax.collections if c.get_gid() == "checkpoints")
    assert len(ticks.get_segments()) == 20
    resume = next(line for line in ax.lines if line.get_gid() == "resume")
    assert resume.get_xdata()[0] == report.resume_checkpoint.step == 1600
    post = next(line for line in ax.lines if line.get_gid() == "post_event")
    assert list(post.get_xdata()) == [1700, 1800, 1900, 2000]
    assert ax.get_yscale() == "log"
    assert gids(ax2.lines) == ["lr"]
    assert ax.get_legend() is None and len(fig.legends) == 1  # outside the axes: it covers no data
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "level shift" in labels and "spike" in labels and "post-event: do not resume" in labels
    ref = next(line for line in ax.lines if line.get_gid() == "reference")
    assert ref.get_ydata()[-1] == pytest.approx(report.spike.reference_loss)  # frozen at the onset


def test_axis_labels_name_the_column_once_and_a_flat_lr_gets_a_sane_axis():
    from checkpoint_strategy.recovery.plot import axis_label, build_figure

    assert (
        axis_label("step", "step"),
        axis_label("loss", "loss"),
        axis_label("loss", "train_loss"),
    ) == ("step", "loss", "loss (train_loss)")
    rng = np.random.default_rng(1)
    n = 600
    y = 2.0 * (1 + 0.01 * rng.standard_normal(n))
    y[300:303] = 9.0
    lr = np.full(n, 3e-4) * (1 + 1e-9 * rng.standard_normal(n))  # constant, with float noise
    series = build_series(np.arange(1, n + 1), y, None, lr, lr_key="lr")
    fig = build_figure(advise_series(series, []), series, [])
    ax, ax2 = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("step", "loss")
    assert ax2.get_ylim() == pytest.approx(
        (0.0, 3.3e-4), rel=1e-6
    )  # not a zoom into 1e-13 of noise
    # the legend is outside the plotting area: its box does not overlap the axes' box
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    legend_box = fig.legends[0].get_window_extent(renderer)
    assert legend_box.x0 >= ax.get_window_extent(renderer).x1 - 1


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_cli_writes_a_real_plot_of_sensible_size(tmp_path, capsys, suffix, magic):
    out = tmp_path / f"curve{suffix}"
    rc = main(
        [
            "recover",
            str(REAL),
            "--checkpoints",
            "100,200,300,400,500,600,700,800",
            "--plot",
            str(out),
        ]
    )
    assert rc == 0
    data = out.read_bytes()
    assert data.startswith(magic) and 20_000 < len(data) < 2_000_000
    assert "level shift at step 599" in capsys.readouterr().out


def test_plot_without_matplotlib_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    out = tmp_path / "curve.png"
    assert main(["recover", str(REAL), "--plot", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err.strip().splitlines() == [
        "checkpoint-strategy: error: --plot needs matplotlib, which is not installed: "
        "pip install 'checkpoint-strategy[plot]'"
    ]
    assert main(["tradeoffs", "1000", "1", "100", "--model_size_gb", "1", "--plot", str(out)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[0]
        .endswith(captured.err.strip().split("error: ")[1])
    )


def test_bad_plot_path_is_refused_before_any_work(tmp_path, capsys):
    assert main(["recover", str(REAL), "--plot", str(tmp_path / "curve.gif")]) == 2
    assert "expected a file ending in .png or .svg" in capsys.readouterr().err
    assert main(["recover", str(REAL), "--plot", str(tmp_path / "missing" / "c.png")]) == 2
