"""Checkpoint validation: per-format checks, roots with many checkpoints, the Python API."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable

from checkpoint_strategy.checkpoints import filechecks as fc
from checkpoint_strategy.checkpoints import formats as fm
from checkpoint_strategy.checkpoints import framework_layouts as fl
from checkpoint_strategy.checkpoints.models import CheckpointResult, Problem, ValidationReport, ValidationSummary
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy import storage

PORTABILITY = {
    "full": "full state dict: loads on any hardware; re-shard after loading on the new hardware",
    "weights": "weights only (no optimizer state): fine for inference or fine-tuning, a resume would reset "
               "the optimizer (watch for a sudden loss drop)",
    "fsdp": "FSDP shards are hardware-specific: convert to a full state dict before moving hardware "
            "(accelerate merge-weights DIR OUT, or python -m torch.distributed.checkpoint.format_utils "
            "dcp_to_torch DIR OUT.pt), then re-shard after loading",
    "dcp": "torch.distributed.checkpoint shards: dcp.load re-shards to a new world size; for a full state dict "
           "run python -m torch.distributed.checkpoint.format_utils dcp_to_torch DIR OUT.pt",
    "zero": "DeepSpeed ZeRO shards are tied to the data-parallel size: run python zero_to_fp32.py CKPT_DIR OUT "
            "(written next to the checkpoint) for a full state dict, then re-shard after loading",
    "megatron": "Megatron tensor/pipeline-parallel shards: convert with Megatron-LM tools/checkpoint/convert.py "
                "(or save with --ckpt-format torch_dist, which re-shards on load) before changing parallelism",
    "orbax": "Orbax/tensorstore arrays: restore on the new mesh with a target sharding (ArrayRestoreArgs); "
             "saved shardings are hardware-specific",
    "lightning-sharded": "sharded Lightning checkpoint: consolidate with python -m pytorch_lightning."
                         "utilities.consolidate_checkpoint PATH.ckpt (FSDP) or "
                         "convert_zero_checkpoint_to_fp32_state_dict (DeepSpeed) before moving hardware",
    "unknown": "unknown layout: cannot say",
}

ProgressFn = Callable[..., None]


class _Ctx:
    """Collects problems/notes for one checkpoint."""

    def __init__(self, root: str, level: str, update: ProgressFn | None) -> None:
        self.root = root
        self.full = level == "full"
        self.level = level
        self.counter = fc.Counter()
        self.problems: list[Problem] = []
        self.update = update

    def rel(self, path: str) -> str:
        if os.path.normpath(path) == os.path.normpath(self.root):
            return "."
        base = self.root if os.path.isdir(self.root) else os.path.dirname(self.root)
        return os.path.relpath(path, base)

    def bad(self, path: str, reason: str, kind: str = "invalid") -> None:
        self.problems.append(Problem(file=self.rel(path), reason=reason, kind=kind))

    def missing(self, path: str, what: str) -> None:
        self.bad(path, f"missing: {what}", "incomplete")

    def safetensors(self, path: str) -> None:
        for r in fc.check_safetensors(path, self.counter, self.full):
            self.bad(path, r, "incomplete" if r.startswith("truncated") else "invalid")
        self._tick()

    def zip(self, path: str, want_pickle: bool = False) -> list[str]:
        reasons, strings = fc.check_zip(path, self.counter, self.full, want_pickle, self.update)
        for r in reasons:
            self.bad(path, r, "invalid")
        self._tick()
        return strings

    def json(self, path: str) -> object | None:
        """A JSON file of the checkpoint (NaN allowed: the HF Trainer writes it), read through storage:
        regular files only, bounded, every failure one problem line."""
        self.counter.files += 1
        try:
            raw = storage.read_bytes(path, os.path.basename(path))
            self.counter.bytes_read += len(raw)
            if not raw:
                self.bad(path, "zero-byte file (expected JSON)")
                return None
            return storage.loads_json(raw, os.path.basename(path), allow_nan=True)
        except storage.ReadError as exc:
            self.bad(path, fc._oserror(exc) if not exc.reason.startswith(("not ", "nested")) else exc.reason)
        finally:
            self._tick()
        return None

    def readable(self, path: str) -> None:
        """Generic file: must be a readable, non-empty file; full level reads it all."""
        self.counter.files += 1
        try:
            st = os.stat(path)
        except OSError as exc:
            self.bad(path, fc._oserror(exc))
            return
        if not os.path.isfile(path):
            self.bad(path, f"is {storage.kind_of(st.st_mode)}: expected a regular file")
            return
        if st.st_size == 0:
            self.bad(path, "zero-byte file")
            return
        if self.full:
            for r in fc.stream_file(path, self.counter, self.update):
                self.bad(path, r)
        else:
            try:
                with storage.open_regular(path) as fh:
                    fh.read(1)
            except (OSError, storage.ReadError) as exc:
                self.bad(path, fc._oserror(exc))
        self._tick()

    def _tick(self) -> None:
        if self.update is not None:
            self.update(files=1)


def _ls(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# --------------------------------------------------------------------------- formats

def _check_hf(ctx: _Ctx, path: str, res: dict) -> None:  # noqa: C901 - complexity debt, see issue 10
    names = set(_ls(path))
    weights = sorted(n for n in names if fm._HF_WEIGHTS.match(n))
    indexes = [n for n in names if n.endswith(".index.json") and n.split(".")[0] in
               ("model", "pytorch_model", "adapter_model")]
    fsdp_model = sorted(n for n in names if n.startswith("pytorch_model_fsdp") and os.path.isdir(os.path.join(path, n)))
    fsdp_optim = sorted(n for n in names if re.match(r"^optimizer_\d+$", n) and os.path.isdir(os.path.join(path, n)))
    ds_steps = sorted(n for n in names if fm._DS.match(n) and os.path.isdir(os.path.join(path, n)))
    covered: set[str] = set()
    for idx in indexes:
        data = ctx.json(os.path.join(path, idx))
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if data is not None and not isinstance(wm, dict):
            ctx.bad(os.path.join(path, idx), "index without a weight_map object")
            continue
        for shard in sorted(set(wm.values()) if wm else ()):
            if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
                ctx.bad(os.path.join(path, idx), f"weight_map names an invalid shard {shard!r}")
                continue
            covered.add(shard)
            if shard not in names:
                ctx.missing(os.path.join(path, shard), f"shard listed in {idx}")
    for w in weights:
        p = os.path.join(path, w)
        if w.endswith(".safetensors"):
            ctx.safetensors(p)
        else:
            ctx.zip(p)
    for d in fsdp_model + fsdp_optim:
        _check_dcp_dir(ctx, os.path.join(path, d))
    for d in ds_steps:
        _check_deepspeed_dir(ctx, os.path.join(path, d), res)
    if not weights and not fsdp_model and not ds_steps and not indexes:
        ctx.missing(os.path.join(path, "model.safetensors"),
                    "model weights (model.safetensors, model-0000k-of-0000n.safetensors, pytorch_model.bin or FSDP folder)")
    for n in sorted(names):
        p = os.path.join(path, n)
        if n in ("optimizer.pt", "scheduler.pt", "training_args.bin", "scaler.pt") or re.match(r"^rng_state.*\.pth$", n):
            ctx.zip(p)
    if "trainer_state.json" in names:
        state = ctx.json(os.path.join(path, "trainer_state.json"))
        if state is not None and not isinstance(state, dict):
            ctx.bad(os.path.join(path, "trainer_state.json"), "not a JSON object")
        elif isinstance(state, dict) and res.get("step") is None and isinstance(state.get("global_step"), int):
            res["step"] = state["global_step"]
    elif fm._HF.match(os.path.basename(path)):
        ctx.missing(os.path.join(path, "trainer_state.json"), "trainer_state.json (the Trainer writes it with every checkpoint)")
    for n in ("config.json", "generation_config.json", "adapter_config.json"):
        if n in names:
            ctx.json(os.path.join(path, n))
    res["resumable"] = "optimizer.pt" in names or bool(fsdp_optim) or res.get("resumable", False)
    if fsdp_model or fsdp_optim:
        res["sharded"], res["portability"] = True, "fsdp"
    elif ds_steps:
        res["sharded"], res["portability"] = True, "zero"
    else:
        res["portability"] = "full" if res["resumable"] else "weights"


def _check_dcp_dir(ctx: _Ctx, path: str, res: dict | None = None, require_metadata: bool = True) -> None:  # noqa: C901 - complexity debt, see issue 10
    names = _ls(path)
    distcp = [n for n in names if n.endswith(".distcp")]
    meta = os.path.join(path, ".metadata")
    if ".metadata" not in names:
        if require_metadata:
            ctx.missing(meta, ".metadata (DCP writes it last; without it the save did not finish)")
        for n in distcp:
            ctx.readable(os.path.join(path, n))
        return
    ctx.counter.files += 1
    if not storage.inside(meta, path):  # never read outside the checkpoint (a link to /dev/zero, /etc/...)
        ctx.bad(meta, "a symbolic link to outside the checkpoint folder: not read")
        return
    try:  # bounded: a .metadata that is a device or a huge sparse file is refused
        data = storage.read_bytes(meta, ".metadata", fc.MAX_DCP_METADATA)
        ctx.counter.bytes_read += len(data)
    except storage.ReadError as exc:
        ctx.bad(meta, fc._oserror(exc) if not exc.reason.startswith("larger") else
                f"{exc.reason}: not a plausible DCP .metadata")
        return
    if not data:
        ctx.bad(meta, "zero-byte file (expected a pickled DCP Metadata)", "incomplete")
        return
    parsed = fc.dcp_storage_map(data)
    if isinstance(parsed, str):
        ctx.bad(meta, parsed)
        return
    needed, keys = parsed
    if res is not None:
        res["resumable"] = any(k.startswith("optim") for k in keys) or res.get("resumable", False)
        res["dcp_keys"] = keys
    if not needed:
        ctx.bad(meta, "no storage entries found in .metadata")
    for rel, nbytes in sorted(needed.items()):
        p = os.path.join(path, rel)
        if (os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/") or "\0" in rel
                or not storage.inside(p, path)):
            ctx.bad(meta, f"storage path {rel!r} points outside the checkpoint folder: invalid (never read)")
            continue
        try:
            st = os.stat(p)
            size = st.st_size
        except FileNotFoundError:
            ctx.missing(p, "data file referenced by .metadata")
            continue
        except OSError as exc:
            ctx.bad(p, fc._oserror(exc))
            continue
        if not os.path.isfile(p):
            ctx.bad(p, f"is {storage.kind_of(st.st_mode)}: expected a regular file")
            continue
        ctx.counter.files += 1
        if size < nbytes:
            ctx.bad(p, f"truncated: .metadata needs {nbytes} bytes, file has {size}", "incomplete")
        elif ctx.full:
            for r in fc.stream_file(p, ctx.counter, ctx.update):
                ctx.bad(p, r)
        ctx._tick()
    for n in names:
        if n.endswith(".distcp") and n not in needed:
            ctx.bad(os.path.join(path, n), "data file not referenced by .metadata (left from another save?)")


def _check_deepspeed_dir(ctx: _Ctx, path: str, res: dict) -> None:
    names = _ls(path)
    model = [n for n in names if n.endswith("_model_states.pt")]
    optim = [n for n in names if n.endswith("_optim_states.pt")]
    if not model:
        ctx.missing(os.path.join(path, "mp_rank_00_model_states.pt"), "model states (mp_rank_XX_model_states.pt)")
    for n in sorted(model + optim):
        ctx.zip(os.path.join(path, n))
    states_pkl = fl.zip_pickle(os.path.join(path, model[0])) if model else None
    ctx.counter.bytes_read += len(states_pkl or b"")
    stage, dp = fl.deepspeed_zero_layout(states_pkl) if states_pkl else (None, None)
    if stage and not optim:
        ctx.missing(os.path.join(path, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
                    f"ZeRO stage {stage} optimizer shards (the model states were saved with ZeRO; a copy without "
                    "them cannot resume)")
    if optim:
        res["resumable"] = True
        ranks = sorted({int(m.group(1)) for n in optim if (m := re.search(r"zero_pp_rank_(\d+)_", n))})
        expected = max(ranks) + 1 if ranks else 0
        if stage and dp:
            expected = max(expected, dp)  # the model states say how many data-parallel ranks saved
        if ranks and ranks != list(range(expected)):
            missing = sorted(set(range(expected)) - set(ranks))
            ctx.missing(os.path.join(path, f"zero_pp_rank_{missing[0]}_mp_rank_00_optim_states.pt"),
                        f"optimizer shard for ZeRO rank {missing[0]} (ranks present: {ranks})")
    res["sharded"] = bool(optim and any("zero_pp_rank" in n for n in optim)) or len(model) > 1
    res["portability"] = "zero" if res["sharded"] else ("full" if optim else "weights")


def _check_megatron_dir(ctx: _Ctx, path: str, res: dict) -> None:
    names = _ls(path)
    if ".metadata" in names:  # torch_dist format
        _check_dcp_dir(ctx, path, res)
        if "common.pt" in names:
            ctx.zip(os.path.join(path, "common.pt"))
        if "metadata.json" in names:
            ctx.json(os.path.join(path, "metadata.json"))
        res["sharded"], res["portability"] = True, "dcp"
        return
    ranks = sorted(n for n in names if n.startswith("mp_rank_") and os.path.isdir(os.path.join(path, n)))
    if not ranks:
        ctx.missing(os.path.join(path, "mp_rank_00"), "model-parallel rank folders (mp_rank_XX/model_optim_rng.pt)")
    has_optim = False
    for r in ranks:
        inner = _ls(os.path.join(path, r))
        files = [n for n in inner if n.endswith(".pt")]
        if "model_optim_rng.pt" not in inner:
            ctx.missing(os.path.join(path, r, "model_optim_rng.pt"), "model_optim_rng.pt")
        for n in files:
            strings = ctx.zip(os.path.join(path, r, n), want_pickle=(n == "model_optim_rng.pt" and not has_optim))
            has_optim = has_optim or "optimizer" in strings
        if "distrib_optim.pt" in inner:
            has_optim = True
    res["resumable"] = has_optim
    res["sharded"] = len(ranks) > 1
    res["portability"] = "megatron" if res["sharded"] else ("full" if has_optim else "weights")


def _check_orbax_dir(ctx: _Ctx, path: str, res: dict, want_commit: bool) -> None:  # noqa: C901 - complexity debt, see issue 10
    names = set(_ls(path))
    if fm.ORBAX_TMP in os.path.basename(path):
        ctx.bad(path, "in-flight Orbax temporary folder (save not finalised)", "incomplete")
        return
    if "_CHECKPOINT_METADATA" in names:
        meta = ctx.json(os.path.join(path, "_CHECKPOINT_METADATA"))
        if isinstance(meta, dict) and meta.get("commit_timestamp_nsecs", 1) is None:
            ctx.bad(os.path.join(path, "_CHECKPOINT_METADATA"), "no commit timestamp: save not finalised", "incomplete")
    elif "commit_success.txt" not in names:
        ctx.missing(os.path.join(path, "_CHECKPOINT_METADATA"), "_CHECKPOINT_METADATA / commit_success.txt")
    if want_commit and "commit_success.txt" not in names:
        ctx.missing(os.path.join(path, "commit_success.txt"),
                    "commit marker commit_success.txt (the other steps have one; the save did not finish)")
    items = sorted(n for n in names if os.path.isdir(os.path.join(path, n)))
    if not items:
        ctx.missing(os.path.join(path, "default"), "checkpoint items (e.g. default/, state/)")
    for item in items:
        ip = os.path.join(path, item)
        inner = _ls(ip)
        if not inner:
            ctx.missing(ip, f"contents of item {item}/")
            continue
        for n in inner:
            if n in ("_METADATA", "_sharding", "manifest.ocdbt") or n.endswith(".json"):
                p = os.path.join(ip, n)
                if n in ("_METADATA", "_sharding") or n.endswith(".json"):
                    meta = ctx.json(p)
                    if n == "_METADATA" and fl.orbax_item_has_optimizer(meta):
                        res["resumable"] = True
                else:
                    ctx.readable(p)
            elif ctx.full and os.path.isfile(os.path.join(ip, n)):
                ctx.readable(os.path.join(ip, n))
        if "opt" in item.lower() or item in ("state", "train_state"):
            res["resumable"] = True
    res["sharded"], res["portability"] = True, "orbax"


def _check_lightning(ctx: _Ctx, path: str, res: dict) -> None:
    if os.path.isdir(path):
        names = _ls(path)
        if ".metadata" in names or any(n.endswith(".distcp") for n in names):
            _check_dcp_dir(ctx, path, res)
        elif "checkpoint" in names:
            _check_deepspeed_dir(ctx, os.path.join(path, "checkpoint"), res)
        else:
            ctx.missing(path, "sharded checkpoint contents (.metadata or checkpoint/)")
        res["sharded"], res["portability"] = True, "lightning-sharded"
        return
    strings = ctx.zip(path, want_pickle=True)
    res["resumable"] = "optimizer_states" in strings
    res["portability"] = "full" if res["resumable"] else "weights"


def _check_nemo(ctx: _Ctx, path: str, res: dict) -> None:
    marker = fm.unfinished_marker(path)
    if os.path.lexists(marker):
        ctx.bad(marker, "NeMo -unfinished marker present: the save did not finish", "incomplete")
    if os.path.isdir(path):
        names = _ls(path)
        target = os.path.join(path, "weights") if "weights" in names else path
        _check_dcp_dir(ctx, target, res)
        for n in ("common.pt",):
            if n in _ls(target):
                ctx.zip(os.path.join(target, n))
        res["sharded"], res["portability"] = True, "dcp"
    elif os.path.exists(path):
        strings = ctx.zip(path, want_pickle=True)
        res["resumable"] = "optimizer_states" in strings
        res["portability"] = "full" if res["resumable"] else "weights"


def _check_file(ctx: _Ctx, path: str, fmt: str, res: dict) -> None:
    if fmt == "safetensors":
        ctx.safetensors(path)
        res["portability"] = "weights"
        return
    strings = ctx.zip(path, want_pickle=True)
    res["resumable"] = any(s in ("optimizer", "optimizer_states", "optimizer_state_dict", "optim") for s in strings)
    res["portability"] = "full" if res["resumable"] else "weights"


# --------------------------------------------------------------------------- public API

def check(found: fm.Found, level: str = "quick", update: ProgressFn | None = None,  # noqa: C901 - complexity debt, see issue 10
          want_commit: bool = False, manifest: str | None = None, root: str | None = None) -> CheckpointResult:
    """Validate one recognised checkpoint. ``root``: the folder the user named; a manifest is never
    written outside it (a symlinked checkpoint pointing elsewhere is left alone)."""
    path = found.path
    ctx = _Ctx(path, level, update)
    res: dict = {"step": found.step, "resumable": False, "sharded": False, "portability": "unknown"}
    fmt = found.format
    is_dir = os.path.isdir(path)
    if not os.path.lexists(path):
        ctx.missing(path, "checkpoint")
    elif os.path.islink(path) and not os.path.exists(path):
        ctx.bad(path, "dangling symlink")
    elif fmt in ("hf-trainer", "deepspeed", "megatron", "torchtitan", "dcp", "orbax") and not is_dir:
        ctx.bad(path, f"is a file, expected a {fmt} checkpoint folder")
    elif fmt == "hf-trainer" and os.path.basename(path).startswith("tmp-checkpoint-"):
        ctx.bad(path, "in-flight temporary folder tmp-checkpoint-N (the Trainer renames it when the save ends)",
                "incomplete")
    elif fmt == "hf-trainer":
        _check_hf(ctx, path, res)
    elif fmt in ("dcp", "torchtitan"):
        _check_dcp_dir(ctx, path, res)
        res["sharded"], res["portability"] = True, "dcp"
        if fmt == "torchtitan" and not res["resumable"]:
            reason = fl.torchtitan_model_only_reason(res.get("dcp_keys", set()), res["step"])
            if reason:
                ctx.counter.notes.append(reason)
    elif fmt == "deepspeed":
        _check_deepspeed_dir(ctx, path, res)
    elif fmt == "megatron":
        _check_megatron_dir(ctx, path, res)
    elif fmt == "orbax":
        _check_orbax_dir(ctx, path, res, want_commit)
    elif fmt == "lightning":
        _check_lightning(ctx, path, res)
    elif fmt == "nemo":
        _check_nemo(ctx, path, res)
    else:
        _check_file(ctx, path, fmt, res)
    manifest_state = None
    if manifest and os.path.lexists(path) and not any(p.kind == "incomplete" for p in ctx.problems):
        from checkpoint_strategy.checkpoints import manifest as mf

        if manifest == "write" and not ctx.problems:
            target = mf.manifest_path(path)
            if root is not None and not storage.inside(os.path.dirname(target) or ".", root):
                ctx.counter.notes.append(f"{os.path.basename(path)}: a symlink to outside {root}: "
                                         "manifest not written there (validate the target itself to write one)")
            else:
                mf.write_manifest(path, ctx.counter, update)
                manifest_state = "written"
        elif manifest == "verify":
            for rel, reason in mf.verify_manifest(path, ctx.counter, update):
                ctx.problems.append(Problem(file=rel, reason=reason, kind="invalid"))
            manifest_state = "verified"
    from checkpoint_strategy.checkpoints.marker import describe, read_marker

    mark = read_marker(path) if os.path.lexists(path) else None
    if mark is not None:  # written by the training callbacks: post-event weights
        ctx.counter.notes.append(f"{describe(mark)}: not a resume point")
    kinds = {p.kind for p in ctx.problems}
    status = "invalid" if "invalid" in kinds else "incomplete" if "incomplete" in kinds else "valid"
    return CheckpointResult(
        path=str(path), format=fmt, step=res["step"], status=status, resumable=bool(res["resumable"]),
        sharded=bool(res["sharded"]), portability=PORTABILITY[res["portability"]], level=level,
        files_checked=ctx.counter.files, bytes_read=ctx.counter.bytes_read, manifest=manifest_state,
        problems=ctx.problems, notes=ctx.counter.notes)


def validate_checkpoint(path: str | os.PathLike, level: str = "quick", manifest: str | None = None) -> CheckpointResult:
    """Check one checkpoint is whole without loading it (the spec's `validate_on_save`).

    Call it right after a save, e.g. ``validate_checkpoint("out/checkpoint-500").status == "valid"``.
    Never executes checkpoint content (no torch.load / pickle.load).

    Args:
        path: a checkpoint folder (checkpoint-N/, step-N/, global_stepN/, iter_N/, Orbax step, *.ckpt/)
            or file (*.ckpt, *.pt, *.safetensors).
        level: "quick" reads headers only (cost grows with the number of files); "full" reads every
            byte and checks the CRC-32 of every zip entry.
        manifest: None, "write" (write integrity.json after a clean full check) or "verify".

    Returns:
        CheckpointResult (stable fields): path, format, step, status ("valid" | "invalid" |
        "incomplete"), resumable (optimizer state present), sharded (hardware-specific shards),
        portability (cross-hardware advice), level, files_checked, bytes_read, manifest,
        problems [{file, reason, kind}], notes.

    Raises:
        UsageError: the path does not exist or level/manifest is not one of the allowed values.
    """
    if level not in ("quick", "full"):
        raise UsageError(f"level must be quick or full, got {level!r}")
    if manifest not in (None, "write", "verify"):
        raise UsageError(f"manifest must be write or verify, got {manifest!r}")
    if manifest:
        level = "full"
    p = os.fspath(path)
    if not os.path.lexists(p):
        raise UsageError(f"{p}: no such file or folder; expected a checkpoint folder or file")
    found = fm.identify(p)
    if found is None:
        return CheckpointResult(path=p, format="unknown", step=fm.step_from_name(os.path.basename(p)),
                                status="invalid", resumable=False, sharded=False,
                                portability=PORTABILITY["unknown"], level=level,
                                problems=[Problem(file=".", reason="not a recognised checkpoint layout "
                                                  "(see the formats table in the README)")])
    return check(found, level, manifest=manifest)


def _tracker_entries(folder: str, found: list[fm.Found]) -> list[fm.Found]:
    """Checkpoints named by DeepSpeed `latest` / Megatron `latest_checkpointed_iteration.txt`
    that are not on disk: reported as incomplete."""
    extra: list[fm.Found] = []
    present = {os.path.normpath(f.path) for f in found}
    for tracker, fmt in (("latest", "deepspeed"), ("latest_checkpointed_iteration.txt", "megatron")):
        tp = os.path.join(folder, tracker)
        if not os.path.isfile(tp):
            continue
        try:
            with storage.open_regular(tp, tracker) as fh:
                text = fh.read(256).decode("utf-8", "replace").strip()
        except (OSError, storage.ReadError):
            continue
        if fmt == "deepspeed":
            name = text
        elif text.isdigit():
            name = f"iter_{int(text):07d}"
        else:
            continue  # 'release'
        if not name or "/" in name or name.startswith("."):
            continue
        target = os.path.normpath(os.path.join(folder, name))
        if target not in present:
            extra.append(fm.Found(target, fmt, fm.step_from_name(name), True))
    return extra


def validate_paths(paths: Iterable[str], level: str = "quick", manifest: str | None = None,
                   progress: bool | None = None) -> ValidationReport:
    """Validate every checkpoint at or under each path (roots with many checkpoints allowed)."""
    from checkpoint_strategy.checkpoints.progress import Progress

    started = time.perf_counter()
    if manifest:
        level = "full"
    jobs: list[fm.Found] = []
    roots: dict[str, str] = {}
    orbax_commit_roots: set[str] = set()
    for raw in paths:
        p = os.fspath(raw)
        if not os.path.lexists(p):
            raise UsageError(f"{p}: no such file or folder; expected a checkpoint or a folder of checkpoints")
        if os.path.islink(p) and not os.path.exists(p):
            raise UsageError(f"{p}: dangling or looping symlink; expected a checkpoint or a folder of checkpoints")
        found, _unrec = fm.discover(p)
        if not found:
            kind = "folder" if os.path.isdir(p) else "file"
            raise UsageError(f"{p}: no checkpoint recognised in this {kind}; expected checkpoint-N/, *.ckpt, "
                             "*.safetensors, a DCP/Orbax/DeepSpeed/Megatron step folder, or a folder of them")
        parents = sorted({os.path.dirname(f.path) for f in found if f.role != fm.FINAL_EXPORT})
        for parent in parents:
            found += _tracker_entries(parent, [f for f in found if os.path.dirname(f.path) == parent])
            orbax = [f for f in found if f.format == "orbax" and os.path.dirname(f.path) == parent]
            if any(os.path.exists(os.path.join(f.path, "commit_success.txt")) for f in orbax):
                orbax_commit_roots.add(parent)
        jobs.extend(found)
        for f in found:
            roots.setdefault(f.path, p)
    results: list[CheckpointResult] = []
    with Progress(total=len(jobs), enabled=progress) as bar:
        for f in jobs:
            want_commit = os.path.dirname(f.path) in orbax_commit_roots
            export = f.role == fm.FINAL_EXPORT  # a manifest there would cover every checkpoint-N/
            results.append(check(f, level, bar.update, want_commit, None if export else manifest,
                                 root=roots[f.path]))
            if export:
                results[-1].notes.append("final export: the run folder's own top-level model files "
                                         "(its checkpoint-N/ folders are checked one by one)")
            bar.update(checkpoints=1)
    counts = {s: sum(r.status == s for r in results) for s in ("valid", "invalid", "incomplete")}
    from checkpoint_strategy.checkpoints.manifest import ALGORITHM

    return ValidationReport(
        level=level, manifest=manifest, hash_algorithm=ALGORITHM if manifest else None, checkpoints=results,
        summary=ValidationSummary(checkpoints=len(results), seconds=round(time.perf_counter() - started, 3), **counts))
