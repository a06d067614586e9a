"""The framework's own loader is the oracle: every mutation it refuses, `validate --level full` and `--level deep`
call invalid (issue 40).

For each format the validator reads, a real checkpoint is made once per session by the real framework on CPU, then
mutated many times with fixed seeds (single-bit flips and truncations spread over every region of every file: zip
local headers, entry data, central directory and end records; pickles; JSON; safetensors headers and data; DCP
`.metadata` and the torch archives inside each `.distcp`; Orbax metadata and OCDBT files). Each mutated copy is
loaded by the framework's loader (`torch.load(weights_only=True)`, `safetensors.safe_open` reading every tensor, DCP's
`dcp_to_torch_save`, Orbax's restore) and validated in-process at full and deep. The rule: whenever the oracle
refuses, both levels say invalid (or incomplete); never an internal error. The accepted blind spot is the oracle
accepting (a flipped value bit that leaves finite numbers): we may say valid or not there. The counts of each run
are what docs/deep-validation.md quotes.
"""

from __future__ import annotations

import json
import os
import random
import struct
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from checkpoint_strategy.checkpoints.validate import validate_checkpoint
from checkpoint_strategy.errors import UsageError

MUTATIONS = 320          # per format, in CI (seeds fixed: SEED + i)
SEED = 40_000
TRUNCATE_EVERY = 6       # one mutation in six truncates the file, the others flip one bit


@dataclass
class Region:
    file: str            # relative to the checkpoint
    name: str
    start: int
    end: int


@dataclass
class Tally:
    mutations: int = 0
    refused: int = 0
    ours: Counter = field(default_factory=Counter)    # (level, status) -> count, over every mutation
    missed: list = field(default_factory=list)        # (what, level, status) the oracle refused and we passed
    crashed: list = field(default_factory=list)       # (what, level, error)

    def line(self, fmt: str) -> str:
        return (f"{fmt}: {self.mutations} mutations, oracle refused {self.refused}; full invalid "
                f"{self.ours['full', 'bad']}, deep invalid {self.ours['deep', 'bad']}; missed {len(self.missed)}, "
                f"internal errors {len(self.crashed)}")


# --------------------------------------------------------------------------- regions of a file

def zip_regions(rel: str, data: bytes, base: int = 0, label: str = "") -> list[Region]:
    """Every part of a zip archive at `base` of a file: each entry's local header and data (data.pkl: pickle,
    data/N: tensor data, the others: records), the central directory, the end records."""
    import io

    out = []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        cd_start = min((i.header_offset for i in infos), default=0)
        for info in infos:
            start = info.header_offset
            (nlen, xlen) = struct.unpack("<HH", data[start + 26:start + 30])
            body = start + 30 + nlen + xlen
            kind = ("pickle" if info.filename.endswith("data.pkl") else "data" if "/data/" in info.filename
                    else "record")
            out.append(Region(rel, f"{label}local header", base + start, base + body))
            if info.compress_size:
                out.append(Region(rel, f"{label}{kind} {info.filename.rsplit('/', 1)[-1]}", base + body,
                                  base + body + info.compress_size))
        eocd = data.rfind(b"PK\x05\x06")
        cd_start = struct.unpack("<I", data[eocd + 16:eocd + 20])[0]
        if cd_start == 0xFFFFFFFF:
            loc = data.rfind(b"PK\x06\x06")
            cd_start = struct.unpack("<Q", data[loc + 48:loc + 56])[0]
        end_records = data.rfind(b"PK\x06\x06") if b"PK\x06\x06" in data[cd_start:] else eocd
        out.append(Region(rel, f"{label}central directory", base + cd_start, base + end_records))
        out.append(Region(rel, f"{label}end records", base + end_records, base + len(data)))
    return out


def safetensors_regions(rel: str, data: bytes) -> list[Region]:
    (n,) = struct.unpack("<Q", data[:8])
    return [Region(rel, "header length", 0, 8), Region(rel, "JSON header", 8, 8 + n),
            Region(rel, "tensor data", 8 + n, len(data))]


def whole(rel: str, data: bytes, name: str) -> list[Region]:
    return [Region(rel, name, 0, len(data))] if data else []


# --------------------------------------------------------------------------- the run

@dataclass
class Subject:
    path: Path                          # the checkpoint (file or folder) as validate is given it
    regions: list[Region]
    oracle: Callable[[Path], None]       # raises when the framework's loader refuses the checkpoint


def mutate(subject: Subject, originals: dict[str, bytes], i: int) -> tuple[str, str, bytes]:
    """Apply mutation i (seeded); (description, file, new bytes)."""
    rng = random.Random(SEED + i)
    kinds = sorted({r.name for r in subject.regions})   # every kind of region in turn, then one of that kind
    region = rng.choice([r for r in subject.regions if r.name == kinds[i % len(kinds)]])
    data = bytearray(originals[region.file])
    pos = rng.randrange(region.start, max(region.start + 1, region.end))
    if i % TRUNCATE_EVERY == TRUNCATE_EVERY - 1:
        return f"{region.file}: {region.name}: truncated at {pos}", region.file, bytes(data[:pos])
    bit = rng.randrange(8)
    data[pos] ^= 1 << bit
    return f"{region.file}: {region.name}: bit {bit} of byte {pos} flipped", region.file, bytes(data)


def _target(subject: Subject, rel: str) -> Path:
    return subject.path / rel if subject.path.is_dir() else subject.path


def run_mutations(subject: Subject, n: int = MUTATIONS) -> Tally:
    originals = {r.file: _target(subject, r.file).read_bytes() for r in subject.regions}
    tally = Tally()
    try:
        for i in range(n):
            what, rel, data = mutate(subject, originals, i)
            target = _target(subject, rel)
            target.write_bytes(data)
            tally.mutations += 1
            refused = _refuses(subject, what)
            tally.refused += refused
            status = "valid"
            for level in ("full", "deep"):
                # deep runs every check of full first and adds its own: a checkpoint full calls invalid is invalid
                # at deep with the same problems (asserted on the unmutated ones), so deep is run where full passed
                status = _ours(subject.path, level, what, tally) if status == "valid" else status
                tally.ours[level, "bad" if status in ("invalid", "incomplete") else "good"] += 1
                if refused and status not in ("invalid", "incomplete"):
                    tally.missed.append((what, level, status, refused))
            target.write_bytes(originals[rel])
    finally:
        for rel, data in originals.items():
            _target(subject, rel).write_bytes(data)
    return tally


def _refuses(subject: Subject, what: str) -> bool:
    try:
        subject.oracle(subject.path)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - any refusal of the framework's loader (DCP's CheckpointException is one)
        return True
    return False


def _ours(path: Path, level: str, what: str, tally: Tally) -> str:
    try:
        return validate_checkpoint(path, level).status
    except UsageError as exc:
        return f"usage error: {exc}"
    except Exception as exc:  # noqa: BLE001 - exit 3: recorded, the test fails
        tally.crashed.append((what, level, f"{type(exc).__name__}: {exc}"))
        return "crashed"


def assert_rule(fmt: str, tally: Tally, record: dict) -> None:
    record[fmt] = tally
    print(tally.line(fmt))
    assert not tally.crashed, f"{fmt}: internal errors: {tally.crashed[:5]}"
    where = Counter(f"{m[0].split(': ')[1]} @{m[1]}" for m in tally.missed)
    assert not tally.missed, f"{fmt}: the loader refused, we said valid: {dict(where)}; first: {tally.missed[:6]}"
    assert tally.mutations >= 300


@pytest.fixture(scope="module")
def record():
    counts: dict[str, Tally] = {}
    yield counts
    if os.environ.get("ORACLE_COUNTS"):
        with open(os.environ["ORACLE_COUNTS"], "a") as fh:
            for fmt, tally in counts.items():
                fh.write(tally.line(fmt) + "\n")


# --------------------------------------------------------------------------- checkpoints and their oracles

def _model_and_optimizer():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return model, opt


def torch_load_oracle(path: Path) -> None:
    import torch

    torch.load(path, weights_only=True, map_location="cpu")


@pytest.fixture(scope="session")
def oracle_torch_zip(tmp_path_factory) -> Subject:
    import torch

    model, opt = _model_and_optimizer()
    path = tmp_path_factory.mktemp("oracle-torch") / "step-3.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": 3}, path)
    return Subject(path, zip_regions(".", path.read_bytes()), torch_load_oracle)


@pytest.fixture(scope="session")
def oracle_lightning_ckpt(tmp_path_factory) -> Subject:
    """A Lightning ModelCheckpoint file of a two-step run (Trainer on CPU)."""
    pl = pytest.importorskip("pytorch_lightning", reason="Lightning is in the test extra")
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, _i):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("oracle-lightning")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accelerator="cpu", default_root_dir=str(root))
    trainer.fit(Tiny(), data)
    path = root / "epoch=0-step=2.ckpt"
    trainer.save_checkpoint(str(path))
    return Subject(path, zip_regions(".", path.read_bytes()), torch_load_oracle)


def safetensors_oracle(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        for key in fh.keys():
            fh.get_tensor(key)


@pytest.fixture(scope="session")
def oracle_safetensors(tmp_path_factory) -> Subject:
    from safetensors.torch import save_file

    model, _opt = _model_and_optimizer()
    path = tmp_path_factory.mktemp("oracle-st") / "model.safetensors"
    save_file(model.state_dict(), str(path), metadata={"format": "pt"})
    return Subject(path, safetensors_regions(".", path.read_bytes()), safetensors_oracle)


def sharded_oracle(folder: Path) -> None:
    """What transformers' sharded loading does: the index names each tensor's shard; every shard opens and every
    tensor it is said to hold is read."""
    from safetensors import safe_open

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    by_shard: dict[str, list[str]] = {}
    for key, shard in index["weight_map"].items():
        by_shard.setdefault(shard, []).append(key)
    for shard, keys in by_shard.items():
        with safe_open(str(folder / shard), framework="pt") as fh:
            names = set(fh.keys())
            for key in names:
                fh.get_tensor(key)
            missing = set(keys) - names
            if missing:
                raise KeyError(f"{shard} lacks {sorted(missing)[:3]}")


@pytest.fixture(scope="session")
def oracle_sharded(tmp_path_factory) -> Subject:
    from huggingface_hub import save_torch_state_dict

    model, _opt = _model_and_optimizer()
    folder = tmp_path_factory.mktemp("oracle-sharded") / "final"
    folder.mkdir()
    save_torch_state_dict(model.state_dict(), str(folder), max_shard_size=400)
    regions: list[Region] = []
    for p in sorted(folder.iterdir()):
        data = p.read_bytes()
        regions += (safetensors_regions(p.name, data) if p.suffix == ".safetensors" else whole(p.name, data, "index JSON"))
    assert len([p for p in folder.iterdir() if p.suffix == ".safetensors"]) >= 2
    return Subject(folder, regions, sharded_oracle)


def dcp_oracle(folder: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = folder.parent / "oracle-out.pt"
    try:
        dcp_to_torch_save(str(folder), str(out))
    finally:
        out.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def oracle_dcp(tmp_path_factory) -> Subject:
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    model, opt = _model_and_optimizer()
    folder = tmp_path_factory.mktemp("oracle-dcp") / "step-3"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=str(folder))
    meta = FileSystemReader(str(folder)).read_metadata()
    regions = whole(".metadata", (folder / ".metadata").read_bytes(), ".metadata pickle")
    for info in sorted({(s.relative_path, s.offset, s.length) for s in meta.storage_data.values()}):
        rel, off, length = info
        blob = (folder / rel).read_bytes()[off:off + length]
        if blob[:4] == b"PK\x03\x04":
            regions += zip_regions(rel, blob, base=off, label="embedded ")
        else:
            regions.append(Region(rel, "raw item", off, off + length))
    return Subject(folder, regions, dcp_oracle)


def orbax_oracle(folder: Path) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.restore(str(folder / "default"))


@pytest.fixture(scope="session")
def oracle_orbax(tmp_path_factory) -> Subject:
    pytest.importorskip("orbax.checkpoint", reason="Orbax is in the frameworks extra: pip install orbax-checkpoint "
                                                   "'jax[cpu]' (or '.[test,frameworks]')")
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    root = tmp_path_factory.mktemp("oracle-orbax")
    with ocp.CheckpointManager(str(root)) as manager:
        manager.save(3, args=ocp.args.StandardSave({"params": {"w": jnp.arange(64.0).reshape(8, 8),
                                                              "b": jnp.ones(8)},
                                                   "opt_state": {"mu": jnp.zeros(8)}}))
        manager.wait_until_finished()
    folder = root / "3"
    regions: list[Region] = []
    # (Orbax names its OCDBT data files at random: ordered by folder and size, the seeds pick the same parts)
    for p in sorted((x for x in folder.rglob("*") if x.is_file()), key=lambda x: (x.parent.name == "d", str(x.parent),
                                                                                  x.stat().st_size, x.name)):
        rel = str(p.relative_to(folder))
        data = p.read_bytes()
        regions += whole(rel, data, "JSON" if data[:1] == b"{" else "binary")
    return Subject(folder, regions, orbax_oracle)


# --------------------------------------------------------------------------- the rule, per format

@pytest.mark.parametrize("fixture", ["oracle_torch_zip", "oracle_lightning_ckpt", "oracle_safetensors",
                                     "oracle_sharded", "oracle_dcp", "oracle_orbax"])
def test_every_mutation_the_loader_refuses_is_invalid_at_full_and_deep(fixture, request, record):
    subject: Subject = request.getfixturevalue(fixture)
    subject.oracle(subject.path)   # the unmutated checkpoint loads
    for level in ("full", "deep"):
        assert validate_checkpoint(subject.path, level).status == "valid", level
    assert_rule(fixture.removeprefix("oracle_"), run_mutations(subject), record)


def test_mutations_reach_every_region(oracle_torch_zip, oracle_dcp):
    """The regions are what the docstring says: a torch zip's headers, pickle, records, data, central directory and
    end records; a DCP folder's .metadata and the parts of every archive embedded in its .distcp."""
    names = {r.name.split(" ")[0] for r in oracle_torch_zip.regions}
    assert {"local", "pickle", "record", "data", "central", "end"} <= names
    dcp_names = {r.name for r in oracle_dcp.regions}
    assert ".metadata pickle" in dcp_names and "embedded pickle data.pkl" in dcp_names
    assert any(n.startswith("embedded record") for n in dcp_names)

