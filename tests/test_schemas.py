"""schemas/ are generated from the models and stay in sync; every schema is a valid schema."""

import json

import jsonschema
import pytest

from checkpoint_strategy import schemagen
from checkpoint_strategy.resources import data_dir


def test_every_generated_schema_matches_its_model():
    models = schemagen.collect()
    assert {"arguments.schema.json", "plan.schema.json"} <= set(models)
    for name, model in models.items():
        path = data_dir("schemas") / name
        assert path.exists(), f"{name} missing: run python -m checkpoint_strategy.schemagen"
        assert path.read_text(encoding="utf-8") == schemagen.render(model), (
            f"{name} is out of sync with {model.__name__}: run python -m checkpoint_strategy.schemagen"
        )


def test_schemagen_check_mode_reports_clean():
    assert schemagen.main(["--check"]) == 0


@pytest.mark.parametrize(
    "path", sorted(data_dir("schemas").glob("*.schema.json")), ids=lambda p: p.name
)
def test_schema_files_are_valid_draft_2020_12(path):
    jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))
