"""SIGKILL at random points of a real HF run with HFCheckpointStrategy (the whole process group:
training and its validation worker, as when a job is killed or a node fails; some kills land
while the worker validates or prunes): a valid checkpoint always remains, last_valid_checkpoint
finds it, and the next attempt resumes from it with its optimizer state."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint_strategy.callbacks import last_valid_checkpoint
from checkpoint_strategy.validate import validate_checkpoint

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
PKG_PARENT = str(TESTS.parent / "scripts")

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
import realruns
from transformers import Trainer, TrainerCallback
from checkpoint_strategy.callbacks import HFCheckpointStrategy, last_valid_checkpoint

out, work = sys.argv[1], sys.argv[2]
phase_file = os.path.join(work, "phase")

def phase(name, path, t):       # called as the worker process reports entering a phase
    with open(phase_file, "w") as fh:
        fh.write(f"{name} {os.path.basename(path)}")

class Report(TrainerCallback):
    def on_step_begin(self, args, state, control, optimizer=None, **kw):
        if not getattr(self, "done", False):
            self.done = True
            opt = getattr(optimizer, "optimizer", optimizer)
            st = opt.state_dict()["state"]
            with open(os.path.join(work, "resume.json"), "w") as fh:
                json.dump({"from": resume, "step": state.global_step,
                           "adam_steps": [int(v["step"]) for v in st.values()][:1]}, fh)
        return control

resume = last_valid_checkpoint(out)
cb = HFCheckpointStrategy({"frequency": "every_3_steps", "keep_last": 2, "async_save": True,
                           "keep_milestone": [6]}, handoff_dir=None)
cb.core.phase_hook = phase
cb.core.phase_delay = 0.05       # the worker lingers 50 ms as it enters a phase; the real work follows
args = realruns._training_args(__import__("pathlib").Path(out), max_steps=100000, save_steps=3)
args.logging_steps = 5
trainer = Trainer(model=realruns._tiny_gpt2(), args=args, train_dataset=realruns._TokenDataset(4096, 16, 64),
                  callbacks=[cb, Report()])
trainer.train(resume_from_checkpoint=resume)
"""


def _phase(work: Path) -> str:
    try:
        return (work / "phase").read_text()
    except OSError:
        return ""


def test_ten_sigkills_always_leave_a_valid_checkpoint(tmp_path):
    rng = random.Random(7)
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    script = work / "child.py"
    script.write_text(CHILD)
    env = dict(
        os.environ,
        PYTHONPATH=PKG_PARENT,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    kills, previous, resumes = [], None, 0
    for i in range(10):
        target = ("any", "validate", "prune")[i % 3]
        (work / "phase").unlink(missing_ok=True)
        (work / "resume.json").unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(out), str(work), str(TESTS)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        saves_seen = 0
        try:
            while time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                ph = _phase(work)
                if ph.startswith("validate") and saves_seen == 0:
                    saves_seen = 1
                if saves_seen and (target == "any" or ph.startswith(target + " ")):
                    break
                time.sleep(0.002)
            else:
                pytest.fail("the child made no checkpoint in 300 s")
            time.sleep(rng.uniform(0, 0.03) if target != "any" else rng.uniform(0, 1.5))
            at = _phase(work)
            os.killpg(proc.pid, signal.SIGKILL)  # the training process and its validation worker
        finally:
            proc.wait()
        kills.append(at.split(" ")[0] or "training")
        resumed = (
            json.loads((work / "resume.json").read_text())
            if (work / "resume.json").exists()
            else None
        )
        if (
            previous is not None and resumed is not None
        ):  # this attempt resumed from the last one's survivor
            assert resumed["from"] == previous
            assert resumed["step"] == int(previous.rsplit("-", 1)[1])
            assert resumed["adam_steps"] == [resumed["step"]]  # Adam state restored, not fresh
            resumes += 1
        ckpt = last_valid_checkpoint(out)
        assert ckpt is not None, (
            f"kill {i} ({at!r}) left no valid checkpoint: {sorted(os.listdir(out))}"
        )
        res = validate_checkpoint(ckpt, level="full")
        assert res.status == "valid" and res.resumable
        previous = ckpt
    print("phases at kill:", kills, "resumes checked:", resumes)
    assert kills.count("validate") >= 1 and kills.count("prune") >= 1, kills
    assert resumes >= 7, resumes
