"""What the bench tests share: the report's schema check and a stand-in environment."""

from __future__ import annotations

import json
from importlib import resources

from specmlx.bench.report import to_json
from specmlx.bench.summary import Report


def schema() -> dict:
    """The JSON schema the bench report ships with."""
    return json.loads(resources.files("specmlx").joinpath("data/bench.schema.json").read_text())


def validate(report: Report | dict) -> None:
    """The report as its JSON output holds it validates against the shipped schema."""
    import jsonschema

    data = json.loads(to_json(report)) if isinstance(report, Report) else report
    jsonschema.Draft202012Validator(schema()).validate(data)


def by_name(report: Report, field: str, temperature: float = 0.0) -> dict:
    """One summary field of every row at `temperature`, by the row's display name."""
    return {s.row.name: getattr(s, field) for s in report.summary if s.temperature == temperature}


def fake_environment() -> dict:
    """An environment as `specmlx.bench.environment` reports it, for reports built without
    a model."""
    model = {"path": None, "dtype": "float32", "quantization": None, "parameters": 1, "bytes": 4}
    return {
        "specmlx": "0",
        "mlx": "0",
        "mlx_lm": "0",
        "device": "cpu",
        "backend": "cpu",
        "blas": "test",
        "target": model,
        "draft": None,
        "bandwidth_gb_s": 1.0,
        "bytes_per_target_call": 4,
        "roofline_tokens_per_sec": 2.5e8,
    }
