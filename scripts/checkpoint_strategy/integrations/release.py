"""Release-readiness gate for one checkpoint: validated, the required formats present, integrity
recorded (the checkpoint's own manifest verified, or a sha256 of every file)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from checkpoint_strategy.checkpoints.filechecks import Counter
from checkpoint_strategy.checkpoints.manifest import hash_file
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage import oserror_line
from checkpoint_strategy.integrations.checkpoints import api, first_problem, formats_present, now_iso
from checkpoint_strategy.integrations.models import FileChecksum, GateCheck, ReleaseGate

REQUIRE_CHOICES = ("safetensors", "full_state_dict", "sharded", "resumable")
CHUNK = 4 << 20


def parse_require(text: str) -> list[str]:
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    bad = [p for p in parts if p not in REQUIRE_CHOICES]
    if bad or not parts:
        raise UsageError(f"--require: expected a comma-separated list of {', '.join(REQUIRE_CHOICES)}, got {text!r}")
    return list(dict.fromkeys(parts))


def _files(checkpoint: str) -> dict[str, str]:
    """relative path -> path of every regular file (the manifest itself excluded)."""
    from checkpoint_strategy.checkpoints.manifest import list_files

    return list_files(checkpoint)


def sha256_file(path: str) -> str:
    """SHA-256 of one file, streamed in chunks (the validator's manifest hash)."""
    return hash_file(path, Counter(), algorithm="sha256")


def checksums(checkpoint: str) -> list[FileChecksum]:
    out = []
    for rel, full in sorted(_files(checkpoint).items()):
        try:
            out.append(FileChecksum(file=rel, bytes=os.path.getsize(full), sha256=sha256_file(full)))
        except OSError as exc:
            raise UsageError(oserror_line(exc, "read", full)) from None
    return out


def gate(checkpoint: str | os.PathLike, require: Iterable[str] = (), level: str = "quick") -> ReleaseGate:
    """Validate `checkpoint` and decide pass/fail. Never loads or executes checkpoint content."""
    path = os.fspath(checkpoint)
    required = list(dict.fromkeys(require))
    bad = [r for r in required if r not in REQUIRE_CHOICES]
    if bad:
        raise UsageError(f"require: unknown item {bad[0]!r}; expected {', '.join(REQUIRE_CHOICES)}")
    if level not in ("quick", "full"):
        raise UsageError(f"level must be quick or full, got {level!r}")
    ck = api()
    from checkpoint_strategy.checkpoints.manifest import manifest_path

    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or folder; expected a checkpoint folder or file")
    manifest = manifest_path(path)
    has_manifest = os.path.isfile(manifest)
    validated_at = now_iso()
    result = ck.validate_checkpoint(path, level=level, manifest="verify" if has_manifest else None)
    loads_ok = result.status == "valid"
    formats = formats_present(result)
    checks: list[GateCheck] = []
    reasons: list[str] = []

    whole = (f"{result.status} ({result.format}, {result.files_checked} files, "
             f"{'every byte read' if result.level == 'full' else 'headers read'})")
    if not loads_ok:
        whole = f"{result.status}: {first_problem(result)}"
        reasons.append(f"checkpoint is {result.status}: {first_problem(result)}")
    checks.append(GateCheck(name="checkpoint is whole", ok=loads_ok, detail=whole))

    for item in required:
        if item == "resumable":
            ok = result.resumable
            checks.append(GateCheck(name="optimizer state present (resumable)", ok=ok,
                                    detail="yes" if ok else "weights only: resuming would restart Adam"))
            if not ok:
                reasons.append("required resumable, but the checkpoint has no optimizer state")
            continue
        ok = item in formats
        checks.append(GateCheck(name=f"{item} present", ok=ok,
                                detail="yes" if ok else f"missing (present: {', '.join(formats) or 'none'})"))
        if not ok:
            reasons.append(f"required format {item} is missing (present: {', '.join(formats) or 'none'})")

    sums: list[FileChecksum] = []
    if has_manifest:
        ok = result.manifest == "verified"
        detail = f"{os.path.basename(manifest)} verified" if ok else "manifest does not match the files"
        checks.append(GateCheck(name="integrity manifest verified", ok=ok, detail=detail))
        if not ok and loads_ok:
            reasons.append(f"manifest {manifest} does not match the files")
    elif loads_ok:
        sums = checksums(path)
        total = sum(s.bytes for s in sums)
        checks.append(GateCheck(name="checksums recorded", ok=True,
                                detail=f"sha256 of {len(sums)} files ({total} bytes)"))
    gate_ok = loads_ok and not reasons
    return ReleaseGate(
        checkpoint=path, layout=result.format, step=result.step, level=result.level, validated_at=validated_at,
        loads_ok=loads_ok, status=result.status, formats_present=formats, required=required,
        resumable=result.resumable, sharded=result.sharded,
        integrity="manifest" if has_manifest else "checksums", manifest=manifest if has_manifest else None,
        checksums=sums, checks=checks, gate="pass" if gate_ok else "fail", reasons=reasons,
    )
