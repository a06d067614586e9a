"""The package outside the checkout: a built wheel finds its templates and schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cliresult import checkout_env

from checkpoint_strategy import render, resources


def test_checkout_layout_is_found(skill_root):
    assert resources.data_dir("templates") == skill_root / "templates"
    assert resources.data_dir("schemas") == skill_root / "schemas"


def test_strict_undefined_refuses_missing_values():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        render.render_template("policy.yaml.j2", policy={"frequency": "every_1_steps"})


def test_wheel_carries_templates_and_schemas(skill_root, tmp_path):
    pytest.importorskip("hatchling")
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(skill_root),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env=checkout_env(),
    )
    wheel = next(wheel_dir.glob("checkpoint_strategy-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env=checkout_env(),
    )
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONNOUSERSITE="1")
    code = (
        "import checkpoint_strategy.resources as r, json, sys; "
        "print(json.dumps([str(r.data_dir('templates')), str(r.data_dir('schemas'))]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    templates, schemas = json.loads(proc.stdout)
    assert templates.startswith(str(target)) and schemas.startswith(str(target))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_strategy",
            "100000",
            "2.5",
            "500",
            "--model_size_gb",
            "4",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoint_size_gb"] == 12
    text = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_strategy",
            "100000",
            "2.5",
            "500",
            "--model_size_gb",
            "4",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert text.stdout.startswith("=== Checkpoint Strategy Report ===")
