"""The how-to guides' code runs as printed, and computes what the guide says it computes.

Each guide's python blocks are executed in order in one namespace, on a tiny random base instead of the
embedded model (the one substitution), then checked against an independent reference: the reducer's values
against the diagonal of HF eager attention, the guidance method's forward against the base fed the spliced
embeddings by hand.
"""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch

from anchorlens.analyses import registry
from anchorlens.methods import config as method_config
from tests.conftest import REPO

BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def run_guide(page: str, replace: dict[str, str]) -> dict:
    """Execute the python blocks of ``docs/<page>`` in one namespace, with ``replace`` applied to the source."""
    text = (REPO / "docs" / page).read_text()
    blocks = BLOCK.findall(text)
    assert blocks, f"{page} has no python block"
    module = types.ModuleType("docs_" + re.sub(r"\W", "_", page))  # a real module: dataclasses look it up
    sys.modules[module.__name__] = module
    try:
        for i, source in enumerate(blocks):
            for old, new in replace.items():
                source = source.replace(old, new)
            exec(compile(source, f"docs/{page}#block{i}", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module.__dict__


@pytest.fixture
def clean_registries():
    """Guides register names: take them out again so the tests stay independent."""
    reducers = dict(registry._REGISTRY)
    methods = dict(method_config.METHOD_CONFIGS), dict(method_config._BY_KIND)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(reducers)
    method_config.METHOD_CONFIGS.clear()
    method_config.METHOD_CONFIGS.update(methods[0])
    method_config._BY_KIND.clear()
    method_config._BY_KIND.update(methods[1])


def eager_maps(model, inputs, prompts):
    """(example, layer, [H, T, T] HF eager map, [T] bool real positions) of every example and layer of a guide's
    batches (batch size 2, as the guides run them)."""
    from anchorlens.capture.certificate import eager_reference
    from anchorlens.capture.collect import encode_batches

    for batch in encode_batches(model, inputs.examples, prompts, batch_size=2):
        reference = eager_reference(model, batch)
        (stack,) = reference
        for layer, maps in reference[stack].items():  # [B, H, T, T]
            real = batch.attention_mask.bool()  # [B, T]
            for b, example in enumerate(batch.example_ids.tolist()):
                yield example, layer, maps[b].float(), real[b]


def test_reducer_guide_computes_the_diagonal_of_eager_attention(clean_registries):
    ns = run_guide("how-to/reducer.md", {"smollm2-135m": "tiny-llama", '"instance"': '"base"'})
    rows, model, inputs, prompts = ns["rows"], ns["model"], ns["inputs"], ns["prompts"]
    assert set(rows["metric"]) == {"self_mass"}
    got = rows.set_index(["example", "layer", "head"])["value"]
    checked = 0
    for example, layer, maps, real in eager_maps(model, inputs, prompts):
        expected = maps.diagonal(dim1=-2, dim2=-1)[:, real].mean(-1)  # [H]
        for head, value in enumerate(expected.tolist()):
            assert got[(example, layer, head)] == pytest.approx(value, abs=1e-5)
            checked += 1
    assert checked == len(rows) and checked > 0


def test_reducer_guide_state_round_trips_and_merges(clean_registries):
    ns = run_guide("how-to/reducer.md", {"smollm2-135m": "tiny-llama", '"instance"': '"base"'})
    reducer = ns["reducer"]
    twin = registry.make_reducer("self_mass")
    twin.load_state_dict(reducer.state_dict())
    twin.merge(reducer)  # twice the sums and the counts: the same means
    merged = twin.frame().set_index(["example", "layer", "head"])
    once = reducer.frame().set_index(["example", "layer", "head"])
    assert (merged["count"] == 2 * once["count"]).all()
    assert merged["value"].to_numpy() == pytest.approx(once["value"].to_numpy())


def test_guidance_guide_inserts_the_last_token_embedding(clean_registries):
    from anchorlens.capture.collect import encode_batches

    ns = run_guide("how-to/guidance-method.md", {"smollm2-135m": "tiny-llama"})
    base = ns["base"]
    assert ns["view"].top_anchors()  # the inspection ran on the new method
    model = ns["al"].load_guided("last-token", base=base)  # at first: an input-level insertion before the input
    example = ns["al"].bundled_examples("rte")[0]
    from anchorlens.tasks import get_task

    (batch,) = encode_batches(model, [example], get_task("rte").template, batch_size=1)
    ids = batch.input_ids  # [1, T], no padding with one example
    assert bool(batch.attention_mask.all())
    with torch.no_grad():
        guided = model.forward(batch).logits[0, -1]
        embeds = base.model.get_input_embeddings()(ids)  # [1, T, d]
        spliced = torch.cat([embeds[:, -1:], embeds], dim=1)  # the last token's embedding at position 0
        reference = base.model(inputs_embeds=spliced).logits[0, -1]
    assert torch.allclose(guided, reference, atol=1e-5)


@pytest.mark.parametrize("plan", ["kernel", "materialised"])
def test_key_mass_guide_sums_the_first_four_keys_of_eager_attention(clean_registries, plan):
    """The one-file reducer of the key-mass guide gives the mass eager attention puts on each example's first four
    real keys, under both plans, alone and beside the default reducers (whose key columns differ from its own)."""
    from anchorlens.analyses import default_reducers
    from anchorlens.capture.collect import encode_batches, stream_statistics
    from anchorlens.capture.options import CaptureOptions

    ns = run_guide("how-to/key-mass.md", {"smollm2-135m": "tiny-llama"})
    model, inputs, prompts = ns["model"], ns["inputs"], ns["prompts"]
    beside = registry.make_reducer("initial_mass")
    others = default_reducers(roles=prompts.roles)
    batches = encode_batches(model, inputs.examples, prompts, batch_size=2)
    stream_statistics(model, batches, [beside, *others], options=CaptureOptions(plan=plan))
    for rows in (ns["rows"], beside.frame()):
        got = rows.set_index(["example", "layer", "head"])["value"]
        checked = 0
        for example, layer, maps, real in eager_maps(model, inputs, prompts):
            first = real.nonzero().squeeze(1)[:4]  # the first four real keys
            mass = maps[:, real][:, :, first].sum(-1).mean(-1)  # [H]
            for head, value in enumerate(mass.tolist()):
                assert got[(example, layer, head)] == pytest.approx(value, abs=1e-5)
                checked += 1
        assert checked == len(rows) and checked > 0
    assert others[0].frame().shape[0] > 0  # the defaults ran beside it
