"""Discovery refuses, in one line naming the reason, what a capture or a splice could not serve exactly:

- a position bias added into the attention mask (Falcon with ``alibi=True``: [B, heads, Q, K] of slope x key
  position): positions inserted per layer are refused, while the base and input-level guidance stay exact;
- one attention module called for several layers (ALBERT shares one layer's weights across its layers): refused,
  and a certificate whose eager maps outnumber the sites says so instead of "eager returned no weights".
"""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from anchorlens.capture.certificate import InexactCaptureError, certify, require_exact
from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.adapters import DiscoveredAdapter, adapter_for, discover
from anchorlens.models.adapters.probe import mask_carries_bias, run_probe
from anchorlens.models.base import Base
from anchorlens.models.tiny_any import build_tiny_any
from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from tests.methods.helpers import rte_batch

runner = CliRunner()


def _alibi_falcon():
    tokenizer = tiny_tokenizer("llama")
    return build_tiny_any("falcon", tokenizer, alibi=True), tokenizer


def _albert():
    tokenizer = tiny_tokenizer("llama")
    return build_tiny_any("albert", tokenizer), tokenizer


def _error_line(output: str) -> str:
    """The CLI's one error line (and no traceback or internal error beside it)."""
    assert "Traceback" not in output and "internal error" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output
    return lines[0]


def _saved(tmp_path, model, tokenizer):
    path = tmp_path / "model"
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return str(path)


def test_mask_bias_is_told_from_visibility():
    low = torch.finfo(torch.float32).min
    visible = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    additive = torch.zeros(1, 1, 3, 3).masked_fill(~visible, low)
    alibi = (torch.arange(3.0).view(1, 1, 1, 3) * torch.tensor([-0.5, -0.25]).view(1, 2, 1, 1)).masked_fill(
        ~visible, low
    )
    assert not mask_carries_bias(visible) and not mask_carries_bias(additive)
    assert not mask_carries_bias(torch.zeros(1, 1, 3, 3).masked_fill(~visible, float("-inf")))
    assert mask_carries_bias(alibi) and not mask_carries_bias(None)


def test_alibi_in_the_mask_refuses_layer_guidance_but_keeps_base_and_instance_exact():
    model, tokenizer = _alibi_falcon()
    found = discover(model)
    assert all(s.mask_bias for s in found.sites) and "position bias in the attention mask" in found.mechanisms
    assert found.guidance_refusal is None and found.layer_refusal is not None
    assert "ALiBi" in found.layer_refusal and "\n" not in found.layer_refusal
    base = Base("tiny-falcon-alibi", model, tokenizer, adapter_for(model, found))
    assert base.adapter.supports_guidance and base.adapter.guidance_stacks == ()
    for spec in ("capsule", "deep_prompt"):
        with pytest.raises(UsageError, match="per-layer positions") as err:
            load_guided(spec, base=base)
        assert "\n" not in str(err.value)
    batch = rte_batch(base, "left")
    for spec in ("base", "instance"):  # the model builds its own ALiBi for the longer input: exact
        certificate = certify(load_guided(spec, base=base), batch)
        assert certificate.exact, (spec, certificate.summary())
        assert len(certificate.per_layer) == 4


def test_a_splice_never_drops_an_alibi_mask():
    """Should a splice still be asked for (a layout discovered elsewhere), it refuses in one line, never a shape error."""
    model, _ = _alibi_falcon()
    found = discover(model)
    adapter = DiscoveredAdapter(found)
    with pytest.raises(UsageError, match="no positions inserted per layer on falcon: .*ALiBi") as err:
        adapter.splice_block_inputs(model, "decoder", (), {}, None, None, None, {}, layer=0)
    assert "\n" not in str(err.value)
    adapter.layer_guidance_refusal = None  # as if discovery had missed it: the mask itself is checked
    mask = torch.zeros(2, 4, 5, 5)
    mask[..., 1:] = -1.0
    with pytest.raises(UsageError, match=r"shape \[2, 4, 5, 5\].*ALiBi") as err:
        adapter._banded(mask, "decoder", None, None, "full", None)
    assert "\n" not in str(err.value)


def test_cli_capsule_on_an_alibi_falcon_is_one_line_exit_2(tmp_path):
    model, tokenizer = _alibi_falcon()
    path = _saved(tmp_path, model, tokenizer)
    args = ["capture", "--base", path, "--limit", "4", "--no-progress"]
    result = runner.invoke(app, [*args, "--ckpt", "capsule", "--out", str(tmp_path / "capsule")])
    assert result.exit_code == 2, result.output
    assert "per-layer positions" in _error_line(result.output)
    result = runner.invoke(app, [*args, "--ckpt", "base", "--out", str(tmp_path / "base")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "base" / "metrics.parquet").is_file()


def test_layers_sharing_one_attention_module_are_refused_in_one_line():
    model, _ = _albert()
    with pytest.raises(UsageError) as err:
        adapter_for(model)
    message = str(err.value)
    assert "\n" not in message and message.startswith("albert reuses one attention module")
    assert f"for {model.config.num_hidden_layers} attention calls" in message
    assert "one attention module per layer" in message


def test_cli_capture_of_albert_is_one_line_exit_2(tmp_path):
    model, tokenizer = _albert()
    path = _saved(tmp_path, model, tokenizer)
    out = tmp_path / "out"
    args = ["capture", "--ckpt", "base", "--base", path, "--limit", "4", "--no-progress", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = _error_line(result.output)
    assert "reuses one attention module" in line and "returned no weights" not in line
    result = runner.invoke(app, [*args, "--allow-inexact"])  # not a certificate matter: still refused
    assert result.exit_code == 2 and not (out / "metrics.parquet").exists(), result.output


def test_a_certificate_says_how_many_eager_maps_met_how_many_sites():
    """Were such a model discovered with one site (its repeated calls dropped), eager's 4 maps cannot be keyed by
    1 site: the certificate names that, not "eager attention returned no weights"."""
    model, tokenizer = _albert()
    records = run_probe(model)
    first: dict[int, object] = {}
    for record in records.attention:
        first.setdefault(id(record.module), record)
    records.attention = list(first.values())  # type: ignore[arg-type]
    base = Base("tiny-albert", model, tokenizer, DiscoveredAdapter(discover(model, records)))
    certificate = certify(base, rte_batch(base, "right"))
    layers = model.config.num_hidden_layers
    assert certificate.unavailable == (
        f"eager attention returned {layers} maps for the encoder stack but the capture found 1 attention site there"
    )
    with pytest.raises(InexactCaptureError, match=f"returned {layers} maps .* found 1 attention site") as err:
        require_exact(certificate, "tiny-albert")
    assert "no weights" not in str(err.value) and "\n" not in str(err.value)
