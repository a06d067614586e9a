"""Benchmark: the preemption request's exchange at each step end under 2 processes (callbacks/preempt.py).

Two processes (gloo, CPU, torch.multiprocessing) train a small DDP MLP step by step; at each step end a rank either
does nothing more (the baseline) or asks ``Preemption.at_step_end`` with the exchange on (one all_reduce, max, of a
float64 on the run's process group, bounded by rank_timeout, through callbacks/_dist.Ranks). Rounds alternate the
two, and each is timed on rank 0 (wall per step, median and least of the rounds' medians); the exchange alone is
also timed per call. Prints us per step and the ratio against the baseline step.

Usage: python bench/bench_preempt.py [--steps N] [--rounds R] [--width W] [--step-sleep S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def _rank(
    rank: int, port: int, steps: int, rounds: int, width: int, out: str, sleep: float
) -> None:
    import json

    import torch
    import torch.distributed as dist

    from checkpoint_strategy.callbacks._dist import Ranks
    from checkpoint_strategy.callbacks.preempt import Preemption

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(64, 64)
    pre = Preemption(("SIGUSR1",))
    pre.ranks = Ranks(60.0)
    res: dict = {"with": [], "without": [], "exchange": []}
    for r in range(2 * rounds):
        exchange = r % 2 == 1
        times = []
        for step in range(steps):
            t0 = time.perf_counter()
            loss = ddp(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sleep:
                time.sleep(sleep)  # the CPU idle, as a step waiting for its GPU
            if exchange:
                t1 = time.perf_counter()
                pre.at_step_end(step)
                res["exchange"].append(time.perf_counter() - t1)
            times.append(time.perf_counter() - t0)
        res["with" if exchange else "without"].append(statistics.median(times))
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=256, help="the MLP's hidden width")
    ap.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        help="seconds each step waits with the CPU idle, as a step waiting for its GPU does",
    )
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(prefix="bench-preempt-"), "rank0.json")
    mp.spawn(_rank, args=(port, a.steps, a.rounds, a.width, out, a.step_sleep), nprocs=2, join=True)
    res = json.loads(Path(out).read_text())
    w, wo = min(res["with"]), min(res["without"])
    ex = res["exchange"]
    print(
        f"2 processes (gloo, CPU), DDP MLP 64-{a.width}-1, {a.steps} steps x {a.rounds} rounds each way"
        + (f", each step {a.step_sleep * 1e3:g} ms idle" if a.step_sleep else "")
        + ", rank 0, least of the rounds' median step:"
    )
    print(
        f"  step without the exchange {wo * 1e6:.0f} us, with {w * 1e6:.0f} us = {w / wo:.3f}x "
        f"({(w - wo) * 1e6:+.0f} us/step)"
    )
    print(
        f"  the exchange alone (Preemption.at_step_end, one all_reduce of 1 float64): median "
        f"{statistics.median(ex) * 1e6:.0f} us, p90 {sorted(ex)[int(0.9 * len(ex))] * 1e6:.0f} us per step "
        f"({len(ex)} calls)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
