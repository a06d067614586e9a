"""A preemption signal that reaches one rank alone, under 2 processes (callbacks/preempt.py's exchange): HF Trainer
under torchrun and Lightning Trainer(strategy="ddp", devices=2), gloo on CPU, the plain callbacks and the playbooks
(tests/preemptruns.py). SIGUSR1 reaches rank 1 alone at the start of step SIGNAL_STEP: both ranks make the
preemption save at that step and stop, exit 0, rank 0 alone writes the record (the signal's name, "on another
rank"), the checkpoint validates, and the next 2-process launch resumes from it and trains to the end.

Before the exchange, rank 1 went into its save alone while rank 0 trained on into DDP's next all_reduce: a hang
until the grace period ran out twice (HF) and no preemption save; the subprocess timeout here fails that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cliresult
import preemptruns
import pytest
from preemptruns import SIGNAL_STEP, STEPS

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

RUN_TIMEOUT = 200  # a run takes ~30 s on an idle machine; a hang meets this
PROGRAM = str(Path(preemptruns.__file__).resolve())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(kind: str, out: Path, mode: str, signal_step: int) -> tuple[dict, dict, str]:
    """One 2-process launch (hf: torchrun; pl: Lightning starts rank 1), bounded by RUN_TIMEOUT; each rank's
    result and the output (a run gloo's teardown abort ended after both ranks wrote theirs passes)."""
    out.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        (out / f"result-{r}.json").unlink(missing_ok=True)
    port = str(_free_port())
    env = dict(
        cliresult.checkout_env(),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    argv = [PROGRAM, kind, str(out), mode, str(signal_step)]
    if kind == "hf":
        argv = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            port,
            *argv,
        ]
    try:
        res = subprocess.run(
            [sys.executable, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the 2-process {kind} {mode} run did not end within {RUN_TIMEOUT} s: {exc}")
    done = all((out / f"result-{r}.json").exists() for r in (0, 1))
    assert res.returncode == 0 or (done and cliresult.TEARDOWN_ABORT in res.stderr), res.stderr[
        -4000:
    ]
    r0, r1 = (json.loads((out / f"result-{r}.json").read_text()) for r in (0, 1))
    return r0, r1, res.stdout + res.stderr


def _checkpoint(kind: str, out: Path, step: int) -> Path:
    if kind == "hf":
        return out / f"checkpoint-{step}"
    (path,) = out.glob(f"epoch=*-step={step}.ckpt")
    return path


@pytest.mark.parametrize("mode", ["plain", "playbook"])
@pytest.mark.parametrize("kind", ["hf", "pl"])
def test_sigusr1_to_rank_1_alone_saves_on_every_rank_at_one_step_stops_and_the_rerun_resumes(
    tmp_path, kind, mode
):
    from checkpoint_strategy.callbacks import last_valid_checkpoint
    from checkpoint_strategy.callbacks.preempt import read_record
    from checkpoint_strategy.validate import validate_checkpoint

    out = tmp_path / "out"
    r0, r1, text = launch(kind, out, mode, SIGNAL_STEP)
    path = _checkpoint(kind, out, SIGNAL_STEP)
    for r in (r0, r1):
        assert r["broken"] is None, r["broken"]  # no meeting of the ranks timed out
        assert r["first"] == 1 and r["last"] == r["global_step"] == SIGNAL_STEP, r
        assert r["preempted"]["step"] == SIGNAL_STEP
        assert r["preempted"]["checkpoint"] == str(path)
    assert r1["preempted"]["signal"] == "SIGUSR1"
    assert r0["preempted"]["signal"] == "SIGUSR1 on another rank"
    assert read_record(out) == r0["preempted"]  # written once, by rank 0
    assert validate_checkpoint(path, "quick").status == "valid"
    assert last_valid_checkpoint(out) == str(path)
    assert text.count(f"preemption save {path.name} (step {SIGNAL_STEP})") == 2  # one line a rank

    r0, r1, _ = launch(kind, out, mode, 0)  # the next launch resumes from it
    for r in (r0, r1):
        assert r["resumed_from"] == str(path) and r["preempted"] is None, r
        assert r["first"] == SIGNAL_STEP + 1 and r["last"] == r["global_step"] == STEPS, r
