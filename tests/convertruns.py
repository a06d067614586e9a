"""Real multi-process checkpoints for the convert tests: torchrun (gloo, CPU), tiny, timeout-bounded.

- `build_dcp_fsdp2(root)`: a 2-process FSDP2 (fully_shard) run saves model + optimizer with
  torch.distributed.checkpoint: `.metadata` + `__0_0.distcp` + `__1_0.distcp`, every parameter a
  DTensor sharded on dim 0; the same script writes the full (unsharded) state dict it saved, with
  torch.save, as the test's reference.
- `build_zero(root, stage, world)`: a DeepSpeed ZeRO run (the recipe of tests/realruns.py's
  build_deepspeed_run, here under torchrun with `world` processes) saves global_step4/.
- `load_dcp_in_run(folder, world)`: loads a DCP folder into a fresh model in a `world`-process run
  (FSDP2 when world > 1) and writes what each rank got, for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from cliresult import checkout_env, run_job

TIMEOUT = 600

DCP_FSDP2 = r"""
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict, StateDictOptions
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))
fully_shard(model[0]); fully_shard(model[2]); fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(3):
    model(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
msd, osd = get_state_dict(model, opt)
dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=sys.argv[1])
full_m, full_o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if dist.get_rank() == 0:
    torch.save({"model": full_m, "optimizer": full_o}, sys.argv[2])
# the job's work is on disk once every rank passes the barrier: flush what it printed, leave without the teardown
# (gloo's threads abort in their destructors under load, 'terminate called without an active exception', twice in
# a row in a loaded CI run; tests/cliresult.end_job)
dist.barrier(); sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
"""

LOAD_DCP = r"""
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))
if world > 1:
    from torch.distributed.fsdp import fully_shard
    fully_shard(model[0]); fully_shard(model[2]); fully_shard(model)
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict, StateDictOptions
sd = get_model_state_dict(model)
dcp.load({"model": sd}, checkpoint_id=sys.argv[1])
set_model_state_dict(model, sd)
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if not dist.is_initialized() or dist.get_rank() == 0:
    torch.save(full, sys.argv[2])
# the job's work is on disk once every rank passes the barrier: flush what it printed, leave without the teardown
# (gloo's threads abort in their destructors under load, 'terminate called without an active exception', twice in
# a row in a loaded CI run; tests/cliresult.end_job)
if dist.is_initialized():
    dist.barrier(); sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
"""

ZERO = r"""
import os, sys
import torch, deepspeed
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": int(sys.argv[2])},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "checkpoint": {"tag_validation": "Fail", "load_universal": False, "use_node_local_storage": False}}
deepspeed.init_distributed(dist_backend="gloo")
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for step in range(1, 5):
    x = torch.randn(4, 8)
    loss = torch.nn.functional.mse_loss(engine(x), x[:, :3])
    engine.backward(loss)
    engine.step()
engine.save_checkpoint(sys.argv[1], tag="global_step4")
# the job's work is on disk once every rank passes the barrier: flush what it printed, leave without the teardown
# (gloo's threads abort in their destructors under load, 'terminate called without an active exception', twice in
# a row in a loaded CI run; tests/cliresult.end_job)
torch.distributed.barrier(); sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
"""


def torchrun(
    root: Path, script: str, args: list[str], world: int, clean: Optional[Path] = None
) -> None:
    """`python -m torch.distributed.run --standalone --nproc-per-node world script args` (CPU, bounded;
    cliresult.run_job: `clean`, the job's output folder, removed before an attempt after gloo's teardown abort; a
    file the job writes whole is overwritten). --standalone: the rendezvous store binds a free port itself (a port
    picked here and bound by torchrun later could be taken by then)."""
    path = root / f"script-{abs(hash(script)) % 10**8}.py"
    path.write_text(script)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        str(path),
        *args,
    ]
    env = checkout_env()
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("MASTER_PORT", None)
    run_job(cmd, "torchrun", timeout=TIMEOUT, env=env, clean=clean)


def build_dcp_fsdp2(root: Path) -> tuple[Path, Path]:
    """(the DCP folder written by 2 FSDP2 ranks, the full state dict torch.save'd by rank 0)."""
    folder, full = root / "dcp-fsdp2" / "step-3", root / "reference-full.pt"
    torchrun(root, DCP_FSDP2, [str(folder), str(full)], 2, folder.parent)
    return folder, full


def build_zero(root: Path, stage: int, world: int) -> Path:
    """global_step4/ of a DeepSpeed ZeRO-`stage` run with `world` processes."""
    folder = root / f"zero{stage}-w{world}"
    torchrun(root, ZERO, [str(folder), str(stage)], world, folder)
    return folder / "global_step4"


def load_dcp_in_run(root: Path, folder: Path, world: int) -> Path:
    """The model state a `world`-process run holds after dcp.load(folder), torch.save'd (full, unsharded)."""
    out = root / f"loaded-w{world}.pt"
    torchrun(root, LOAD_DCP, [str(folder), str(out)], world)
    return out
