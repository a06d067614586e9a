"""Requests for a quick `validate` of a 1,000-checkpoint prefix on S3 (issue 15), counted by the server.

moto's S3 server runs on 127.0.0.1 (tests/objectstore.py counts every HTTP request it answers); the
prefix holds N HF-Trainer-like checkpoints (model.safetensors, optimizer.pt, trainer_state.json,
config.json). Baseline, measured in the same run: a plain ``fs.find`` of the same prefix (the listing
alone). Printed: both request counts, their ratio, requests per checkpoint and the bytes served
against the bytes stored. Not a timed test.

    python bench/bench_s3.py [--checkpoints 1000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))


def _objects() -> dict[str, bytes]:
    import torch
    from safetensors.torch import save

    opt = io.BytesIO()
    torch.save(
        {
            "state": {0: {"exp_avg": torch.zeros(64), "exp_avg_sq": torch.zeros(64)}},
            "param_groups": [{"params": [0]}],
        },
        opt,
    )
    return {
        "model.safetensors": save({"w": torch.zeros(64)}),
        "optimizer.pt": opt.getvalue(),
        "config.json": b'{"model_type": "gpt2"}',
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    n = parser.parse_args().checkpoints

    import objectstore

    from checkpoint_strategy.cli.main import main as cli

    server = objectstore.start()
    try:
        fs = objectstore.s3fs_client(server.endpoint)
        fs.mkdir("bench")
        files = _objects()
        stored = 0
        for i in range(1, n + 1):
            state = json.dumps(
                {"global_step": i * 10, "log_history": [{"step": i * 10, "loss": 1.0}]}
            ).encode()
            for name, data in {**files, "trainer_state.json": state}.items():
                fs.pipe_file(f"bench/run/checkpoint-{i * 10}/{name}", data)
                stored += len(data)
        objects = n * (len(files) + 1)

        server.reset()
        listed = len(objectstore.s3fs_client(server.endpoint).find("bench/run"))
        baseline = server.counts["total"]
        assert listed == objects, (listed, objects)

        server.reset()
        started = time.perf_counter()
        with open(os.devnull, "w") as sink:
            old, sys.stdout = sys.stdout, sink
            try:
                rc = cli(["validate", "s3://bench/run", "--format", "json"])
            finally:
                sys.stdout = old
        seconds = time.perf_counter() - started
        counts = dict(server.counts)
    finally:
        server.stop()
    quick = counts["total"]
    print(f"prefix: {n} checkpoints, {objects} objects, {stored / 1e6:.1f} MB stored")
    print(f"baseline fs.find:           {baseline} requests")
    print(
        f"validate --level quick:     {quick} requests (rc {rc}; {counts.get('list', 0)} listing, "
        f"{counts.get('range', 0)} ranged GETs, {counts.get('get', 0)} other GETs, {counts.get('head', 0)} HEAD)"
    )
    print(f"ratio quick / find:         {quick / baseline:.0f}x")
    print(
        f"requests per checkpoint:    {quick / n:.2f} ({(quick - counts.get('list', 0)) / objects:.2f} per object "
        "beyond the listing)"
    )
    print(f"bytes of ranged GETs / stored: {counts.get('bytes_out', 0) / stored:.2f}")
    print(f"(wall time, not a measure:  {seconds:.1f} s through a local moto server)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
