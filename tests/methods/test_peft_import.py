"""PEFT prompt-learning adapters built with the real ``peft`` library load as guided models with equal logits."""

from __future__ import annotations

import pytest
import torch

from anchorlens.capture.run import capture_batch
from anchorlens.capture.sinks import MapSink
from anchorlens.errors import UsageError
from anchorlens.methods import Prefix, SoftPrompt, load_guided
from anchorlens.models.loading import load_base
from anchorlens.roles.kinds import Role
from tests.methods.helpers import rte_batch

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

N = 4
TOL = 1e-5


def _config(kind: str):
    from peft import PrefixTuningConfig, PromptEncoderConfig, PromptTuningConfig, TaskType

    if kind == "prompt":
        return PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=N)
    if kind == "seq2seq_prompt":  # T5: 2n rows saved, the encoder uses the first n
        return PromptTuningConfig(task_type=TaskType.SEQ_2_SEQ_LM, num_virtual_tokens=N)
    if kind == "p_tuning":
        return PromptEncoderConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=N, encoder_hidden_size=32)
    if kind == "prefix":
        return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=N)
    return PrefixTuningConfig(
        task_type=TaskType.CAUSAL_LM, num_virtual_tokens=N, prefix_projection=True, encoder_hidden_size=32
    )


def _build(name: str, kind: str, path):
    """A fresh base wrapped by PEFT with random nonzero prompt weights, saved to ``path``."""
    from peft import get_peft_model

    base = load_base(name)  # fresh: PEFT wraps the model object
    model = get_peft_model(base.model, _config(kind))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.prompt_encoder.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    model.eval()
    model.save_pretrained(str(path))
    return base, model


@pytest.mark.parametrize(
    "name,kind",
    [
        ("tiny-llama", "prompt"),
        ("tiny-llama", "p_tuning"),
        ("tiny-llama", "prefix"),
        ("tiny-llama", "prefix_projection"),
        ("tiny-qwen2", "prefix"),
        ("tiny-gpt2", "prefix"),
        ("tiny-gpt2", "prompt"),
        ("tiny-t5", "seq2seq_prompt"),
    ],
)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_peft_logits_match(tmp_path, name, kind, padding_side):
    base, peft_model = _build(name, kind, tmp_path / "adapter")
    batch = rte_batch(base, padding_side)
    guided = load_guided(str(tmp_path / "adapter"), base=load_base(name))
    expected_cls = Prefix if kind.startswith("prefix") else SoftPrompt
    assert [type(g) for g in guided.guidances] == [expected_cls]
    extra = {"decoder_input_ids": batch.target_ids} if base.is_encoder_decoder else {}
    with torch.no_grad():
        want = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **extra).logits
        got = guided.forward(batch).logits
        plain = base.forward(batch).logits
    assert float((got - plain).abs().max()) > 1e-3, "the adapter must change the logits"
    if kind in ("prompt", "p_tuning"):
        want = want[:, N:]
    valid = batch.attention_mask.bool() if not base.is_encoder_decoder else batch.target_mask.bool()
    diff = float((got - want).abs()[valid].max())
    print(f"peft {kind} {name} {padding_side}: max abs diff {diff:.2e}")
    assert diff <= TOL


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_prefix_positions_are_key_only_soft_prompt(tmp_path, name):
    _build(name, "prefix", tmp_path / "adapter")
    guided = load_guided(str(tmp_path / "adapter"), base=load_base(name))
    batch = rte_batch(guided.base, "left")
    sink = MapSink(max_examples=8)
    capture_batch(guided, batch, sink)
    maps = sink.maps(guided.adapter.stack_sequences)
    assert len(maps) == batch.batch_size
    for row, m in enumerate(maps):
        stack = m.stacks["decoder"]
        q = int(batch.attention_mask[row].sum())
        assert stack.probs.shape[-2:] == (q, N + q)
        assert stack.k_roles[:N].tolist() == [int(Role.SOFT_PROMPT)] * N
        assert int(Role.SOFT_PROMPT) not in stack.q_roles.tolist()
        torch.testing.assert_close(stack.probs.sum(-1), torch.ones(stack.probs.shape[:-1]), rtol=0, atol=1e-5)
        assert float(stack.probs[..., :N].sum()) > 0


def test_unsupported_peft_type_is_refused(tmp_path):
    d = tmp_path / "lora"
    d.mkdir()
    (d / "adapter_config.json").write_text('{"peft_type": "POLY"}')
    with pytest.raises(UsageError, match="type POLY; anchorlens loads PROMPT_TUNING.*LORA, IA3"):
        load_guided(str(d), base=load_base("tiny-llama"))


# ---------------------------------------------------------------------- hostile adapters
def _edit_config(path, **changes) -> None:
    import json

    file = path / "adapter_config.json"
    cfg = json.loads(file.read_text())
    cfg.update(changes)
    file.write_text(json.dumps(cfg))


def test_fewer_virtual_tokens_than_saved_rows_is_refused_as_peft_does(tmp_path):
    from peft import PeftModel

    from anchorlens.errors import CheckpointError

    _build("tiny-llama", "prompt", tmp_path / "adapter")
    _edit_config(tmp_path / "adapter", num_virtual_tokens=N - 1)
    with pytest.raises(CheckpointError) as err:  # silently truncated to N-1 rows before
        load_guided(str(tmp_path / "adapter"), base=load_base("tiny-llama"))
    assert "num_virtual_tokens=3 needs 3 saved prompt rows" in str(err.value) and "(4, 64)" in str(err.value)
    with pytest.raises(RuntimeError, match="size mismatch"):  # the real PEFT refuses the same adapter
        PeftModel.from_pretrained(load_base("tiny-llama").model, str(tmp_path / "adapter"))


def test_non_finite_adapter_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from anchorlens.errors import CheckpointError

    _build("tiny-llama", "prompt", tmp_path / "adapter")
    file = tmp_path / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(file))
    name = next(iter(tensors))
    tensors[name][1, 2] = float("nan")
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match=f"tensor '{name}' holds 1 NaN/Inf"):
        load_guided(str(tmp_path / "adapter"), base=load_base("tiny-llama"))


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"token_dim": 4096}, "field token_dim is 4096"),
        ({"num_virtual_tokens": "four"}, "field num_virtual_tokens must be a positive integer"),
        ({"num_virtual_tokens": 10**8}, "n <= 512"),
        ({"base_model_name_or_path": 7}, "field base_model_name_or_path must be a string"),
        (
            {"base_model_name_or_path": "meta-llama/Llama-2-7b-hf"},
            "names 'meta-llama/Llama-2-7b-hf' but the base is 'tiny-llama'",
        ),
    ],
)
def test_adapter_config_is_validated_against_the_base(tmp_path, changes, needle):
    from anchorlens.errors import CheckpointError

    _build("tiny-llama", "prompt", tmp_path / "adapter")
    _edit_config(tmp_path / "adapter", **changes)
    with pytest.raises(CheckpointError) as err:
        load_guided(str(tmp_path / "adapter"), base=load_base("tiny-llama"))
    assert needle in str(err.value) and "adapter_config.json" in str(err.value) and "\n" not in str(err.value)


def test_an_adapter_for_another_named_model_loads_only_when_allowed(tmp_path):
    _build("tiny-llama", "prompt", tmp_path / "adapter")
    _edit_config(tmp_path / "adapter", base_model_name_or_path="HuggingFaceTB/SmolLM2-360M")
    with pytest.warns(UserWarning, match="made for 'HuggingFaceTB/SmolLM2-360M'"):
        guided = load_guided(str(tmp_path / "adapter"), base=load_base("tiny-llama"), allow_other_base=True)
    assert guided.meta["other_base"][0]["recorded"]["spec"] == "HuggingFaceTB/SmolLM2-360M"
    _edit_config(tmp_path / "adapter", base_model_name_or_path="org/Tiny-Llama")  # names this base: accepted quietly
    assert load_guided(str(tmp_path / "adapter"), base=load_base("tiny-llama")).meta == {}
