"""Function-level imports in the package: how many `import` statements sit inside function bodies, per 1000
lines, and which are not lazily imported frameworks (issue 41). `python bench/lazy_imports.py [-v]`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scripts" / "checkpoint_strategy"
FRAMEWORKS = {
    "torch",
    "transformers",
    "lightning",
    "pytorch_lightning",
    "orbax",
    "jax",
    "deepspeed",
    "fsspec",
    "s3fs",
    "gcsfs",
    "safetensors",
    "zstandard",
    "matplotlib",
    "tensorboard",
    "numba",
    "orjson",
    "megatron",
    "accelerate",
    "tensorstore",
    "jaxlib",
    "flax",
    "optax",
    "wandb",
    "nemo",
}


def function_imports(path: Path):
    """(line, top-level module name) of every import statement inside a function body."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out.append((node.lineno, node.names[0].name))
                elif isinstance(node, ast.ImportFrom):
                    out.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(out))


def main(verbose: bool) -> None:
    lines = total = framework = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        lines += len(path.read_text(encoding="utf-8").splitlines())
        for line, module in function_imports(path):
            total += 1
            if module.split(".")[0] in FRAMEWORKS:
                framework += 1
            elif verbose:
                print(f"{path.relative_to(PACKAGE)}:{line}: {module}")
    print(
        f"{lines} lines, {total} function-level imports = {1000 * total / lines:.1f} per 1000 lines "
        f"({framework} of frameworks; {total - framework} others = "
        f"{1000 * (total - framework) / lines:.1f} per 1000)"
    )


if __name__ == "__main__":
    main("-v" in sys.argv)
