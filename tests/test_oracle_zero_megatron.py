"""The framework's own loader is the oracle for DeepSpeed ZeRO 1-3, DeepSpeed's universal checkpoint and Megatron-LM
(issue 40; the harness and the other formats: tests/test_oracle_mutations.py).

Each checkpoint is a run folder holding one saved step and the framework's resume pointer (`latest`,
`latest_universal`, `latest_checkpointed_iteration.txt`), mutated with fixed seeds (single-bit flips and
truncations in every region of every file: zip local headers, pickles, records, tensor data, central directory, end
records, and the pointer file). The oracles:

- ZeRO 1, 2, 3 (a real DeepSpeed run on CPU, gloo): DeepSpeed's `zero_to_fp32`
  (`get_fp32_state_dict_from_zero_checkpoint(run)`, which follows `latest`), DeepSpeed's own resume (an engine of
  the run's model and stage, started once in a subprocess, `load_checkpoint(run)` after every mutation) and
  `torch.load(weights_only=True)` of every file of the step (with DeepSpeed's own classes the unmutated files hold
  allowed: `LossScaler`, `ZeroStageEnum`, `fragment_address`).
- universal (DeepSpeed's `ds_to_universal` on the ZeRO-2 run): DeepSpeed's universal loader itself, a DeepSpeed engine
  started once in a subprocess with `checkpoint.load_universal` and asked to `load_checkpoint(run)` after every
  mutation (it follows `latest_universal`, reads the model states, `zero/optimizer_state.pt` and every
  `zero/<param>/*.pt`); plus `torch.load(weights_only=True)` of every file as for ZeRO.
- Megatron-LM: megatron-core is not installed here (and its legacy `torch` checkpoint format is written by
  Megatron-LM's training code, not by the megatron-core package), so the layout is saved with torch exactly as
  Megatron-LM's `save_checkpoint` (`--ckpt-format torch`) writes it: `iter_0000003/mp_rank_00/model_optim_rng.pt`
  holding `args` (an argparse.Namespace), `checkpoint_version` 3.0, `iteration`, `model`, `optimizer`,
  `opt_param_scheduler`, `rng_state` (python, numpy and torch generator states) and
  `num_floating_point_operations_so_far`, and `latest_checkpointed_iteration.txt` holding `str(iteration)`. The
  oracle does what Megatron-LM's `load_checkpoint` does: parse the tracker (`int(text.strip())`, else "release"),
  `torch.load(weights_only=False)` (tests only; the package never loads) and restore model (strict), optimizer and
  the three generators.

Our verdict is `validate_paths([run])` at full and deep: invalid when any checkpoint it reports (the step, or the
one the pointer names) is invalid or incomplete.
"""

from __future__ import annotations

import argparse
import random
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import realruns
from cliresult import checkout_env
from test_oracle_mutations import (  # noqa: F401
    Region,
    Subject,
    assert_rule,
    record,
    run_mutations,
    whole,
    zip_regions,
)

from checkpoint_strategy.validate.engine import validate_paths

pytest.importorskip(
    "deepspeed",
    reason="DeepSpeed is in the frameworks extra: pip install --no-build-isolation "
    "deepspeed (or pip install -e '.[test,frameworks]')",
)

SKIP = {
    "zero_to_fp32.py",
    "zero_to_torch.py",
}  # DeepSpeed's scripts copied beside the steps: not the checkpoint


def run_status(run: Path, level: str) -> str:
    """invalid/incomplete when any checkpoint validate_paths reports under the run folder is; else valid."""
    statuses = {r.status for r in validate_paths([str(run)], level).checkpoints}
    return next((s for s in ("invalid", "incomplete") if s in statuses), "valid")


def regions_of(run: Path) -> list[Region]:
    regions: list[Region] = []
    for p in sorted(x for x in run.rglob("*") if x.is_file() and x.name not in SKIP):
        rel, data = str(p.relative_to(run)), p.read_bytes()
        regions += (
            zip_regions(rel, data)
            if data[:4] == b"PK\x03\x04"
            else whole(rel, data, f"pointer {p.name}")
        )
    return regions


def _deepspeed_globals() -> list:
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def load_every_file(folder: Path) -> None:
    """torch.load(weights_only=True) of every .pt under folder, DeepSpeed's own classes allowed."""
    import torch

    with torch.serialization.safe_globals(_deepspeed_globals()):
        for p in sorted(folder.rglob("*.pt")):
            torch.load(p, weights_only=True, map_location="cpu")


def zero_oracle(run: Path) -> None:
    import contextlib
    import io

    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()):
        get_fp32_state_dict_from_zero_checkpoint(str(run))
    load_every_file(run / "global_step6")


def _zero_run(tmp_path_factory, stage: int, universal: bool = False) -> Path:
    built = realruns.build_deepspeed_run(
        tmp_path_factory.mktemp(f"oracle-zero{stage}"), stage=stage
    )
    shutil.rmtree(built / "global_step3")
    if not universal:
        return built
    realruns.build_deepspeed_universal(built)
    run = built.parent / "universal"
    run.mkdir()
    shutil.move(built / "global_step6_universal", run / "global_step6_universal")
    shutil.move(built / "latest_universal", run / "latest_universal")
    return run


# (pytest -n: each DeepSpeed build on one worker, as in a serial run)
ZERO_GROUP = pytest.mark.xdist_group("oracle-zero")
UNIVERSAL_GROUP = pytest.mark.xdist_group("oracle-universal")


@pytest.fixture(scope="session", params=[1, 2, 3])
def oracle_zero(request, tmp_path_factory):
    run = _zero_run(tmp_path_factory, request.param)
    loader = EngineLoader(run.parent, request.param)

    def oracle(path: Path) -> None:
        zero_oracle(path)
        loader(path)

    yield Subject(run, regions_of(run), oracle, run_status)
    loader.close()


# One process: MASTER_PORT 0 has the store bind a free port itself (a port picked by the test and bound seconds later,
# after the imports, could be taken by then; as tests/realruns.py's DeepSpeed run does).
ENGINE_LOADER = r"""
import os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import logging, torch, deepspeed
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": int(sys.argv[1])},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "checkpoint": {"load_universal": sys.argv[2] == "universal", "use_node_local_storage": False}}
deepspeed.init_distributed(dist_backend="gloo")
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
logging.disable(logging.CRITICAL)
print("READY", flush=True)
for line in sys.stdin:
    try:
        path, _client = engine.load_checkpoint(line.strip())
        answer = "ok" if path is not None else "refused: nothing loaded"
    except BaseException as exc:
        answer = "refused: " + type(exc).__name__
    print(answer, flush=True)
"""


class EngineLoader:
    """A DeepSpeed engine of the run's model (ZeRO `stage`; `universal`: checkpoint.load_universal) in a
    subprocess: load(run) -> None, or raises when the engine's load_checkpoint (a resume: module, optimizer and
    scheduler state, following `latest` / `latest_universal`) refuses it (an exception, or nothing loaded).
    Restarted when an answer takes over 60 s."""

    def __init__(self, root: Path, stage: int, universal: bool = False) -> None:
        self.root, self.stage, self.universal = root, stage, universal
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        script = self.root / "engine_loader.py"
        script.write_text(ENGINE_LOADER)
        env = checkout_env()
        env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(self.stage),
                "universal" if self.universal else "zero",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=self.root,
        )
        assert self._answer(600) == "READY", "the DeepSpeed engine did not start"

    def _answer(self, timeout: float) -> str:
        """The next answer line (DeepSpeed's own log lines on stdout skipped); "timeout", or "" when it died."""
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else "timeout"
            if not line or line.startswith(("READY", "ok", "refused", "timeout")):
                return line.strip()

    def __call__(self, run: Path) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"{run}\n")
        self.proc.stdin.flush()
        answer = self._answer(60)
        if answer == "timeout" or not answer:
            self.close()
        if answer != "ok":
            raise RuntimeError(f"DeepSpeed's load_checkpoint: {answer or 'the loader died'}")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="session")
def oracle_universal(tmp_path_factory):
    run = _zero_run(tmp_path_factory, 2, universal=True)
    loader = EngineLoader(run.parent, 2, universal=True)

    def oracle(path: Path) -> None:
        loader(path)
        load_every_file(path / "global_step6_universal")

    yield Subject(run, regions_of(run), oracle, run_status)
    loader.close()


# --------------------------------------------------------------------------- Megatron-LM (--ckpt-format torch)


def _megatron_model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(32, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 32)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def build_megatron_run(root: Path, iteration: int = 3) -> Path:
    """Megatron-LM's save_checkpoint (legacy `torch` format, TP = PP = 1), by hand: what generate_state_dict puts
    in model_optim_rng.pt, saved with torch.save, then the tracker file written as str(iteration)."""
    import numpy as np
    import torch

    model, opt = _megatron_model()
    random.seed(0)
    np.random.seed(0)
    for _ in range(iteration):
        model(torch.randint(0, 32, (2, 5))).sum().backward()
        opt.step()
        opt.zero_grad()
    args = argparse.Namespace(
        num_layers=1,
        hidden_size=16,
        padded_vocab_size=32,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        lr=1e-3,
        save_interval=iteration,
        iteration=iteration,
        consumed_train_samples=iteration * 2,
        ckpt_format="torch",
    )
    state = {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": iteration,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "opt_param_scheduler": {
            "max_lr": 1e-3,
            "lr_warmup_steps": 0,
            "num_steps": iteration * 2,
            "lr_decay_style": "cosine",
            "lr_decay_steps": 100,
            "min_lr": 0.0,
        },
        "rng_state": [
            {
                "random_rng_state": random.getstate(),
                "np_rng_state": np.random.get_state(),
                "torch_rng_state": torch.get_rng_state(),
                "rng_tracker_states": {},
            }
        ],
        "num_floating_point_operations_so_far": 12345,
    }
    run = root / "megatron"
    folder = run / f"iter_{iteration:07d}" / "mp_rank_00"
    folder.mkdir(parents=True)
    torch.save(state, folder / "model_optim_rng.pt")
    (run / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return run


def megatron_oracle(run: Path) -> None:
    """Megatron-LM's load_checkpoint: read_metadata, then torch.load, then restore model, optimizer and RNGs."""
    import numpy as np
    import torch

    text = (run / "latest_checkpointed_iteration.txt").read_text().strip()
    try:
        iteration = int(text)
    except ValueError:
        if text != "release":
            raise
        raise ValueError("release checkpoints are not in this test") from None
    state = torch.load(
        run / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt",
        map_location="cpu",
        weights_only=False,
    )  # (Megatron's own call; the package never loads)
    assert state["iteration"] == iteration or state["iteration"] >= 0
    model, opt = _megatron_model()
    model.load_state_dict(state["model"], strict=True)
    opt.load_state_dict(state["optimizer"])
    rng = state["rng_state"][0]
    random.setstate(rng["random_rng_state"])
    np.random.set_state(rng["np_rng_state"])
    torch.set_rng_state(rng["torch_rng_state"])


@pytest.fixture(scope="session")
def oracle_megatron(tmp_path_factory) -> Subject:
    run = build_megatron_run(tmp_path_factory.mktemp("oracle-megatron"))
    return Subject(run, regions_of(run), megatron_oracle, run_status)


# --------------------------------------------------------------------------- the rule, per format


def _rule(subject: Subject, name: str, counts: dict) -> None:
    subject.oracle(subject.path)  # the unmutated checkpoint loads
    for level in ("full", "deep"):
        assert run_status(subject.path, level) == "valid", level
    assert_rule(name, run_mutations(subject), counts)


@ZERO_GROUP
def test_every_zero_mutation_the_loader_refuses_is_invalid_at_full_and_deep(
    oracle_zero,
    request,
    record,  # noqa: F811
):
    _rule(oracle_zero, f"zero{request.node.callspec.params['oracle_zero']}", record)


@pytest.mark.parametrize(
    "fixture", [pytest.param("oracle_universal", marks=UNIVERSAL_GROUP), "oracle_megatron"]
)
def test_every_mutation_the_loader_refuses_is_invalid_at_full_and_deep(fixture, request, record):  # noqa: F811
    _rule(request.getfixturevalue(fixture), fixture.removeprefix("oracle_"), record)


# --------------------------------------------------------------------------- what the oracles found


def _refused(oracle, path: Path) -> bool:
    try:
        oracle(path)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - any refusal of the framework's loader
        return True
    return False


@pytest.mark.parametrize("text", ["", "\x13", "3a", "relase"])
def test_a_megatron_tracker_that_is_no_iteration_is_invalid(
    oracle_megatron, tmp_path, text, cli_run
):
    """Megatron-LM's read_metadata exits on a tracker that is neither int(text) nor 'release' (the oracle found
    a flipped or truncated tracker VALID at every level: the pointer was skipped)."""
    run = tmp_path / "megatron"
    shutil.copytree(oracle_megatron.path, run)
    (run / "latest_checkpointed_iteration.txt").write_text(text)
    assert _refused(megatron_oracle, run)
    for level in ("quick", "full", "deep"):
        assert run_status(run, level) == "invalid", level
    r = cli_run("validate", str(run), "--format", "json")
    assert r.rc == 1
    (bad,) = [c for c in r.json()["checkpoints"] if c["status"] != "valid"]
    assert bad["path"].endswith("latest_checkpointed_iteration.txt")
    assert "resume pointer names no checkpoint" in bad["problems"][0]["reason"]


@ZERO_GROUP
@pytest.mark.parametrize("text", ["", "\n", ".", ".."])
def test_a_deepspeed_latest_that_names_no_tag_is_invalid(oracle_zero, tmp_path, text):
    run = tmp_path / "deepspeed"
    shutil.copytree(oracle_zero.path, run)
    (run / "latest").write_text(text)
    assert _refused(zero_oracle, run)
    assert run_status(run, "full") == "invalid"


def test_a_megatron_tracker_naming_a_missing_iteration_is_incomplete_and_release_is_left_alone(
    oracle_megatron, tmp_path
):
    run = tmp_path / "megatron"
    shutil.copytree(oracle_megatron.path, run)
    (run / "latest_checkpointed_iteration.txt").write_text("2")
    assert _refused(megatron_oracle, run)
    assert run_status(run, "full") == "incomplete"
    (run / "latest_checkpointed_iteration.txt").write_text("release\n")
    assert run_status(run, "full") == "valid"
