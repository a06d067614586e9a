"""Release-readiness gate for one checkpoint: validated, the required formats present, integrity
recorded (the checkpoint's own manifest verified, or a sha256 of every file)."""

from __future__ import annotations

import os
import re
import stat as _stat
from collections.abc import Iterable

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.filechecks import Counter
from checkpoint_strategy.formats.manifest import hash_file, list_files, manifest_path
from checkpoint_strategy.integrations.checkpoints import (
    api,
    first_problem,
    formats_present,
    now_iso,
)
from checkpoint_strategy.integrations.models import (
    FileChecksum,
    GateCheck,
    NotForRelease,
    ReleaseGate,
    ValuesSummary,
)
from checkpoint_strategy.retention.safety import checkpoint_spike
from checkpoint_strategy.storage import describe_os_error, kind_of, oserror_line, read_json

REQUIRE_CHOICES = ("safetensors", "full_state_dict", "sharded", "resumable")
CHUNK = 4 << 20


def parse_require(text: str) -> list[str]:
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    bad = [p for p in parts if p not in REQUIRE_CHOICES]
    if bad or not parts:
        raise UsageError(
            f"--require: expected a comma-separated list of {', '.join(REQUIRE_CHOICES)}, got {text!r}"
        )
    return list(dict.fromkeys(parts))


def _files(checkpoint: str) -> dict[str, str]:
    """relative path -> path of every regular file (the manifest itself excluded)."""
    return list_files(checkpoint)


def sha256_file(path: str) -> str:
    """SHA-256 of one file, streamed in chunks (the validator's manifest hash)."""
    return hash_file(path, Counter(), algorithm="sha256")


def checksums(checkpoint: str) -> list[FileChecksum]:
    out = []
    for rel, full in sorted(_files(checkpoint).items()):
        try:
            out.append(
                FileChecksum(file=rel, bytes=os.path.getsize(full), sha256=sha256_file(full))
            )
        except OSError as exc:
            raise UsageError(oserror_line(exc, "read", full)) from None
    return out


def gate(
    checkpoint: str | os.PathLike, require: Iterable[str] = (), level: str = "quick"
) -> ReleaseGate:
    """Validate `checkpoint` and decide pass/fail. Never loads or executes checkpoint content."""
    path = os.fspath(checkpoint)
    required = list(dict.fromkeys(require))
    bad = [r for r in required if r not in REQUIRE_CHOICES]
    if bad:
        raise UsageError(f"require: unknown item {bad[0]!r}; expected {', '.join(REQUIRE_CHOICES)}")
    if level not in ("quick", "full", "deep"):
        raise UsageError(f"level must be quick, full or deep, got {level!r}")
    ck = api()

    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or folder; expected a checkpoint folder or file")
    _require_one_checkpoint(path)
    manifest = manifest_path(path)
    has_manifest = os.path.isfile(manifest)
    validated_at = now_iso()
    result = ck.validate_checkpoint(path, level=level, manifest="verify" if has_manifest else None)
    loads_ok = result.status == "valid"
    formats = formats_present(result)
    checks: list[GateCheck] = []
    reasons: list[str] = []
    _whole_check(result, checks, reasons)
    _required_checks(result, required, formats, checks, reasons)
    values = None
    if result.deep is not None or level == "deep":
        values, ok, detail = _values_check(result)
        checks.append(
            GateCheck(name="values finite, optimizer state whole (deep)", ok=ok, detail=detail)
        )
        if not ok and loads_ok:
            reasons.append(f"deep check: {detail}")
    sums = _integrity_check(result, path, manifest if has_manifest else None, checks, reasons)
    gate_ok = loads_ok and not reasons
    excluded, release_set = release_split(list(_files(path)))
    return ReleaseGate(
        checkpoint=path,
        layout=result.format,
        step=result.step,
        level=result.level,
        validated_at=validated_at,
        loads_ok=loads_ok,
        status=result.status,
        formats_present=formats,
        required=required,
        resumable=result.resumable,
        sharded=result.sharded,
        integrity="manifest" if has_manifest else "checksums",
        manifest=manifest if has_manifest else None,
        checksums=sums,
        checks=checks,
        values=values,
        gate="pass" if gate_ok else "fail",
        reasons=reasons,
        not_for_release=excluded,
        release_set=release_set if "safetensors" in required else [],
        notes=release_notes(path, release_set if "safetensors" in required else None),
    )


# a Hugging Face tokenizer saved with save_pretrained (fast or slow, BPE or SentencePiece)
_TOKENIZER = re.compile(
    r"^(tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|"
    r"vocab\.(json|txt)|merges\.txt|spiece\.model|sentencepiece\.bpe\.model)$"
)


def release_notes(path: str, release_set: list[str] | None) -> list[str]:
    """What the release needs beyond the gate: the tokenizer (a Hub release of a language model ships it beside
    the weights) and whether trainer_state.json names this checkpoint the eval-best."""
    notes = []
    if release_set is not None and not any(
        _TOKENIZER.match(os.path.basename(f)) for f in release_set
    ):
        notes.append(
            "no tokenizer files in the release set (tokenizer.json, tokenizer_config.json, "
            "special_tokens_map.json, ...): a Hugging Face Hub release of a language model needs them beside "
            "the weights; save them with tokenizer.save_pretrained(DIR) from the training run"
        )
    best = _trainer_best(path)
    if best is not None:
        notes.append(best)
    return notes


def _trainer_best(path: str) -> str | None:
    """trainer_state.json's best_model_checkpoint against this checkpoint (HF Trainer with load_best_model_at_end
    or metric_for_best_model), in one line; None when the state names no best."""
    state_file = os.path.join(path, "trainer_state.json")
    if not os.path.isfile(state_file):
        return None
    try:
        state = read_json(state_file, "trainer state")
    except UsageError:
        return None
    best = state.get("best_model_checkpoint") if isinstance(state, dict) else None
    if not isinstance(best, str) or not best:
        return None
    metric = state.get("best_metric")
    value = (
        f" (best_metric {metric:g})"
        if isinstance(metric, (int, float)) and not isinstance(metric, bool)
        else ""
    )
    name = os.path.basename(os.path.normpath(best))
    if name == os.path.basename(os.path.normpath(path)):
        return f"this checkpoint is the trainer's eval-best{value}: best_model_checkpoint in trainer_state.json"
    return (
        f"not the trainer's eval-best: trainer_state.json names {name}{value} as best_model_checkpoint; release "
        "that one if the evaluation metric is what the release should maximise"
    )


# What a model release does not ship: the trainer's state for resuming, read by torch.load (a pickle runs code
# unless loaded with weights_only=True, and training_args.bin cannot be), and JSON training logs.
_TRAINING_STATE = (
    (
        re.compile(r"^optimizer.*\.(pt|pth|bin)$"),
        "optimizer state (pickle): for resuming training only",
    ),
    (
        re.compile(r"^scheduler.*\.(pt|pth|bin)$"),
        "LR scheduler state (pickle): for resuming training only",
    ),
    (
        re.compile(r"^scaler.*\.(pt|pth)$"),
        "AMP grad-scaler state (pickle): for resuming training only",
    ),
    (re.compile(r"^rng_state.*\.(pt|pth)$"), "RNG state (pickle): for resuming training only"),
    (
        re.compile(r"^training_args\.bin$"),
        "TrainingArguments as a pickle: loading it imports and runs transformers "
        "code (torch.load(weights_only=True) refuses it)",
    ),
    (
        re.compile(r"^trainer_state\.json$"),
        "the Trainer's log and step counter (JSON): training state, not the model",
    ),
    (
        re.compile(r"^(latest|zero_to_fp32\.py)$"),
        "DeepSpeed's resume tag / conversion script: training tooling",
    ),
    (
        re.compile(r".*\.distcp$|^\.metadata$"),
        "sharded training state (torch.distributed.checkpoint)",
    ),
    (
        re.compile(r".*\.ckpt$"),
        "Lightning checkpoint: a pickle holding the optimizer and loop state too; release "
        "the weights as safetensors",
    ),
)
_PICKLE = re.compile(r"\.(bin|pt|pth|ckpt|pkl|pickle)$")
_STATE_DIRS = re.compile(r"^(optimizer|global_step\d*|rng|scheduler)")


def release_split(files: list[str]) -> tuple[list[NotForRelease], list[str]]:
    """(files a model release should not ship, with why; the rest: the release set). Pickled weights are
    excluded only when safetensors weights are there to ship instead."""
    has_safetensors = any(f.endswith(".safetensors") for f in files)
    excluded: list[NotForRelease] = []
    keep: list[str] = []
    for rel in sorted(files):
        name = os.path.basename(rel)
        top = rel.split(os.sep, 1)[0] if os.sep in rel else ""
        reason = next((why for pattern, why in _TRAINING_STATE if pattern.search(name)), None)
        if reason is None and top and _STATE_DIRS.match(top):
            reason = f"inside {top}/: sharded training state"
        if reason is None and has_safetensors and _PICKLE.search(name):
            reason = "pickle: the weights ship as safetensors (torch.load of a pickle can run code)"
        if reason is None:
            keep.append(rel)
        else:
            excluded.append(NotForRelease(file=rel, reason=reason))
    return excluded, keep


def _whole_check(result, checks: list[GateCheck], reasons: list[str]) -> None:
    whole = (
        f"{result.status} ({result.format}, {result.files_checked} files, "
        f"{ {'full': 'every byte read', 'deep': 'every value read'}.get(result.level, 'headers read') })"
    )
    loads_ok = result.status == "valid"
    if not loads_ok:
        whole = f"{result.status}: {first_problem(result)}"
        reasons.append(f"checkpoint is {result.status}: {first_problem(result)}")
    checks.append(GateCheck(name="checkpoint is whole", ok=loads_ok, detail=whole))


def _required_checks(
    result, required: list[str], formats: list[str], checks: list[GateCheck], reasons: list[str]
) -> None:
    """One check per --require item: a format present, or optimizer state (resumable)."""
    for item in required:
        if item == "resumable":
            ok = result.resumable
            checks.append(
                GateCheck(
                    name="optimizer state present (resumable)",
                    ok=ok,
                    detail="yes" if ok else "weights only: resuming would restart Adam",
                )
            )
            if not ok:
                reasons.append("required resumable, but the checkpoint has no optimizer state")
            continue
        ok = item in formats
        checks.append(
            GateCheck(
                name=f"{item} present",
                ok=ok,
                detail="yes" if ok else f"missing (present: {', '.join(formats) or 'none'})",
            )
        )
        if not ok:
            reasons.append(
                f"required format {item} is missing (present: {', '.join(formats) or 'none'})"
            )


def _integrity_check(
    result, path: str, manifest: str | None, checks: list[GateCheck], reasons: list[str]
) -> list[FileChecksum]:
    """The checkpoint's own manifest verified, or (a whole checkpoint without one) a sha256 of every file."""
    loads_ok = result.status == "valid"
    if manifest is not None:
        ok = result.manifest == "verified"
        detail = (
            f"{os.path.basename(manifest)} verified" if ok else "manifest does not match the files"
        )
        checks.append(GateCheck(name="integrity manifest verified", ok=ok, detail=detail))
        if not ok and loads_ok:
            reasons.append(f"manifest {manifest} does not match the files")
        return []
    if not loads_ok:
        return []
    sums = checksums(path)
    total = sum(s.bytes for s in sums)
    checks.append(
        GateCheck(
            name="checksums recorded",
            ok=True,
            detail=f"sha256 of {len(sums)} files ({total} bytes)",
        )
    )
    return sums


def apply_spike_check(
    record: ReleaseGate, log: str | None = None, spike_check: bool = True
) -> ReleaseGate:
    """Add the check "not after an unrecovered loss spike" (retention/safety.py) to a gate record:
    a checkpoint saved after the onset fails the gate, whatever its files say."""
    from checkpoint_strategy.recovery import advise

    found = checkpoint_spike(record.checkpoint, record.step, log, spike_check, advise)
    if found is None:
        return record
    ok, detail = found
    record.checks.append(
        GateCheck(name="not after an unrecovered loss spike", ok=ok, detail=detail)
    )
    if not ok:
        record.reasons.append(detail)
        record.gate = "fail"
    return record


_RUN_CHILD = re.compile(r"^(checkpoint-\d+|step[-_=]?\d+|iter_\d+|\d+)$|\.ckpt$")


def _require_one_checkpoint(path: str) -> None:
    """The gate judges one checkpoint: a run folder (checkpoints inside) or anything that is not a
    checkpoint (a device, an unrelated file) is bad input, not a failed gate."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {describe_os_error(exc)}") from None
    if not (_stat.S_ISDIR(mode) or _stat.S_ISREG(mode)):
        raise UsageError(f"{path} is {kind_of(mode)}: expected one checkpoint folder or file")
    if _stat.S_ISDIR(mode):
        children = sorted(
            n
            for n in (fm.listdir(path) or [])
            if _RUN_CHILD.search(n) and fm.identify(os.path.join(path, n)) is not None
        )
        if children:
            raise UsageError(
                f"{path} is a run folder holding {len(children)} checkpoints ({children[-1]}, ...): "
                "expected one checkpoint; pass one of them"
            )
    if fm.identify(path) is None:
        raise UsageError(
            f"{path}: not a recognised checkpoint; expected a checkpoint folder (checkpoint-N/, "
            "step-N/, global_stepN/, iter_N/) or file (*.safetensors, *.ckpt, *.pt)"
        )


def _values_check(result) -> tuple[ValuesSummary | None, bool, str]:
    d = result.deep
    verdicts = [
        f"{p.file}: {p.reason}"
        for p in result.problems
        if p.kind in ("not_resumable", "suspicious") or (d is not None and p.kind == "invalid")
    ]
    if d is None:
        return (
            None,
            False,
            "values not checked: "
            + (verdicts[0] if verdicts else f"checkpoint is {result.status}"),
        )
    summary = ValuesSummary(
        tensors=d.tensors,
        values=d.values,
        nonfinite_values=d.nonfinite_values,
        weights_norm=d.weights_norm,
        weights_dtype=d.weights_dtype,
        optimizer=d.optimizer.kind,
        optimizer_parameters=d.optimizer.parameters,
        parameters_with_moments=d.optimizer.with_moments,
        verdicts=verdicts,
    )
    # a model-only export is what a release usually is: "not resumable" fails only `--require resumable`
    ok = result.status == "valid" and not any(p.kind == "suspicious" for p in result.problems)
    norm = f"{d.weights_norm:.6g}" if d.weights_norm is not None else "n/a"
    detail = (
        f"{d.values} values in {d.float_tensors} float tensors, {d.nonfinite_values} NaN/Inf; "
        f"weights norm {norm}; optimizer {d.optimizer.kind} ({d.optimizer.with_moments}/"
        f"{d.optimizer.parameters} parameters with moments)"
    )
    if verdicts:
        detail = verdicts[0] if not ok else f"{detail}; {'; '.join(verdicts)}"
    return summary, ok, detail
