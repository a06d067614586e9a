"""`convert` on checkpoints the real frameworks wrote on CPU (slow: tests/conftest.py SLOW_MODULES).

HF Trainer (model.safetensors, optimizer.pt), a pytorch_model.bin as transformers 4 wrote it, Lightning
ModelCheckpoint .ckpt, FSDP2 + DCP from a 2-process torchrun, DeepSpeed ZeRO-1/2/3 from 2-process torchruns.
After each conversion both sides are loaded with torch and every tensor compared exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import convertruns
import pytest

torch = pytest.importorskip("torch")


def _st(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _equal(a: dict, b: dict, keys=None) -> None:
    for k in keys or a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _logits(folder: Path):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(str(folder))
    model.eval()
    with torch.no_grad():
        return model(torch.arange(16).unsqueeze(0) % 64).logits


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory) -> tuple[Path, Path]:
    return convertruns.build_dcp_fsdp2(tmp_path_factory.mktemp("fsdp2"))


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["zero1", "zero2", "zero3"])
def zero(request, tmp_path_factory) -> Path:
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the frameworks extra")
    return convertruns.build_zero(
        tmp_path_factory.mktemp(f"zero{request.param}"), stage=request.param, world=2
    )


def _zero_moments(folder: Path, expected: dict, key: str) -> dict:
    """The Adam moment `key` per parameter, rebuilt with torch from the raw rank partitions: ZeRO-1/2 one flat
    vector (each rank's partition cut to its fp32 length, in rank order), ZeRO-3 ceil(numel / 2) values per rank
    at the same offset."""
    import math

    osds = [
        torch.load(folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", weights_only=False)[
            "optimizer_state_dict"
        ]
        for r in (0, 1)
    ]
    out, at = {}, 0
    if "fp32_flat_groups" in osds[0]:
        for name, v in expected.items():
            part = math.ceil(v.numel() / 2)
            out[name] = torch.cat(
                [o["optimizer_state_dict"]["state"][0][key][at : at + part] for o in osds]
            )[: v.numel()].view(v.shape)
            at += part
        return out
    flat = torch.cat(
        [
            o["base_optimizer_state"]["state"][0][key][
                : o["single_partition_of_fp32_groups"][0].numel()
            ]
            for o in osds
        ]
    )
    for name, v in expected.items():
        out[name] = flat[at : at + v.numel()].view(v.shape)
        at += v.numel()
    return out


def test_hf_trainer_checkpoint_to_dcp_and_back_to_safetensors_same_logits(
    cli_run, hf_run, tmp_path
):
    ckpt = hf_run.output_dir / "checkpoint-100"
    r = cli_run("convert", ckpt, tmp_path / "dcp", "--to", "dcp", "--format", "json")
    assert r.rc == 0 and r.json()["check"]["ok"], r.out
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / "dcp"), str(tmp_path / "back.pt"))
    src = _st(ckpt)
    _equal(src, torch.load(tmp_path / "back.pt", weights_only=True))
    r = cli_run(
        "convert", tmp_path / "dcp", tmp_path / "st", "--to", "safetensors", "--format", "json"
    )
    assert r.rc == 0, r.err
    _equal(src, _st(tmp_path / "st"))
    shutil.copy(ckpt / "config.json", tmp_path / "st" / "config.json")
    assert torch.equal(_logits(ckpt), _logits(tmp_path / "st"))


def test_pytorch_model_bin_to_safetensors_from_pretrained_same_logits(cli_run, hf_run, tmp_path):
    """transformers 5 no longer writes .bin (save_safetensors is gone); transformers 4's save_pretrained(
    safe_serialization=False) was torch.save(model.state_dict()) with lm_head sharing wte's storage: made here
    from the Trainer's checkpoint the same way."""
    from transformers import GPT2LMHeadModel

    ckpt = hf_run.output_dir / "checkpoint-100"
    model = GPT2LMHeadModel.from_pretrained(str(ckpt))
    sd = model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()
    folder = tmp_path / "bin"
    folder.mkdir()
    torch.save(sd, folder / "pytorch_model.bin")
    shutil.copy(ckpt / "config.json", folder / "config.json")
    r = cli_run("convert", folder, tmp_path / "st", "--to", "safetensors", "--format", "json")
    report = r.json()
    assert r.rc == 0 and report["check"]["tied"] == 1, r.out
    got = _st(tmp_path / "st")
    src = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert set(src) - set(got) == {"lm_head.weight"}
    _equal(got, src)
    assert torch.equal(_logits(ckpt), _logits(tmp_path / "st"))
    assert cli_run("validate", tmp_path / "st", "--level", "deep").rc == 0


def test_hf_trainer_optimizer_pt_to_dcp_keeps_every_moment(cli_run, hf_run, tmp_path):
    opt = hf_run.output_dir / "checkpoint-100" / "optimizer.pt"
    r = cli_run("convert", opt, tmp_path / "dcp", "--to", "dcp", "--format", "json")
    report = r.json()
    assert r.rc == 0 and report["check"]["optimizer"]["complete"], r.out
    src = torch.load(opt, weights_only=True)
    assert report["check"]["optimizer"]["parameters"] == len(src["state"])
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / "dcp"), str(tmp_path / "back.pt"))
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    for pid, st in src["state"].items():
        for k, v in st.items():
            assert torch.equal(back["state"][str(pid)][k], v), (pid, k)
    assert back["param_groups"] == src["param_groups"]


def test_lightning_ckpt_to_safetensors_and_full(cli_run, lightning_run, tmp_path):
    ckpt = lightning_run.ckpt_files[-1]
    src = torch.load(ckpt, weights_only=False)
    r = cli_run("convert", ckpt, tmp_path / "st", "--to", "safetensors", "--format", "json")
    report = r.json()
    assert (
        r.rc == 0 and report["selected"] == "state_dict" and report["source_format"] == "lightning"
    ), r.out
    assert "optimizer_states" in report["left_out"][0]
    _equal(src["state_dict"], _st(tmp_path / "st"))
    r = cli_run("convert", ckpt, tmp_path / "full.pt", "--to", "full", "--format", "json")
    assert r.rc == 0 and r.json()["check"]["optimizer"]["complete"], r.out
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    _equal(src["state_dict"], full["state_dict"])
    for pid, st in src["optimizer_states"][0]["state"].items():
        for k, v in st.items():
            assert torch.equal(full["optimizer_states"][0]["state"][pid][k], v)
    assert full["global_step"] == src["global_step"]


def test_fsdp2_dcp_from_two_ranks_to_full_and_safetensors(cli_run, fsdp2, tmp_path):
    folder, reference = fsdp2
    assert sorted(p.name for p in folder.glob("__*_0.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    ref = torch.load(reference, weights_only=False)
    r = cli_run("convert", folder, tmp_path / "full.pt", "--to", "full", "--format", "json")
    assert r.rc == 0 and r.json()["check"]["optimizer"]["complete"], r.out
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    _equal(ref["model"], full["model"])
    for fqn, st in ref["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(full["optimizer"]["state"][fqn][k], v), (fqn, k)
    r = cli_run("convert", folder, tmp_path / "st", "--to", "safetensors")
    assert r.rc == 0, r.err
    _equal(ref["model"], _st(tmp_path / "st"))
    assert cli_run("validate", tmp_path / "full.pt", "--level", "deep").rc == 0
    # issue 26: the consolidated file torch's own dcp_to_torch_save writes, checked against its shards
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(folder), str(tmp_path / "torch-consolidated.pt"))
    r = cli_run(
        "convert", folder, tmp_path / "torch-consolidated.pt", "--check-only", "--format", "json"
    )
    assert r.rc == 0 and r.json()["check"]["equal"] == r.json()["check"]["compared"] == 16, r.out


def test_dcp_written_by_convert_loads_in_one_and_two_process_runs(cli_run, fsdp2, tmp_path):
    _folder, reference = fsdp2
    ref = torch.load(reference, weights_only=False)
    r = cli_run("convert", reference, tmp_path / "dcp", "--to", "dcp")
    assert r.rc == 0, r.err
    assert sorted(p.name for p in (tmp_path / "dcp").iterdir()) == [".metadata", "__0_0.distcp"]
    for world in (1, 2):
        loaded = torch.load(
            convertruns.load_dcp_in_run(tmp_path, tmp_path / "dcp", world), weights_only=True
        )
        _equal(ref["model"], loaded)


def test_zero_two_ranks_to_full_matches_zero_to_fp32_and_partitions(cli_run, zero, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    expected = get_fp32_state_dict_from_zero_checkpoint(str(zero.parent), tag=zero.name)
    r = cli_run(
        "convert", zero.parent, tmp_path / "full.pt", "--to", "full", "--format", "json"
    )  # via `latest`
    report = r.json()
    assert r.rc == 0 and report["source_format"].startswith("deepspeed-zero"), r.out
    assert report["check"]["optimizer"]["complete"] and report["check"]["optimizer"][
        "parameters"
    ] == len(expected)
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    _equal({k: v.contiguous() for k, v in expected.items()}, full["model"])
    deep = cli_run("validate", tmp_path / "full.pt", "--level", "deep", "--format", "json")
    opt = deep.json()["checkpoints"][0]["deep"]["optimizer"]
    assert deep.rc == 0 and opt["with_moments"] == opt["parameters"] == len(expected), deep.out
    for key in ("exp_avg", "exp_avg_sq"):
        for name, v in _zero_moments(zero, expected, key).items():
            assert torch.equal(full["optimizer"]["state"][name][key], v), (name, key)
    r = cli_run("convert", zero, tmp_path / "st", "--to", "safetensors")
    assert r.rc == 0, r.err
    _equal({k: v.contiguous() for k, v in expected.items()}, _st(tmp_path / "st"))
    assert cli_run("validate", tmp_path / "st", "--level", "deep").rc == 0
    # zero_to_fp32's own output (views of one flat vector, torch.save'd) checked against the rank files
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    convert_zero_checkpoint_to_fp32_state_dict(
        str(zero.parent), str(tmp_path / "ds"), tag=zero.name, safe_serialization=False
    )
    r = cli_run(
        "convert", zero, tmp_path / "ds" / "pytorch_model.bin", "--check-only", "--format", "json"
    )
    assert r.rc == 0 and r.json()["check"]["equal"] == len(expected), r.out


def test_validate_names_the_convert_command_and_it_runs(cli_run, zero, tmp_path, copy_of):
    """The command validate --target-gpus prints, run as printed (issue 24: the exact command for the layout)."""
    import shlex

    run = copy_of(zero.parent, "run")
    r = cli_run("validate", run / zero.name, "--target-gpus", "4", "--format", "json")
    command = r.json()["hardware_move"]["convert"]
    # written beside the run folder, never into it (issue 42)
    assert (
        command == f"checkpoint-strategy convert {run / zero.name} {run}-{zero.name}-dcp --to dcp"
    )
    argv = shlex.split(command)
    assert cli_run(*argv[1:]).rc == 0
    assert (run.parent / f"run-{zero.name}-dcp" / ".metadata").is_file()
    assert not (run / f"{zero.name}-dcp").exists()
    from checkpoint_strategy.recovery.advice import _sharded_note

    assert _sharded_note(str(run / zero.name)) and command in _sharded_note(str(run / zero.name))[0]


def test_zero_with_a_rank_file_missing_exit_2(cli_run, zero, copy_of, tmp_path):
    broken = copy_of(zero, "global_step4")
    (broken / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    cli_run("convert", broken, tmp_path / "out", "--to", "safetensors").usage_error(
        "partition_count says 2"
    )
    assert not (tmp_path / "out").exists()
    # validate sees the same tag as incomplete (dp_world_size 2 in the model states), never valid and resumable
    r = cli_run("validate", broken, "--format", "json")
    (c,) = r.json()["checkpoints"]
    assert r.rc == 1 and c["status"] == "incomplete", c
    assert any("optimizer shard for ZeRO rank 1" in p["reason"] for p in c["problems"]), c[
        "problems"
    ]


def test_zero_buffer_or_shared_name_over_a_parameter_is_refused_by_name(
    cli_run, zero, copy_of, tmp_path
):
    """The real run's model states with a buffer_names / shared_params entry naming a parameter (issue 40: it
    replaced that weight silently, PASS): refused by name, nothing written; the run itself converts."""
    for edit in ("buffer_names", "shared_params"):
        broken = copy_of(zero, f"global_step4-{edit}")
        path = (
            broken / "mp_rank_00_model_states.pt"
        )  # ZeRO-3: each rank's own, convert reads rank 0's
        path = path if path.exists() else broken / "zero_pp_rank_0_mp_rank_00_model_states.pt"
        states = torch.load(path, weights_only=False)  # the test may unpickle DeepSpeed's own file
        first = next(iter(states["param_shapes"][0]))
        other = list(states["param_shapes"][0])[-1]
        if edit == "buffer_names":
            states["buffer_names"] = [*states.get("buffer_names", []), first]
            states["module"][first] = torch.zeros(states["param_shapes"][0][first])
        else:
            states["shared_params"] = {first: other}
        torch.save(states, path)
        line = cli_run("convert", broken, tmp_path / f"{edit}.pt", "--to", "full").usage_error(
            "replace the other"
        )
        assert first in line and not (tmp_path / f"{edit}.pt").exists()
