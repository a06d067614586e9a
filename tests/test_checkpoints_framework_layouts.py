"""formats/frameworks.py: what a framework's own metadata says, read without executing it."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats import frameworks as fl


def model_states(tmp_path, state) -> str:
    """A torch-style zip archive holding data.pkl (written with pickle.dumps; never loaded here)."""
    path = tmp_path / "mp_rank_00_model_states.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("mp_rank_00_model_states/data.pkl", pickle.dumps(state, protocol=2))
    return str(path)


def test_zero_stage_and_world_size_from_the_pickle(tmp_path):
    state = {"module": {"w": [1, 2]}, "dp_world_size": 4, "ds_config": {
        "pipeline": {"stage": 7}, "zero_optimization": {"offload": {"x": 1}, "stage": 2}}}
    assert fl.deepspeed_zero_layout(fl.zip_pickle(model_states(tmp_path, state))) == (2, 4)


def test_no_zero_config_means_unknown(tmp_path):
    assert fl.deepspeed_zero_layout(fl.zip_pickle(model_states(tmp_path, {"module": {}}))) == (None, None)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_pickles_never_raise(data):
    stage, dp = fl.deepspeed_zero_layout(data)
    assert stage is None or isinstance(stage, int)
    assert dp is None or isinstance(dp, int)


def test_zip_pickle_refuses_fifos_truncation_and_non_zips(tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    assert fl.zip_pickle(str(fifo)) is None
    good = model_states(tmp_path, {"dp_world_size": 1})
    raw = open(good, "rb").read()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(raw[: len(raw) // 2])
    assert fl.zip_pickle(str(cut)) is None
    (tmp_path / "text.pt").write_text("not a zip")
    assert fl.zip_pickle(str(tmp_path / "text.pt")) is None
    assert fl.zip_pickle(str(tmp_path / "missing.pt")) is None


@pytest.mark.parametrize("meta, expected", [
    ({"tree_metadata": {"('opt_state', 'mu')": {"key_metadata": [{"key": "opt_state"}, {"key": "mu"}]}}}, True),
    ({"tree_metadata": {"('params', 'opt')": {"key_metadata": [{"key": "params"}, {"key": "opt"}]}}}, False),
    ({"tree_metadata": {"x": {"key_metadata": "opt"}}}, False),
    ({"tree_metadata": []}, False),
    ([1, 2], False),
    (None, False),
])
def test_orbax_optimizer_key_at_the_top_of_the_tree(meta, expected):
    assert fl.orbax_item_has_optimizer(meta) is expected


def test_torchtitan_reason_only_for_model_only_keys():
    assert fl.torchtitan_model_only_reason({"tok_embeddings", "layers", "optimizer", "train_state"}, 10) is None
    assert fl.torchtitan_model_only_reason(set(), 10) is None
    reason = fl.torchtitan_model_only_reason({"tok_embeddings", "layers", "norm", "output"}, 20)
    assert reason.startswith("not resumable") and "step-20" in reason and "last_save_model_only" in reason


def _orbax_entry(keys: list[tuple[str, int]], shape=(2, 3)) -> dict:
    return {"key_metadata": [{"key": k, "key_type": t} for k, t in keys],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": list(shape)}}


def test_orbax_params_are_a_value_or_a_refusal_by_type():
    """orbax_params: the params, a Refused with the reason, or None (a layout it does not judge); never a bare str."""
    tree = {"('params', 'w')": _orbax_entry([("params", 2), ("w", 2)]), "('opt', '0')": _orbax_entry([("opt", 2),
                                                                                                      ("0", 1)])}
    assert fl.orbax_params({"use_ocdbt": True, "tree_metadata": tree}) == {"params.w": [2, 3], "opt.0": [2, 3]}
    assert fl.orbax_params({"use_ocdbt": True}) == fl.Refused("no tree_metadata object")
    assert fl.orbax_params({"use_ocdbt": "yes", "tree_metadata": tree}) == fl.Refused("use_ocdbt is not true or false")
    flipped = {"('opt', 'x')": _orbax_entry([("opt", 2), ("x", 1)])}
    got = fl.orbax_params({"use_ocdbt": True, "tree_metadata": flipped})
    assert isinstance(got, fl.Refused) and "sequence key 'x' that is not an index" in got.reason
    assert fl.orbax_params(["not", "a", "dict"]) is None and fl.orbax_params({"tree_metadata": {"a": 1}}) is None
