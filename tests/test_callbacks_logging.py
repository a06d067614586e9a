"""The callbacks' routine lines (saved / validated / pruned, the end-of-training summary) are seen under
each framework's default logging, the way the framework shows its own progress, and silenced the way
the framework's own lines are (HF: TrainingArguments(log_level=...); Lightning: its logger's level).
Fresh processes: nothing configures logging but the frameworks themselves."""

from __future__ import annotations

import json
import subprocess
import sys

import cliresult
import pytest
from test_callbacks_multiproc import PROGRAM

POLICY = {"frequency": "every_10_steps", "keep_last": 1, "async_save": True}


def run(kind: str, tmp_path, **opts) -> str:
    env = dict(
        cliresult.checkout_env(), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
    )
    opts = {"policy": POLICY, "max_steps": 20, "devices": 1, **opts}
    res = subprocess.run(
        [sys.executable, PROGRAM, kind, str(tmp_path / "out"), str(tmp_path), json.dumps(opts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout + res.stderr


@pytest.mark.parametrize("kind, first", [("hf", "checkpoint-10"), ("pl", "epoch=0-step=10.ckpt")])
def test_routine_lines_visible_under_default_logging(tmp_path, kind, first):
    out = run(kind, tmp_path)
    assert f"checkpoint-strategy: saved {first} (step 10): valid (quick" in out, out[-3000:]
    assert "; pruned " in out
    assert "checkpoint-strategy: end of training: 2 saves validated, 0 invalid, 1 pruned" in out


@pytest.mark.parametrize("kind, opts", [("hf", {"log_level": "warning"}), ("pl", {"quiet": True})])
def test_routine_lines_silenced_with_the_framework(tmp_path, kind, opts):
    out = run(kind, tmp_path, **opts)
    assert "checkpoint-strategy: saved" not in out and "end of training" not in out
