#!/usr/bin/env python3
"""Build the README's example inputs: a small, deterministic training run that hit a loss spike.

    python3 examples/make-example-run.py example-run && cd example-run

writes (standard library only, under a second, about 100 KB; the same bytes every time):

- ``train.jsonl``: the run's training log (JSON lines, steps 10-3000): the loss settles near 1.24, then a
  level shift at step 2110 triples it and it does not come back.
- ``run/checkpoint-{1000,2000,2500,3000}/``: Hugging Face Trainer checkpoint folders as the Trainer writes them:
  ``model.safetensors`` and ``config.json`` (what a release ships), and the training state
  (``optimizer.pt`` with Adam moments, ``scheduler.pt``, ``rng_state.pth``, ``training_args.bin``: torch zip
  archives, written here byte by byte, which ``torch.load`` reads) and ``trainer_state.json`` (the log so far).
  The two checkpoints after step 2110 hold spiked weights.
- ``resumed.jsonl``: the log of the run resumed from checkpoint-2000 (the old segment, then the restart).
- ``events.json``: two LOSS_SPIKE events, as training-stability-monitor sends them.
- ``damaged/checkpoint-{10,20,30,40}/``: a second run whose checkpoint-30 was cut short by an interrupted save.

The checkpoints are tiny on purpose (one 4-value weight): checkpoint-strategy reads the files' structure,
never their size. ``tests/test_examples.py`` runs every README example on this folder and compares the output
with its golden file.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import struct
import sys
import zipfile
from pathlib import Path

STEPS = (1000, 2000, 2500, 3000)
SPIKE_AT = 2101  # the first logged step of the level shift is 2110
LR = 3e-4


def loss(step: int, rng: random.Random, spike_at: int | None) -> float:
    value = (1.2 + 1.3 * math.exp(-step / 600)) * (1 + rng.gauss(0, 0.01))
    return round(value * (3.0 if spike_at is not None and step >= spike_at else 1.0), 4)


def logs() -> tuple[list[dict], list[dict]]:
    """(the run's log, the resumed run's log: the old segment to 2200, then the restart at 2010)."""
    rng = random.Random(0)
    rows = [
        {"step": s, "loss": loss(s, rng, SPIKE_AT), "learning_rate": LR}
        for s in range(10, 3001, 10)
    ]
    rng = random.Random(1)
    first = [
        {"step": s, "loss": loss(s, rng, None), "learning_rate": LR} for s in range(10, 2201, 10)
    ]
    again = [
        {"step": s, "loss": loss(s, rng, None), "learning_rate": LR} for s in range(2010, 2301, 10)
    ]
    return rows, first + again


# ---------------------------------------------------------------------------------------------------- safetensors


def safetensors(values: list[float]) -> bytes:
    header = json.dumps(
        {
            "w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]},
            "__metadata__": {"format": "pt"},
        }
    ).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(values)}f", *values)


# ---------------------------------------------------------------------------------- torch zip archives, by hand
# A torch.save file is a zip of <name>/data.pkl (a protocol-2 pickle whose tensors point at storages by a
# persistent id), <name>/data/<key> (the raw storage bytes), <name>/version and <name>/byteorder.


class Tensor:
    def __init__(self, kind: str, fmt: str, values: list) -> None:
        self.kind, self.fmt, self.values = kind, fmt, values  # e.g. FloatStorage, "<f"


class Obj:
    """A pickled instance (GLOBAL, NEWOBJ, BUILD): what torch.save writes for TrainingArguments."""

    def __init__(self, module: str, name: str, state: dict) -> None:
        self.module, self.name, self.state = module, name, state


class Pickle:
    """A protocol-2 pickle of dicts, lists, tuples, numbers, strings, tensors and instances (no memo)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.storages: list[bytes] = []

    def glob(self, module: str, name: str) -> None:
        self.out += b"c" + f"{module}\n{name}\n".encode()

    def dump(self, obj) -> bytes:
        self.save(obj)
        return bytes(self.out + b".")

    def save(self, obj) -> None:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            self.scalar(obj)
        elif isinstance(obj, (list, tuple, dict)):
            self.container(obj)
        elif isinstance(obj, Tensor):
            self.tensor(obj)
        else:
            self.glob(obj.module, obj.name)
            self.out += b")\x81"  # EMPTY_TUPLE NEWOBJ
            self.save(obj.state)
            self.out += b"b"  # BUILD

    def scalar(self, obj) -> None:
        if obj is None:
            self.out += b"N"
        elif isinstance(obj, bool):
            self.out += b"\x88" if obj else b"\x89"
        elif isinstance(obj, int):
            self.out += b"J" + struct.pack("<i", obj)
        elif isinstance(obj, float):
            self.out += b"G" + struct.pack(">d", obj)
        else:
            self.out += self._str(obj)

    def container(self, obj) -> None:
        if isinstance(obj, dict):
            self.out += b"}("
            for key, value in obj.items():
                self.save(key)
                self.save(value)
            self.out += b"u"
            return
        self.out += b"(" if isinstance(obj, tuple) else b"]("
        for item in obj:
            self.save(item)
        self.out += b"t" if isinstance(obj, tuple) else b"e"

    def tensor(self, t: Tensor) -> None:
        key = str(len(self.storages))
        self.storages.append(struct.pack("<" + t.fmt[-1] * len(t.values), *t.values))
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.out += b"((" + self._str("storage")
        self.glob("torch", t.kind)
        self.out += (
            self._str(key) + self._str("cpu") + b"J" + struct.pack("<i", len(t.values)) + b"tQ"
        )
        shape = () if len(t.values) == 1 and t.fmt.startswith("scalar") else (len(t.values),)
        self.save(0)
        self.save(shape)
        self.save((1,) if shape else ())
        self.save(False)
        self.glob("collections", "OrderedDict")
        self.out += b")RtR"  # OrderedDict(), close the args tuple, call _rebuild_tensor_v2

    @staticmethod
    def _str(text: str) -> bytes:
        return b"X" + struct.pack("<I", len(text)) + text.encode()


def torch_zip(name: str, obj) -> bytes:
    pickle = Pickle()
    data = pickle.dump(obj)
    entries = [
        ("data.pkl", data),
        ("byteorder", b"little"),
        *((f"data/{i}", raw) for i, raw in enumerate(pickle.storages)),
        ("version", b"3\n"),
    ]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for entry, raw in entries:
            z.writestr(zipfile.ZipInfo(f"{name}/{entry}", date_time=(1980, 1, 1, 0, 0, 0)), raw)
    return buf.getvalue()


def hf_checkpoint(folder: Path, step: int, history: list[dict]) -> None:
    """One checkpoint-N folder with every file the HF Trainer writes (tiny values, real formats)."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = [round(0.5 + 0.1 * i + step / 10000, 4) for i in range(4)]
    if step > SPIKE_AT:
        weights = [3 * w for w in weights]
    (folder / "model.safetensors").write_bytes(safetensors(weights))
    (folder / "config.json").write_text(
        json.dumps(
            {"architectures": ["ExampleModel"], "model_type": "example", "hidden_size": 4}, indent=2
        )
        + "\n"
    )
    moments = {
        "step": Tensor("FloatStorage", "scalar<f", [float(step)]),
        "exp_avg": Tensor("FloatStorage", "<f", [w / 100 for w in weights]),
        "exp_avg_sq": Tensor("FloatStorage", "<f", [w * w / 1e4 for w in weights]),
    }
    group = {
        "lr": LR,
        "betas": (0.9, 0.999),
        "eps": 1e-08,
        "weight_decay": 0.0,
        "amsgrad": False,
        "foreach": None,
        "maximize": False,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "params": [0],
    }
    (folder / "optimizer.pt").write_bytes(
        torch_zip("optimizer", {"state": {0: moments}, "param_groups": [group]})
    )
    (folder / "scheduler.pt").write_bytes(
        torch_zip(
            "scheduler",
            {
                "base_lrs": [LR],
                "last_epoch": step,
                "_step_count": step + 1,
                "_last_lr": [LR],
                "lr_lambdas": [None],
            },
        )
    )
    (folder / "rng_state.pth").write_bytes(
        torch_zip(
            "rng_state",
            {"cpu": Tensor("ByteStorage", "<B", [(step * 7 + i) % 256 for i in range(16)])},
        )
    )
    (folder / "training_args.bin").write_bytes(
        torch_zip(
            "training_args",
            Obj(
                "transformers.training_args",
                "TrainingArguments",
                {
                    "output_dir": "run",
                    "save_steps": 500,
                    "learning_rate": LR,
                    "max_steps": 3000,
                    "seed": 42,
                },
            ),
        )
    )
    (folder / "trainer_state.json").write_text(
        json.dumps(
            {"global_step": step, "max_steps": 3000, "save_steps": 500, "log_history": history}
        )
    )


def damaged(folder: Path) -> None:
    for step in (10, 20, 30, 40):  # checkpoint-30's weights cut short, as by an interrupted save
        target = folder / f"checkpoint-{step}" / "model.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(safetensors([float(i) for i in range(64)]))
        (target.parent / "trainer_state.json").write_text(
            json.dumps({"global_step": step, "log_history": []})
        )
        if step == 30:
            target.write_bytes(target.read_bytes()[:-100])


def build(folder: Path) -> None:
    """Write the example inputs into `folder` (created; existing example files are overwritten)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, resumed = logs()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "resumed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in resumed))
    for step in STEPS:
        hf_checkpoint(
            folder / "run" / f"checkpoint-{step}", step, [r for r in rows if r["step"] <= step]
        )
    damaged(folder / "damaged")
    (folder / "events.json").write_text(
        json.dumps(
            [
                {"event": "LOSS_SPIKE", "step": 2110, "magnitude": 3.1, "severity": "critical"},
                {"event": "LOSS_SPIKE", "step": 2210, "magnitude": 3.0, "severity": "critical"},
            ]
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the README's example run (tiny, deterministic)."
    )
    parser.add_argument(
        "folder", nargs="?", default="example-run", help="where to write it (default example-run)"
    )
    args = parser.parse_args(argv)
    try:
        build(Path(args.folder))
    except OSError as exc:
        print(
            f"make-example-run: error: cannot write {args.folder}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    print(
        f"wrote {args.folder}/: train.jsonl, resumed.jsonl, events.json, run/ (4 checkpoints), damaged/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
