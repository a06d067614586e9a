"""prune --apply against a plain `shutil.rmtree` of the same checkpoints, measured in the same run.

Builds N HF-Trainer-shaped checkpoint folders (real safetensors and torch.save files), then times
(a) rmtree of N-1 copies (the baseline: what deleting costs with no safety at all) and
(b) prune(keep_last=1, apply=True) on an identical folder: listing, quick validation of every
checkpoint, the journal (two fsync'd atomic writes per deletion), rename and removal.

    python bench/bench_prune.py [N] [MB_PER_CHECKPOINT]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))


def _make(template: Path, mb: int) -> None:
    import torch
    from safetensors.torch import save_file

    template.mkdir(parents=True)
    save_file({"w": torch.zeros(mb * (1 << 18))}, str(template / "model.safetensors"))
    torch.save(
        {"state": {0: {"exp_avg": torch.zeros(mb * (1 << 18))}}, "param_groups": []},
        template / "optimizer.pt",
    )
    torch.save({"last_epoch": 1}, template / "scheduler.pt")
    (template / "config.json").write_text(json.dumps({"model_type": "gpt2"}))


def _fill(root: Path, template: Path, n: int) -> None:
    root.mkdir()
    for i in range(1, n + 1):
        dest = root / f"checkpoint-{i * 10}"
        shutil.copytree(template, dest)
        (dest / "trainer_state.json").write_text(
            json.dumps({"global_step": i * 10, "log_history": []})
        )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    mb = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    from checkpoint_strategy.retention import prune

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        _make(base / "template", mb)
        _fill(base / "a", base / "template", n)
        _fill(base / "b", base / "template", n)
        os.sync()
        t0 = time.perf_counter()
        for i in range(1, n):
            shutil.rmtree(base / "a" / f"checkpoint-{i * 10}")
        baseline = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = prune(base / "b", keep_last=1, apply=True, spike_check=False)
        took = time.perf_counter() - t0
        assert report.deleted == n - 1 and report.state == "done", report.state
        _fill(base / "c", base / "template", n)
        t0 = time.perf_counter()
        prune(base / "c", keep_last=1, spike_check=False)
        dry = time.perf_counter() - t0
    print(
        f"{n} checkpoints of {2 * mb} MB: rmtree of {n - 1} {baseline * 1000:.0f} ms (baseline); "
        f"prune --apply {took * 1000:.0f} ms = {took / baseline:.2f}x; dry run (validation only) "
        f"{dry * 1000:.0f} ms = {dry / baseline:.2f}x"
    )


if __name__ == "__main__":
    main()
