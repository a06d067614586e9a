"""Pydantic models of `convert`: what was written, what was left out, and the tensor-by-tensor check."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Target = Literal["safetensors", "full", "dcp"]
RowStatus = Literal["equal", "tied", "missing", "dtype differs", "shape differs", "bytes differ"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutputFile(_Strict):
    name: str = Field(description="file name relative to the destination")
    bytes: int


class TensorRow(_Strict):
    """One source tensor compared with the destination."""

    name: str
    dtype: str
    shape: list[int]
    sha256: str = Field(description="sha256 of the source tensor's bytes (row-major, as stored)")
    status: RowStatus
    detail: str = Field(
        "", description="tied: the name that holds its bytes; otherwise what differs"
    )


class OptimizerCompare(_Strict):
    """Optimizer state found in the source and in the destination (per-parameter entries)."""

    parameters: int = Field(description="parameters with state in the source")
    with_moments: int = Field(
        description="of them, with every per-parameter entry the source holds (exp_avg, "
        "exp_avg_sq, momentum_buffer, Adafactor's factored moments...) in the "
        "destination"
    )
    with_step: int = Field(description="of them, with a step in the destination")
    complete: bool


class ConvertCheck(_Strict):
    ok: bool = Field(
        description="every source tensor is in the destination with equal dtype, shape and bytes"
    )
    compared: int
    equal: int
    tied: int = Field(
        0, description="tied names left out (their bytes are another name's, checked equal)"
    )
    problems: int
    extra: list[str] = Field(
        default_factory=list, description="destination tensors the source does not hold"
    )
    optimizer: Optional[OptimizerCompare] = None
    rows: list[TensorRow]


class ConvertReport(_Strict):
    mode: Literal["convert", "check-only"]
    source: str
    source_format: str = Field(
        description="torch, lightning, safetensors, dcp or deepspeed-zero<N>"
    )
    destination: str
    target: Target
    written: bool = Field(
        description="the destination was renamed into place (false: check-only, or a failed "
        "check left nothing)"
    )
    files: list[OutputFile] = Field(default_factory=list)
    tensors: int = Field(0, description="tensors written")
    bytes: int = Field(0, description="tensor bytes written")
    selected: Optional[str] = Field(
        None, description="the subtree written as weights (e.g. state_dict), null = all"
    )
    left_out: list[str] = Field(
        default_factory=list, description="what the destination does not carry, and why"
    )
    notes: list[str] = Field(default_factory=list)
    check: ConvertCheck
    next_steps: list[str] = Field(default_factory=list)


SCHEMAS = {"convert-report.schema.json": ConvertReport}
