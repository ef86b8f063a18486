"""The survey: tiny models of named model types are built, discovered, certified or refused with the reason."""

from __future__ import annotations

from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.models.verified import VERIFIED, verified_table
from anchorlens.workflows.survey import EXACT, REFUSED, UNBUILDABLE, all_model_types, survey

runner = CliRunner()


def test_survey_certifies_discovered_types_and_names_why_others_are_not():
    rows = {row.model_type: row for row in survey(["qwen2", "bloom", "mamba", "whisper"])}
    assert rows["qwen2"].status == EXACT and rows["qwen2"].guidance
    assert rows["qwen2"].max_abs_diff is not None and rows["qwen2"].max_abs_diff <= 1e-5
    assert rows["bloom"].status == REFUSED and "bypasses transformers' AttentionInterface" in rows["bloom"].reason
    assert (
        rows["mamba"].status == REFUSED and "no module called transformers' AttentionInterface" in rows["mamba"].reason
    )
    assert rows["whisper"].status == UNBUILDABLE and "no language-model class" in rows["whisper"].reason
    assert {v.model_type for v in VERIFIED} <= set(all_model_types())


def test_models_command_prints_the_table_a_layout_and_a_survey():
    table = runner.invoke(app, ["models"])
    assert table.exit_code == 0 and table.output.rstrip("\n") == verified_table()
    layout = runner.invoke(app, ["models", "tiny-qwen3-5-text"])
    assert layout.exit_code == 0, layout.output
    assert "decoder: 2 softmax-attention layers of 4 blocks" in layout.output
    assert "layers without softmax attention (linear_attention): 0, 2" in layout.output
    assert "PEFT prefix: no (" in layout.output
    surveyed = runner.invoke(app, ["models", "--survey", "--only", "llama", "--only", "bloom"])
    assert surveyed.exit_code == 0, surveyed.output
    assert "exact: 1; refused: 1" in surveyed.output
    missing = runner.invoke(app, ["models", "no/such-model-here"])
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1
