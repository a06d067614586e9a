"""What real framework checkpoints say about themselves, read from their own metadata files.

Kept apart from the checker table in validate.py: each function takes already-read metadata
(parsed JSON, or the top-level keys of a DCP `.metadata`) and answers one question.

Checked against real saves made in tests/test_export_frameworks.py (HF training_args.bin: a 2-process torchrun save
in tests/test_checkpoints_ranks.py):
  orbax-checkpoint 0.12.8  <step>/<item>/_METADATA: {"tree_metadata": {"('opt', 'mu')": {"key_metadata":
                           [{"key": "opt", ...}, ...]}, ...}}; an unfinished save is <step>.orbax-checkpoint-tmp
  torchtitan               step-N/.metadata top-level keys: model FQNs (flattened) plus optimizer,
                           lr_scheduler, dataloader, train_state for a full save; model FQNs only for the
                           model-only final save (checkpoint.last_save_model_only, default true since 0.2)
"""

from __future__ import annotations

import re

_OPTIMIZER_KEY = re.compile(r"^(opt|opt_state|optimizer|optimizer_state|optim|optim_state)$", re.I)
TORCHTITAN_TRAIN_KEYS = ("optimizer", "lr_scheduler", "train_state", "dataloader")
#: the top-level keys of a checkpoint dict that hold optimizer state (Lightning "optimizer_states", a plain loop's
#: "optimizer" / "optimizer_state_dict", ...) and those that hold the weights (a state dict under "state_dict",
#: "model", DeepSpeed's "module", ...): the quick level tells resumable from these, deep and convert read by them
OPTIM_KEYS = ("optimizer", "optimizer_states", "optimizer_state_dict", "optim", "opt_state", "optimizer_state")
WEIGHT_KEYS = ("state_dict", "model", "module", "model_state_dict", "model_state")


def orbax_item_has_optimizer(metadata: object) -> bool:
    """True when an Orbax item's _METADATA tree has a top-level optimizer-state key."""
    if not isinstance(metadata, dict):
        return False
    tree = metadata.get("tree_metadata")
    if not isinstance(tree, dict):
        return False
    for entry in tree.values():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        if isinstance(keys, list) and keys and isinstance(keys[0], dict):
            first = keys[0].get("key")
            if isinstance(first, str) and _OPTIMIZER_KEY.match(first):
                return True
    return False


def torchtitan_marked(keys: set[str]) -> bool:
    """torchtitan's own markers among a DCP .metadata's top-level keys: its TrainState saved as "train_state"
    (step, loss history) beside a model flattened to the top level (no "model" key; CheckpointManager.
    _flattened_model_states_sd). A plain loop's save ({"model": ..., "optimizer": ...}, or {"app": ...})
    has neither, whatever its folders are called."""
    return "train_state" in keys and "model" not in keys and "app" not in keys


def torchtitan_model_only_reason(keys: set[str], step: int | None) -> str | None:
    """The reason a torchtitan step-N cannot resume training, or None when it holds the training state."""
    if not keys or any(k in keys for k in TORCHTITAN_TRAIN_KEYS):
        return None
    name = f"step-{step}" if step is not None else "this step"
    return (f"not resumable: {name} holds model weights only (no optimizer, lr_scheduler or train_state in "
            ".metadata); torchtitan writes the final save model-only when checkpoint.last_save_model_only is "
            "true (its default since 0.2): resume from the previous full step-N, and set "
            "last_save_model_only = false for future runs")


# --------------------------------------------------------------------------- HF Trainer

def hf_args_world_size(root: object) -> int | None:
    """The number of processes an HF Trainer save was made by, from its training_args.bin read as data: the
    TrainingArguments pickle holds accelerate's PartialState as ``distributed_state`` (transformers 4.3x-5.x),
    whose ``num_processes`` is the world size (rank 0 writes the file, first of the save). None when not
    recorded (an older transformers, a hand-made file)."""
    state = getattr(root, "state", None)
    dist = state.get("distributed_state") if isinstance(state, dict) else None
    dist_state = getattr(dist, "state", None)
    n = dist_state.get("num_processes") if isinstance(dist_state, dict) else None
    return n if type(n) is int and 0 < n < 1_000_000 else None


# --------------------------------------------------------------------------- DeepSpeed

MAX_MODEL_STATES_PICKLE = 64 << 20


def deepspeed_zero_layout(data_pkl: bytes) -> tuple[int | None, int | None]:  # noqa: C901 - complexity debt, see issue 10
    """(ZeRO stage, data-parallel world size) from mp_rank_XX_model_states.pt's data.pkl, read as opcodes.

    DeepSpeed 0.19.8 stores `dp_world_size` and the whole `ds_config` (with `zero_optimization.stage`) in
    the model states; (None, None) when they cannot be read. Nothing is unpickled."""
    import pickletools

    tokens: list[object] = []
    memo: dict[int, object] = {}
    last: object = None
    try:
        for op, arg, _pos in pickletools.genops(data_pkl):
            name = op.name
            if name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[arg] = last
                continue
            if name == "MEMOIZE":
                memo[len(memo)] = last
                continue
            if name in ("BINGET", "LONG_BINGET", "GET"):
                last = memo.get(arg)
            elif isinstance(arg, str) and "UNICODE" in name:
                last = arg
            elif name in ("BININT", "BININT1", "BININT2", "LONG1", "INT") and isinstance(arg, int) \
                    and not isinstance(arg, bool):
                last = arg
            elif name == "STOP":
                break
            else:
                last = None
            tokens.append(last)
            if len(tokens) > 2_000_000:
                break
    except Exception:  # noqa: BLE001 - a broken pickle is reported by the zip check, not here
        return None, None

    def int_after(i: int) -> int | None:
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        return nxt if isinstance(nxt, int) else None

    dp = stage = None
    for i, tok in enumerate(tokens):
        if tok == "dp_world_size" and dp is None:
            dp = int_after(i)
        elif tok == "zero_optimization" and stage is None:
            for j in range(i + 1, min(i + 60, len(tokens))):
                if tokens[j] == "stage":
                    stage = int_after(j)
                    break
    return stage, dp


def deepspeed_param_names(root: object) -> set[str]:
    """Trainable parameter names in DeepSpeed model states (param_shapes: a list of {name: torch.Size}, read as
    data). Frozen parameters (frozen_param_shapes) are not among them: ds_to_universal writes no zero/ folder
    for them."""
    shapes = root.get("param_shapes") if isinstance(root, dict) else None
    groups = shapes if isinstance(shapes, list) else [shapes]
    return {k for g in groups if isinstance(g, dict) for k in g if isinstance(k, str)}


def deepspeed_global_steps(root: object) -> int | None:
    """The engine's global_steps recorded in DeepSpeed model states, or None."""
    v = root.get("global_steps") if isinstance(root, dict) else None
    return v if type(v) is int and v >= 0 else None


def zip_pickle(path: str) -> bytes | None:
    """The data.pkl bytes of a torch zip archive (regular files only, bounded), or None."""
    import struct
    import zlib

    from checkpoint_strategy import storage
    from checkpoint_strategy.checkpoints import filechecks as fc

    try:
        with storage.open_regular(path, "checkpoint file") as fh:
            size = fh.seek(0, 2)
            parsed = fc.read_zip_directory(fh, size)
            if isinstance(parsed, str):
                return None
            entry = next((e for e in parsed[0] if e.name.endswith("data.pkl")), None)
            if entry is None or entry.usize > MAX_MODEL_STATES_PICKLE:
                return None
            fh.seek(entry.offset)
            header = fh.read(30)
            if len(header) != 30 or header[:4] != b"PK\x03\x04":
                return None
            nlen, xlen = struct.unpack("<HH", header[26:30])
            fh.seek(entry.offset + 30 + nlen + xlen)
            data = fh.read(entry.csize)
        return zlib.decompress(data, -15) if entry.method == 8 else data
    except (OSError, zlib.error, storage.ReadError):
        return None
