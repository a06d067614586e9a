"""What each validation level can and cannot see, per format (the report's `blind_spots`).

The levels read structure, not meaning: quick reads headers and sizes; full reads every byte and checks
the CRC-32 that torch zip archives carry per entry; deep also reads every tensor value (NaN/Inf, norms,
optimizer state; each item of a DCP `.distcp` is a torch archive with its CRC-32 since torch 2.4). A format
without a checksum of its own (safetensors, raw DCP items, Orbax/tensorstore chunks) can carry a flipped byte that
still decodes to a finite number: no level sees it (Orbax's zstd frames are decoded at full only with the optional
zstandard package: without it the line says so). The SHA-256 manifest does (`--manifest write` right after a save, `--manifest verify` later;
`manifest.write_checkpoint_manifest` from a training callback).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from checkpoint_strategy.formats import zstd

#: format -> the data families it holds (a torch zip archive, safetensors, DCP shards, Orbax arrays)
FAMILIES: dict[str, tuple[str, ...]] = {
    "hf-trainer": ("zip", "safetensors"),
    "safetensors": ("safetensors",),
    "lightning": ("zip",),
    "torch": ("zip",),
    "deepspeed": ("zip",),
    "megatron": ("zip",),
    "nemo": ("zip",),
    "dcp": ("dcp",),
    "torchtitan": ("dcp",),
    "orbax": ("orbax",),
}


def families(fmt: str, path: str, names: list[str] | None = None) -> tuple[str, ...]:
    """The data families of one checkpoint: its format's, plus DCP shards where a sharded Lightning/NeMo
    folder or a Megatron torch_dist iteration holds a .metadata, or an HF Trainer FSDP save its folders.
    `names`: an HF Trainer folder's listing the caller already has (the folder is not listed again)."""
    fams = FAMILIES.get(fmt, ())
    if fmt in ("lightning", "nemo", "megatron") and os.path.isdir(path):
        inner = (
            os.path.join(path, "weights") if os.path.isdir(os.path.join(path, "weights")) else path
        )
        if os.path.lexists(os.path.join(inner, ".metadata")):
            fams = (*fams, "dcp")
    elif fmt == "hf-trainer" and (
        names is not None or os.path.isdir(path)
    ):  # FSDP saves: pytorch_model_fsdp_0/ (DCP)
        if names is None:
            try:
                names = os.listdir(path)
            except OSError:
                names = []
        if any(n.startswith("pytorch_model_fsdp") for n in names):
            fams = (*fams, "dcp")
    return fams


_MANIFEST = "a SHA-256 manifest sees it (--manifest write on save, --manifest verify later)"
_NAMES = {
    "zip": "torch zip archives (.pt/.bin/.ckpt)",
    "safetensors": "safetensors tensor data",
    "dcp": "DCP shard data (.distcp)",
    "orbax": "Orbax/tensorstore array data",
}


def _line(family: str, level: str) -> str | None:
    """One family at one level: what it cannot see and what would; None when the level sees byte damage."""
    if family == "zip":
        return (
            None
            if level != "quick"
            else (
                f"{_NAMES[family]}: quick reads headers and sizes only, so a flipped "
                "byte is not seen; --level full checks the CRC-32 of every entry"
            )
        )
    if (
        family == "dcp"
    ):  # since torch 2.4 each item of a .distcp is a torch archive: full checks its CRC-32
        return (
            f"{_NAMES[family]}: quick reads .metadata and sizes only; --level full checks the CRC-32 of every "
            "item's torch archive"
            if level == "quick"
            else f"{_NAMES[family]}: items stored as raw bytes (DCP before torch 2.4) have no checksum; a flipped byte "
            f"there that leaves a finite value is not seen (deep sees NaN/Inf); {_MANIFEST}"
        )
    if (
        family == "orbax"
    ):  # full checks the CRC-32C of every OCDBT node (small arrays are stored inside them)
        return _orbax_line(level)
    return (
        f"{_NAMES[family]}: no checksum in the format; a flipped byte that leaves a finite value is not seen at "
        f"any level (deep sees NaN/Inf); {_MANIFEST}"
    )


def _orbax_line(level: str) -> str:
    """Orbax values outside OCDBT's nodes (zstd frames of big arrays' zarr chunks): full walks each frame and, with
    the optional zstandard package, decodes it (formats/zstd.py); Orbax's frames carry no content checksum."""
    where = (
        f"{_NAMES['orbax']}: values outside OCDBT's nodes (zstd frames of big arrays' zarr chunks)"
    )
    if level == "quick":
        return f"{where} are read at --level full only, so a flipped byte there is not seen at quick; {_MANIFEST}"
    if not zstd.available():
        return (
            f"{where} are walked but not decoded, so a flipped byte there is not seen; install zstandard to check "
            f"Orbax values stored as zstd frames; {_MANIFEST}"
        )
    return (
        f"{where} are decoded, but carry no checksum: a flipped byte that still decodes is not seen; "
        f"{_MANIFEST}"
    )


def blind_spots(
    found: Iterable[tuple[str, ...]], level: str, manifest: str | None = None
) -> list[str]:
    """One line per data family among `found` (each checkpoint's `families`) that this level cannot fully
    see; empty with --manifest verify (every byte is then compared with the SHA-256 recorded on save)."""
    if manifest == "verify":
        return []
    present = {fam for fams in found for fam in fams}
    order = ("zip", "safetensors", "dcp", "orbax")
    return [line for fam in order if fam in present and (line := _line(fam, level)) is not None]
