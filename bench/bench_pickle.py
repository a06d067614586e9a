"""Benchmark: `validate --level quick` of REAL HF Trainer checkpoints against `torch.load(weights_only=True)` of the
pickle files a resume loads (issue 41: target <= 0.10x).

The checkpoints are made by the real transformers Trainer on CPU (tests/realruns.py: the tiny GPT-2, `--steps`
steps, a save every `--save-steps`), so their pickles are what a run writes (an AdamW optimizer.pt, scheduler.pt,
rng_state.pth with numpy's state, training_args.bin), not the near-empty pickles of bench_validate's trees. Measured
by CPU time (process_time), interleaved in one run: each round validates every checkpoint at quick in process, then
torch.loads the files `Trainer._load_from_checkpoint` / `_load_rng_state` load (optimizer.pt, scheduler.pt,
rng_state.pth; the rng state under transformers' own `safe_globals()` as the Trainer loads it), then reads each
archive's data.pkl with the package's pickle reader alone; the least of `--repeat` rounds of each. training_args.bin
is validated but not in the torch.load column: torch.load(weights_only=True) refuses it and a resume does not load it.

    python bench/bench_pickle.py [--repeat 30] [--steps 6] [--save-steps 2] [--scripts PATH] [--model 32x2]

--model: the GPT-2's width and depth, n_embd x n_layer (default 32x2: the tests' tiny model, ~30 K parameters, an
optimizer.pt of 250 kB). The quick level's cost grows with the number of tensors, torch.load's also with their
bytes, so the ratio falls as the model grows: `--model 256x4` (3.2 M parameters, optimizer.pt 25 MB) shows where
a still small real model stands.

--scripts: the package to measure (default: this checkout's scripts/; give another checkout's to measure the code
before a change with the same checkpoints, e.g. a `git worktree add /tmp/main main`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOADED = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


def cpu(fn, n: int = 1) -> float:
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n


def build(root: Path, steps: int, save_steps: int, model: str) -> list[Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    import realruns

    width, depth = (int(x) for x in model.split("x"))
    run = realruns.run_hf_with_kwargs(
        root, {"max_steps": steps, "save_steps": save_steps}, model=(width, depth)
    )
    return [run.folder / name for name in run.names]


def _verdict_store() -> dict:
    """The quick level's verdicts kept by bytes (issue 41's filechecks._SCANNED), emptied before each round: each
    round is a first look at the run, as a user's validate of a run is (within a round the run's byte-identical
    training_args.bin still hits, as it does in a user's)."""
    try:
        from checkpoint_strategy.formats.filechecks import _SCANNED
    except ImportError:  # (a checkout before it)
        return {}
    return _SCANNED


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--save-steps", type=int, default=2)
    ap.add_argument("--scripts", default=str(ROOT / "scripts"))
    ap.add_argument("--model", default="32x2", help="the GPT-2's n_embd x n_layer (default 32x2)")
    ap.add_argument(
        "--keep", help="build the checkpoints here (and reuse them when it already holds some)"
    )
    args = ap.parse_args()
    sys.path.insert(0, args.scripts)
    import torch
    from transformers.trainer_pt_utils import safe_globals

    from checkpoint_strategy.formats import safepickle as tp
    from checkpoint_strategy.validate.engine import validate_checkpoint

    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-pickle-"))
    ckpts = sorted((where / "hf-export").glob("checkpoint-*")) or build(
        where, args.steps, args.save_steps, args.model
    )
    pkls = []
    for c in ckpts:
        assert validate_checkpoint(c, "quick").status == "valid", c
        for f in sorted(c.glob("*.p*")) + sorted(c.glob("*.bin")):
            with zipfile.ZipFile(f) as z:
                pkls.append(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))

    kept = _verdict_store()

    def quick() -> None:
        kept.clear()
        for c in ckpts:
            validate_checkpoint(c, "quick")

    def load() -> None:
        with safe_globals():
            for c in ckpts:
                for name in LOADED:
                    torch.load(c / name, weights_only=True)

    def reader() -> None:
        for data in pkls:
            tp.read_pickle(data)

    best = {"quick": float("inf"), "load": float("inf"), "reader": float("inf")}
    for _ in range(args.repeat):
        for name, fn in (("quick", quick), ("load", load), ("reader", reader)):
            best[name] = min(best[name], cpu(fn))
    n = len(ckpts)
    print(
        f"{n} real HF Trainer checkpoints ({args.scripts}; optimizer.pt {(ckpts[0] / 'optimizer.pt').stat().st_size}"
        f" bytes), least of {args.repeat} interleaved rounds, CPU per "
        f"checkpoint: validate quick {best['quick'] / n * 1e3:.2f} ms, torch.load(weights_only=True) of "
        f"{', '.join(LOADED)} {best['load'] / n * 1e3:.2f} ms, read_pickle of its {len(pkls) // n} data.pkl "
        f"{best['reader'] / n * 1e3:.2f} ms; quick / torch.load = {best['quick'] / best['load']:.3f}x "
        f"(target <= 0.10x), the reader alone {best['reader'] / best['load']:.3f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
