"""Which transformers class loads a config with its language-model head, and whether its attention can be swapped."""

from __future__ import annotations

from typing import Any


def lm_auto_class(config: Any) -> Any:
    """The Auto class for ``config``: seq2seq for encoder-decoders, masked LM for bidirectional encoders that have
    one (BERT, RoBERTa, ModernBERT), causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        return AutoModelForSeq2SeqLM
    if not getattr(config, "is_decoder", False) and config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM
    return AutoModelForCausalLM


def lm_model_class(config: Any) -> type | None:
    """The concrete model class :func:`lm_auto_class` would build for ``config`` (None when it has none)."""
    mapping = lm_auto_class(config)._model_mapping
    try:
        return mapping[type(config)]
    except (KeyError, ValueError):
        return None


def interface_refusal(config: Any) -> str | None:
    """Why ``config``'s model cannot be captured, known before any weight is read (None: nothing known).

    transformers switches a model to a registered attention function only when its modeling code calls the
    attention through ``AttentionInterface``; otherwise capture could not see the attention at all.
    """
    cls = lm_model_class(config)
    if cls is None:
        return f"transformers has no language-model class for model_type {config.model_type!r}"
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if callable(can_set) and not can_set():
        return (
            f"{config.model_type}: its attention bypasses transformers' AttentionInterface, so anchorlens cannot "
            "capture it exactly; use a model whose attention transformers implements with the interface"
        )
    return None
