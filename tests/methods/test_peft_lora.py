"""LoRA-family PEFT adapters trained with the real ``peft`` on a tiny base: applied by PEFT, exact, refused off base."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anchorlens.capture.run import capture_batch
from anchorlens.errors import CheckpointError, UsageError
from anchorlens.methods import load_guided, parse_spec
from anchorlens.methods.peft_lora import AdaptedBase
from anchorlens.models.loading import load_base
from tests.capture.helpers import Collect
from tests.methods.helpers import rte_batch

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

TOL = 1e-5
BASE = "tiny-llama"
KINDS = ("lora", "dora", "ia3", "loha", "lokr")


def _config(kind: str):
    from peft import IA3Config, LoHaConfig, LoKrConfig, LoraConfig

    if kind == "loha":
        return LoHaConfig(task_type="CAUSAL_LM", r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    if kind == "lokr":
        return LoKrConfig(task_type="CAUSAL_LM", r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    if kind == "ia3":
        return IA3Config(
            task_type="CAUSAL_LM", target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]
        )
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]
    return LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=modules, use_dora=kind == "dora")


def _train(kind: str, path):
    """A PEFT model of ``kind`` on a fresh tiny base, trained 3 Adam steps on bundled RTE text, saved to ``path``."""
    from peft import get_peft_model

    fresh = load_base(BASE)  # PEFT injects into this model object
    model = get_peft_model(fresh.model, _config(kind))
    batch = rte_batch(fresh, "right")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=5e-2)
    model.train()
    for _ in range(3):
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(str(path))
    return model


class _Trained(dict):
    """kind -> (PEFT model, adapter directory), each trained on first use."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, kind: str):
        self[kind] = (_train(kind, self.root / kind), self.root / kind)
        return self[kind]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """kind -> (PEFT model, adapter directory), trained once per module when first asked for."""
    return _Trained(tmp_path_factory.mktemp("peft-lora"))


def _peft_logits(peft_model, batch) -> torch.Tensor:
    with torch.no_grad():
        return peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


@pytest.mark.parametrize("kind", ["lora", *(pytest.param(k, marks=pytest.mark.slow) for k in KINDS[1:])])
@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_logits_equal_peft_forward_unmerged_and_merged(trained, tiny_base, kind, merge, padding_side):
    peft_model, path = trained[kind]
    base = tiny_base(BASE)
    batch = rte_batch(base, padding_side)
    with torch.no_grad():
        plain_before = base.forward(batch).logits
    spec = f"{path}:merge=true" if merge else str(path)
    guided = load_guided(spec, base=base)
    assert isinstance(guided.base, AdaptedBase) and guided.meta["peft_adapter"]["merged"] is merge
    with torch.no_grad():
        got = guided.forward(batch).logits
        plain_after = base.forward(batch).logits
    want = _peft_logits(peft_model, batch)
    valid = batch.attention_mask.bool()
    diff = float((got - want).abs()[valid].max())
    moved = float((plain_before - want).abs()[valid].max())
    print(
        f"peft {kind} merge={merge} {padding_side}: max |d| vs PEFT {diff:.1e} (the adapter moves logits by {moved:.2f})"
    )
    assert moved > 1e-2, "training must have changed the model"
    assert diff <= TOL
    assert torch.equal(plain_before, plain_after), "the shared base must stay untouched"


@pytest.mark.parametrize("merge", [False, True])
def test_capture_of_the_adapted_model_equals_peft_eager_attentions(trained, tiny_base, merge):
    peft_model, path = trained["lora"]
    guided = load_guided(f"{path}:merge=true" if merge else str(path), base=tiny_base(BASE))
    batch = rte_batch(guided.base, "left")
    sink = Collect()
    capture_batch(guided, batch, sink)
    inner = peft_model.base_model.model
    before = inner.config._attn_implementation
    inner.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            ref = peft_model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True
            ).attentions
    finally:
        inner.set_attn_implementation(before)
    assert len(sink.events) == len(ref) == guided.num_layers
    plain = Collect()
    capture_batch(load_guided("base", guided.base.plain), batch, plain)
    for event in sink.events:
        rows = event.layout.q.valid[:, None, :, None]
        diff = float(((event.probs - ref[event.layer].index_select(1, event.heads)).abs() * rows).max())
        assert diff <= TOL, (event.layer, diff)
    assert float((sink.events[-1].probs - plain.events[-1].probs).abs().max()) > 1e-4, "LoRA must move attention"


def test_adapter_composes_with_guidance(trained, tiny_base):
    _, path = trained["lora"]
    guided = load_guided(f"{path}+instance", base=tiny_base(BASE))
    assert [g.kind for g in guided.guidance_list()] == ["instance"] and isinstance(guided.base, AdaptedBase)
    batch = rte_batch(guided.base, "right")
    with torch.no_grad():
        composed = guided.forward(batch).logits
        alone = load_guided("instance", base=tiny_base(BASE)).forward(batch).logits
    assert float((composed - alone).abs().max()) > 1e-3


def test_spec_option_round_trips_and_is_refused_elsewhere(trained, tmp_path):
    _, path = trained["lora"]
    spec = parse_spec(f"{path}:merge=true+instance")
    assert str(spec) == f"{path}:merge=true+instance" and parse_spec(str(spec)) == spec
    with pytest.raises(UsageError, match="unknown option 'fold=1'"):
        parse_spec(f"{path}:fold=1")
    from anchorlens.methods.checkpoints import save_checkpoint

    save_checkpoint(load_guided("capsule", load_base(BASE)), tmp_path / "capsule")
    with pytest.raises(UsageError, match="only a LoRA-family PEFT adapter directory"):
        parse_spec(f"{tmp_path / 'capsule'}:merge=true")


def test_two_layer_adapters_in_one_spec_are_refused(trained, tiny_base):
    with pytest.raises(UsageError, match="one LoRA-family adapter per model"):
        load_guided(f"{trained['lora'][1]}+{trained['lora'][1]}", base=tiny_base(BASE))


# ---------------------------------------------------------------------- another base
def _saved_base(tmp_path, name, **overrides):
    """A tiny base of ``name`` with config ``overrides``, saved to a directory."""
    from anchorlens.models.tiny import build_tiny

    model, tok = build_tiny(name, overrides=overrides or None)
    model.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    return str(tmp_path)


@pytest.mark.parametrize(
    "base_name,overrides,needle",
    [
        ("tiny-llama", {"num_hidden_layers": 2}, "its weights name"),
        ("tiny-llama", {"num_hidden_layers": 6}, "it has no weights for"),
        ("tiny-llama", {"hidden_size": 96, "head_dim": 16}, "[4, 64] in the adapter but [4, 96] on this base"),
        ("tiny-gpt2", {}, "could not apply"),
    ],
)
def test_an_adapter_of_another_base_is_one_line(trained, tmp_path, base_name, overrides, needle):
    _, path = trained["lora"]
    other = load_base(_saved_base(tmp_path / "base", base_name, **overrides))
    with pytest.raises(CheckpointError) as err:
        load_guided(str(path), base=other)
    text = str(err.value)
    assert needle in text and "\n" not in text and str(path) in text, text


def _edit_config(path, **changes) -> None:
    file = path / "adapter_config.json"
    cfg = json.loads(file.read_text())
    cfg.update(changes)
    file.write_text(json.dumps(cfg))


def test_recorded_base_name_is_checked_as_for_every_adapter(trained, tiny_base, tmp_path):
    import shutil

    path = tmp_path / "named"
    shutil.copytree(trained["lora"][1], path)
    _edit_config(path, base_model_name_or_path="HuggingFaceTB/SmolLM2-360M")
    with pytest.raises(CheckpointError, match="names 'HuggingFaceTB/SmolLM2-360M' but the base is 'tiny-llama'"):
        load_guided(str(path), base=tiny_base(BASE))
    with pytest.warns(UserWarning, match="made for 'HuggingFaceTB/SmolLM2-360M'"):
        guided = load_guided(str(path), base=tiny_base(BASE), allow_other_base=True)
    assert guided.meta["other_base"][0]["recorded"]["spec"] == "HuggingFaceTB/SmolLM2-360M"


def test_pickled_adapter_weights_are_never_loaded(trained, tiny_base, tmp_path):
    import shutil

    path = tmp_path / "pickled"
    shutil.copytree(trained["lora"][1], path)
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    with pytest.raises(UsageError, match="never unpickles"):
        load_guided(str(path), base=tiny_base(BASE))


def test_cli_refuses_an_adapter_of_another_base_with_exit_2(trained, tmp_path):
    from anchorlens.cli import app

    out = tmp_path / "cmp"
    args = ["compare", "--base", "tiny-gpt2", "--ckpt", "base", "--ckpt", str(trained["lora"][1]), "--n", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("error:") and "could not apply" in lines[-1] and "trained on" in lines[-1]
    assert not out.exists()


@pytest.mark.slow
def test_compare_runs_the_adapter_against_the_base(trained, tmp_path):
    from anchorlens.workflows.compare import compare

    _, path = trained["lora"]
    result = compare(["base", str(path), f"{path}:merge=true", f"{path}+instance"], base=BASE, n=3, n_boot=50)
    names = result.checkpoints
    head = result.metrics[result.metrics["metric"] == "entropy"].groupby("checkpoint")["value"].mean()
    assert abs(head[names[1]] - head[names[0]]) > 1e-5, "LoRA must change the measured attention"
    assert abs(head[names[1]] - head[names[2]]) <= 1e-6, "merged and unmerged measure the same"
    adapters = result.facts["peft_adapters"]
    assert adapters[names[1]]["peft_type"] == "LORA" and adapters[names[2]]["merged"] is True
    assert "bases" not in result.facts
    from anchorlens.reports.comparison import write_comparison

    folder = write_comparison(result, tmp_path / "out", figures=False)
    summary = (folder / "summary.md").read_text()
    assert f"{names[1]} applies the PEFT LORA adapter {path} (" in summary and "merged)." in summary
    assert "every checkpoint runs on this one base" in summary


def test_adapter_hub_id_resolves_from_the_hf_cache(trained, tiny_base, tmp_path, monkeypatch):
    import shutil

    from huggingface_hub import constants

    commit = "e" * 40
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-lora" / "snapshots" / commit
    shutil.copytree(trained["lora"][1], snap)
    (cache / "models--acme--tiny-lora" / "refs").mkdir()
    (cache / "models--acme--tiny-lora" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    base = tiny_base(BASE)
    batch = rte_batch(base, "right")
    with torch.no_grad():
        want = load_guided(str(trained["lora"][1]), base=base).forward(batch).logits
        for spec in ("acme/tiny-lora", "acme/tiny-lora:merge=true", f"acme/tiny-lora@{commit[:8]}"):
            guided = load_guided(spec, base=base)
            assert guided.meta["peft_adapter"]["path"] == str(snap)
            assert float((guided.forward(batch).logits - want).abs().max()) <= TOL


def test_a_checkpoint_trained_on_the_adapted_model_knows_it(trained, tiny_base, tmp_path):
    from anchorlens.methods.checkpoints import save_checkpoint

    lora = trained["lora"][1]
    base = tiny_base(BASE)
    adapted = load_guided(f"{lora}+capsule", base=base)
    assert adapted.base.fingerprint()["hash"] != base.fingerprint()["hash"]
    assert load_guided(f"{lora}:merge=true", base=base).base.fingerprint() == adapted.base.fingerprint()
    save_checkpoint(adapted, tmp_path / "capsule")
    with pytest.raises(CheckpointError, match=r"PEFT adapter LORA:\w+ vs none.*--allow-other-base"):
        load_guided(str(tmp_path / "capsule"), base=base)
    again = load_guided(f"{lora}+{tmp_path / 'capsule'}", base=base)  # on the adapted model it is at home
    assert "other_base" not in again.meta and [g.kind for g in again.guidance_list()] == ["capsule"]


def test_an_adapter_made_for_the_hub_smollm2_is_at_home_on_the_embedded_copy(smollm2, tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "prompt"
    folder.mkdir()
    config = {"peft_type": "PROMPT_TUNING", "num_virtual_tokens": 2, "token_dim": smollm2.hidden_size}
    (folder / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    )
    save_file({"prompt_embeddings": torch.zeros(2, smollm2.hidden_size)}, str(folder / "adapter_model.safetensors"))
    assert "other_base" not in load_guided(str(folder), base=smollm2).meta
    _edit_config(folder, base_model_name_or_path="HuggingFaceTB/SmolLM2-360M-Instruct")
    with pytest.raises(CheckpointError, match="names 'HuggingFaceTB/SmolLM2-360M-Instruct'"):
        load_guided(str(folder), base=smollm2)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"r": 10**7}, r"r = 10000000 is not a rank this base's layers can have \(1\.\.64"),
        ({"r": 0}, r"r = 0 is not a rank"),
        ({"rank_pattern": {"q_proj": 10**9}}, r"rank_pattern\['q_proj'\] = 1000000000 is not a rank"),
        ({"target_modules": "(a+"}, r"target_modules '\(a\+' is not a regular expression"),
        ({"target_modules": "([a-z_.0-9]+)*!"}, r"takes more than 2 s to match .* nested quantifiers"),
    ],
)
def test_sizes_and_patterns_are_checked_before_peft_allocates_or_matches(trained, tiny_base, tmp_path, changes, needle):
    """A huge rank would allocate its matrices before PEFT reads the tensors, a backtracking target_modules pattern
    would run for hours: both are one line naming the file and the key, within seconds and without allocating."""
    import resource
    import shutil
    import time

    path = tmp_path / "bad"
    shutil.copytree(trained["lora"][1], path)
    _edit_config(path, **changes)
    began, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckpointError, match=needle):
        load_guided(str(path), base=tiny_base(BASE))
    assert time.monotonic() - began < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200 * 1024  # KiB: nothing huge allocated


def test_the_adapters_own_rank_and_a_plain_pattern_pass_the_limits(trained, tiny_base, tmp_path):
    """The limits refuse nothing PEFT can build: the trained adapter (r = 4), and its modules as a pattern."""
    import shutil

    path = tmp_path / "pattern"
    shutil.copytree(trained["lora"][1], path)
    _edit_config(path, target_modules=r".*\.(q_proj|k_proj|v_proj|o_proj|up_proj)")
    adapted = load_guided(str(path), base=tiny_base(BASE))
    assert adapted is not None
