"""Checksum manifests, in the spirit of Megatron-LM's integrity.json: {"algorithm", "files"}.

Folder checkpoints get `<checkpoint>/integrity.json`; file checkpoints a sidecar
`<file>.integrity.json`. Hash: SHA-256 (hashlib, stdlib). Measured on this project's
machine: sha256 1.4 GB/s (SHA-NI), blake2b 0.54 GB/s, md5 0.6 GB/s; SHA-256 is also what
`sha256sum -c` and the Hugging Face Hub use, so a manifest can be checked without this tool.
Files are streamed in 4 MiB chunks: memory stays flat.

The manifest is what sees a flipped byte the formats cannot (DCP `.distcp` shards, Orbax/tensorstore
chunks, safetensors carry no checksum: validate/coverage.py). Training callbacks call
`write_checkpoint_manifest(path)` right after a save; `validate --manifest verify` checks it later.
"""

from __future__ import annotations

import hashlib
import json
import os

from checkpoint_strategy.atomic import atomic_write_text
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats.identify import MANIFEST_NAME, MANIFEST_SUFFIX
from checkpoint_strategy.storage import ReadError, oserror_line, read_json

ALGORITHM = "sha256"


def manifest_path(checkpoint: str) -> str:
    if os.path.isdir(checkpoint):
        return os.path.join(checkpoint, MANIFEST_NAME)
    return checkpoint + MANIFEST_SUFFIX


def _is_manifest(name: str) -> bool:
    return name == MANIFEST_NAME or (
        name.startswith("." + MANIFEST_NAME + ".") and name.endswith(".tmp")
    )


def list_files(checkpoint: str) -> dict[str, str]:
    """relative path -> absolute path of every regular file (symlinked folders not followed)."""
    if not os.path.isdir(checkpoint):
        return {os.path.basename(checkpoint): checkpoint}
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(checkpoint, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            if dirpath == checkpoint and _is_manifest(name):
                continue
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, checkpoint)] = full
    return out


def hash_file(path: str, counter: zr.Counter, update=None, algorithm: str = ALGORITHM) -> str:
    h = hashlib.new(algorithm)
    for chunk in fc.read_chunks(path, counter, update):
        h.update(chunk)
    return h.hexdigest()


#: hashlib names a manifest may use: fixed-length digests only (shake_* need a length), lower case.
ALGORITHMS = frozenset(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake"))


def write_manifest(checkpoint: str, counter: zr.Counter, update=None) -> str:
    """Hash every file and write the manifest whole. UsageError (exit 2, one line, nothing written)
    when a file cannot be read or the folder cannot be written (read-only, full)."""
    target = manifest_path(checkpoint)
    if os.path.islink(target):
        raise UsageError(
            f"{target} is a symbolic link: refusing to write the manifest through it; remove it"
        )
    files = {}
    try:
        for rel, full in list_files(checkpoint).items():
            files[rel] = {"size": os.path.getsize(full), "hash": hash_file(full, counter, update)}
    except OSError as exc:
        raise UsageError(oserror_line(exc, "read", checkpoint) + ": manifest not written") from None
    text = json.dumps({"algorithm": ALGORITHM, "files": files}, indent=1, sort_keys=True) + "\n"
    try:
        atomic_write_text(target, text)
    except OSError as exc:
        raise UsageError(
            oserror_line(exc, "write manifest", target) + ": nothing was written"
        ) from None
    return target


def verify_manifest(checkpoint: str, counter: zr.Counter, update=None) -> list[tuple[str, str]]:
    """Problems as (file, reason); empty when every file matches the manifest."""
    target = manifest_path(checkpoint)
    mname = os.path.basename(target)
    if not os.path.lexists(target):
        return [
            (mname, "no manifest to verify (write one with --manifest write after a good save)")
        ]
    try:
        data = read_json(target, mname, expect=dict)
    except ReadError as exc:
        return [(mname, f"unreadable manifest: {exc.reason}")]
    if not isinstance(data.get("files"), dict):
        return [(mname, 'manifest is not {"algorithm", "files"}')]
    algorithm = data.get("algorithm", ALGORITHM)
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        shown = (
            repr(algorithm)
            if isinstance(algorithm, str) and len(algorithm) < 40
            else "a non-name value"
        )
        return [
            (
                mname,
                f"unknown hash algorithm {shown}; expected one of {', '.join(sorted(ALGORITHMS))}",
            )
        ]
    problems: list[tuple[str, str]] = []
    present = list_files(checkpoint)
    for rel, entry in sorted(data["files"].items()):
        full = present.get(rel)
        if full is None:
            problems.append((rel, "missing: listed in the manifest"))
            continue
        if not isinstance(entry, dict):
            problems.append((rel, "bad manifest entry"))
            continue
        try:
            size = os.path.getsize(full)
            if isinstance(entry.get("size"), int) and size != entry["size"]:
                problems.append((rel, f"size changed: manifest {entry['size']} bytes, file {size}"))
                continue
            digest = hash_file(full, counter, update, algorithm)
        except (OSError, ReadError) as exc:
            problems.append((rel, fc._oserror(exc)))
            continue
        if digest != entry.get("hash"):
            problems.append(
                (rel, f"{algorithm} mismatch: content changed since the manifest was written")
            )
    for rel in sorted(set(present) - set(data["files"])):
        problems.append((rel, "not in the manifest (added after it was written)"))
    return problems


def write_checkpoint_manifest(checkpoint: str | os.PathLike) -> str:
    """Write the SHA-256 manifest of a checkpoint just saved (the folder's integrity.json, or FILE.integrity.json
    beside a single-file checkpoint) and return its path: for training callbacks, right after the save, so
    `validate --manifest verify` can later catch any byte that changed (the only check that sees a flipped
    byte inside DCP shards or Orbax arrays). Hashes the files as they are; validate first if the save itself
    is in doubt. UsageError (one line, nothing written) when the checkpoint is missing, a file cannot be
    read or the folder cannot be written."""
    path = os.fspath(checkpoint)
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such checkpoint; expected the folder or file just saved")
    return write_manifest(path, zr.Counter())


def verify_checkpoint_manifest(checkpoint: str | os.PathLike) -> list[tuple[str, str]]:
    """(file, reason) for every file that differs from the manifest written on save; empty when all match."""
    return verify_manifest(os.fspath(checkpoint), zr.Counter())
