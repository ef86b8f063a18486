"""The families anchorlens verifies, as data: the tests run over these rows and ``anchorlens models`` prints them.

Each row names a tiny base (``anchorlens.models.tiny``) and what its tests check: capture equals HF eager
``output_attentions`` (<= 1e-5, every softmax layer, left and right padding, base and instance), the mechanisms
the probe discovers on it (asserted equal to ``mechanisms``, so the list cannot drift from the code), and which
guidance reference loops it passes. Nothing here decides what anchorlens *can* capture: any model whose attention
runs through transformers' ``AttentionInterface`` is discovered; these rows are what is *proven* on every commit.
"""

from __future__ import annotations

from dataclasses import dataclass

# guidance levels: every reference-loop variant (both paddings, positions, capsule counts and fusions), the
# reference loops on left padding (deep prompt, capsule first/last, two prepended capsules, soft prompt and
# instance as inputs_embeds), or capture only
FULL, REFERENCE, CAPTURE_ONLY = "full", "reference", "capture only"


@dataclass(frozen=True)
class Verified:
    """One verified family.

    family: display name; model_type: HF ``config.model_type``; tiny: the tiny base its tests build; kind:
    ``decoder``, ``encoder`` or ``encoder-decoder``; guidance: FULL, REFERENCE or CAPTURE_ONLY; prefix: whether
    PEFT prefix tuning is checked against PEFT's own forward; mechanisms: what discovery reports on the tiny base;
    other_layers: layer kinds without softmax attention (hybrid models).
    """

    family: str
    model_type: str
    tiny: str
    kind: str
    guidance: str
    prefix: bool
    mechanisms: tuple[str, ...]
    other_layers: tuple[str, ...] = ()


GQA = "grouped-query attention"
SLIDE = "sliding windows"
MIXED = "mixed layer types"
MOE = "mixture of experts"
QKN = "QK-norm"

VERIFIED: tuple[Verified, ...] = (
    Verified("Llama", "llama", "tiny-llama", "decoder", FULL, True, ()),
    Verified("Qwen2", "qwen2", "tiny-qwen2", "decoder", FULL, True, (GQA,)),
    Verified("Qwen3", "qwen3", "tiny-qwen3", "decoder", FULL, True, (GQA, QKN)),
    Verified("Mistral", "mistral", "tiny-mistral", "decoder", FULL, True, (GQA, SLIDE)),
    Verified(
        "Gemma 2",
        "gemma2",
        "tiny-gemma2",
        "decoder",
        FULL,
        True,
        (GQA, SLIDE, MIXED, "logit soft-capping", "attention scale other than 1/sqrt(head dim)"),
    ),
    Verified(
        "Gemma 3 text",
        "gemma3_text",
        "tiny-gemma3",
        "decoder",
        FULL,
        True,
        (GQA, SLIDE, MIXED, "attention scale other than 1/sqrt(head dim)", QKN, "rotary per layer type"),
    ),
    Verified("Phi-3", "phi3", "tiny-phi3", "decoder", FULL, True, (GQA, SLIDE)),
    Verified("OLMo 2", "olmo2", "tiny-olmo2", "decoder", FULL, True, (GQA, QKN)),
    Verified(
        "GPT-NeoX / Pythia",
        "gpt_neox",
        "tiny-gpt-neox",
        "decoder",
        FULL,
        True,
        ("partial rotary", "parallel attention and MLP"),
    ),
    Verified("GPT-2", "gpt2", "tiny-gpt2", "decoder", FULL, True, ()),
    Verified("Mixtral", "mixtral", "tiny-mixtral", "decoder", FULL, True, (GQA, SLIDE, MOE)),
    Verified("Qwen2-MoE", "qwen2_moe", "tiny-qwen2-moe", "decoder", REFERENCE, True, (GQA, MOE)),
    Verified("Qwen3-MoE", "qwen3_moe", "tiny-qwen3-moe", "decoder", REFERENCE, True, (GQA, QKN, MOE)),
    Verified("OLMo", "olmo", "tiny-olmo", "decoder", REFERENCE, True, (GQA,)),
    Verified(
        "OLMo 3", "olmo3", "tiny-olmo3", "decoder", REFERENCE, True, (GQA, SLIDE, MIXED, QKN, "rotary per layer type")
    ),
    Verified("OLMoE", "olmoe", "tiny-olmoe", "decoder", REFERENCE, True, (GQA, QKN, MOE)),
    Verified("SmolLM3", "smollm3", "tiny-smollm3", "decoder", REFERENCE, True, (GQA, "NoPE layers")),
    Verified(
        "gpt-oss", "gpt_oss", "tiny-gpt-oss", "decoder", REFERENCE, True, (GQA, SLIDE, MIXED, "learned sinks", MOE)
    ),
    Verified("Gemma", "gemma", "tiny-gemma", "decoder", REFERENCE, True, (GQA,)),
    Verified(
        "Phi-1/2",
        "phi",
        "tiny-phi",
        "decoder",
        REFERENCE,
        True,
        (GQA, QKN, "partial rotary", "parallel attention and MLP"),
    ),
    Verified(
        "Granite",
        "granite",
        "tiny-granite",
        "decoder",
        REFERENCE,
        True,
        (GQA, "attention scale other than 1/sqrt(head dim)"),
    ),
    Verified("Starcoder2", "starcoder2", "tiny-starcoder2", "decoder", REFERENCE, True, (GQA, SLIDE)),
    Verified(
        "Falcon",
        "falcon",
        "tiny-falcon",
        "decoder",
        REFERENCE,
        True,
        ("multi-query attention", "parallel attention and MLP"),
    ),
    Verified(
        "Cohere 2",
        "cohere2",
        "tiny-cohere2",
        "decoder",
        REFERENCE,
        True,
        (GQA, SLIDE, MIXED, "parallel attention and MLP"),
    ),
    Verified(
        "DeepSeek-V3",
        "deepseek_v3",
        "tiny-deepseek-v3",
        "decoder",
        REFERENCE,
        False,
        (MOE, "multi-head latent attention", "partial rotary"),
    ),
    Verified(
        "Llama 4 text",
        "llama4_text",
        "tiny-llama4-text",
        "decoder",
        REFERENCE,
        True,
        (GQA, "chunked attention", MIXED, QKN, MOE, "NoPE layers"),
    ),
    Verified(
        "Qwen3.5 text",
        "qwen3_5_text",
        "tiny-qwen3-5-text",
        "decoder",
        REFERENCE,
        False,
        (GQA, "hybrid (layers without softmax attention)", QKN, "partial rotary"),
        ("linear_attention",),
    ),
    Verified(
        "LFM2",
        "lfm2",
        "tiny-lfm2",
        "decoder",
        REFERENCE,
        False,
        (GQA, "hybrid (layers without softmax attention)", QKN),
        ("conv",),
    ),
    Verified("BERT", "bert", "tiny-bert", "encoder", CAPTURE_ONLY, False, ("bidirectional attention",)),
    Verified("RoBERTa", "roberta", "tiny-roberta", "encoder", CAPTURE_ONLY, False, ("bidirectional attention",)),
    Verified(
        "ModernBERT",
        "modernbert",
        "tiny-modernbert",
        "encoder",
        CAPTURE_ONLY,
        False,
        (SLIDE, MIXED, "rotary per layer type", "bidirectional attention"),
    ),
    Verified(
        "T5",
        "t5",
        "tiny-t5",
        "encoder-decoder",
        FULL,
        False,
        ("attention scale other than 1/sqrt(head dim)", "relative position bias", "cross-attention"),
    ),
)


def verified_bases(kind: str | None = None, guidance: str | None = None, prefix: bool | None = None) -> list[str]:
    """Tiny base names of the verified rows, filtered by kind, guidance level and prefix support."""
    return [
        v.tiny
        for v in VERIFIED
        if (kind is None or v.kind == kind)
        and (guidance is None or v.guidance == guidance)
        and (prefix is None or v.prefix == prefix)
    ]


HOW_VERIFIED = {
    FULL: "eager ≤ 1e-5 (base, instance); every reference loop",
    REFERENCE: "eager ≤ 1e-5 (base, instance); reference loops (left padding)",
    CAPTURE_ONLY: "eager ≤ 1e-5 (base)",
}


def verified_table() -> str:
    """The verified families as the markdown table ``anchorlens models`` prints and the README shows."""
    lines = [
        "| family | `model_type` | kind | guidance | PEFT prefix | verified by | mechanisms discovered |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in VERIFIED:
        mechanisms = ", ".join(v.mechanisms) or "—"
        if v.other_layers:
            mechanisms += f" (other layers: {', '.join(v.other_layers)})"
        prefix = "yes (= PEFT's forward)" if v.prefix else "—"
        lines.append(
            f"| {v.family} | `{v.model_type}` | {v.kind} | {v.guidance} | {prefix} | {HOW_VERIFIED[v.guidance]} "
            f"| {mechanisms} |"
        )
    return "\n".join(lines)
