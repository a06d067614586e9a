"""Monte Carlo and tradeoffs sweep timings, each against a baseline measured in the same run.

    python bench/bench_simulate.py [--repeat 5] [--runs 100000]

simulate: 100 000 runs of a 100 000-step plan (target about 2 s on one core). Baseline: numpy
drawing as many exponentials as the simulation drew failure times (runs x event rounds), i.e.
the cheapest possible vectorised Monte Carlo of the same size.
tradeoffs: the default 30 x 10 sweep (target well under a second). Baseline: the planner called
once per point, the floor cost of a sweep that reuses the planner.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from checkpoint_strategy.planning.options import validate_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.simulation.montecarlo import run_monte_carlo, setup_from_plan
from checkpoint_strategy.simulation.sweep import tradeoffs

SEED_RUN = {"total_steps": 100000, "step_seconds": 2.5, "budget_gb": 500, "model_size_gb": 4}
SCENARIOS = {
    # name: (plan arguments, spike rate per 1000 steps, corrupt probability)
    "seed plan (8 GPUs, MTBF 6250 h)": (SEED_RUN, 0.0, 0.0),
    "2048 GPUs (MTBF 24 h), spikes 0.05/1k, 1% corrupt": (dict(SEED_RUN, gpus=2048), 0.05, 0.01),
    "MTBF 2 h, spikes 0.1/1k, 5% corrupt": (dict(SEED_RUN, mtbf_hours=2.0), 0.1, 0.05),
}


def _median(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--runs", type=int, default=100000)
    a = ap.parse_args()
    print(f"simulate: {a.runs} runs of a 100000-step plan, median of {a.repeat}")
    print(
        f"{'scenario':<52} {'events':>7} {'fails/run':>9} {'sim s':>7} {'numpy s':>8} {'x numpy':>8}"
    )
    for name, (args, rate, q) in SCENARIOS.items():
        report = plan(validate_arguments(args))
        setup = setup_from_plan(report, corrupt_prob=q, spike_rate=rate)
        run_monte_carlo(setup, 1000, 0, report.expected_failures)  # warm up
        t_sim, raw = _median(
            lambda: run_monte_carlo(setup, a.runs, 0, report.expected_failures), a.repeat
        )
        draws = a.runs * raw.events  # an upper bound on the exponentials the simulation drew
        rng = np.random.default_rng(0)
        t_base, _ = _median(lambda: (rng.standard_exponential(draws) * setup.M).sum(), a.repeat)
        print(
            f"{name:<52} {raw.events:>7} {raw.failures.mean():>9.3f} {t_sim:>7.3f} {t_base:>8.3f} "
            f"{t_sim / t_base:>8.2f}"
        )
    pargs = validate_arguments(SEED_RUN)
    tradeoffs(pargs)  # warm up (imports)
    t_sweep, rep = _median(lambda: tradeoffs(pargs, spike_rate=0.01), a.repeat)
    points = [(p.frequency_steps, p.keep_last) for p in rep.points]
    t_plans, _ = _median(
        lambda: [
            plan(pargs.model_copy(update={"frequency": f, "keep_last": k})) for f, k in points
        ],
        a.repeat,
    )
    print(
        f"tradeoffs: {len(rep.frequencies)} x {len(rep.keep_last_values)} = {len(points)} points in "
        f"{t_sweep * 1000:.1f} ms; {len(points)} plain plan() calls {t_plans * 1000:.1f} ms; "
        f"ratio {t_sweep / t_plans:.2f}x (target: well under 1 s: {'OK' if t_sweep < 0.5 else 'SLOW'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
