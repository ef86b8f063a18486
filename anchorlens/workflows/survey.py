"""Survey every decoder, encoder and encoder-decoder ``model_type`` transformers can build: discovered and exact?

For each model type, a tiny random model is built from the config class's shrunk defaults
(:func:`~anchorlens.models.tiny_any.build_tiny_any`); discovery either serves it or refuses it with one line; a
served model's capture is certified against eager on a padded batch of bundled RTE examples, for the base and
(where guidance is supported) the instance token. Nothing is downloaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from anchorlens.capture.certificate import certify
from anchorlens.errors import UsageError

BUILT, REFUSED, UNBUILDABLE, EXACT, INEXACT = "built", "refused", "not buildable here", "exact", "inexact"


@dataclass(frozen=True)
class SurveyRow:
    """One model type: its status, the worst |captured - eager| (base and instance) and why when not exact."""

    model_type: str
    status: str
    max_abs_diff: float | None = None
    guidance: bool = False
    reason: str = ""


def all_model_types() -> list[str]:
    """Every ``model_type`` transformers registers a config class for, sorted."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return sorted(CONFIG_MAPPING.keys())


def _one_line(err: BaseException) -> str:
    """An exception as one short line."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:160]}"


def survey_one(model_type: str) -> SurveyRow:
    """Build, discover and certify one tiny ``model_type`` (base and instance)."""
    from anchorlens.methods.spec import load_guided
    from anchorlens.models.adapters import adapter_for
    from anchorlens.models.base import Base
    from anchorlens.models.tiny_any import build_tiny_any
    from anchorlens.models.tiny_tokenizers import tiny_tokenizer
    from anchorlens.tasks import bundled_examples, get_task

    tokenizer = tiny_tokenizer("llama")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build_tiny_any(model_type, tokenizer)
    except Exception as err:  # a config class that cannot be shrunk or built without extra packages
        return SurveyRow(model_type, UNBUILDABLE, reason=_one_line(err))
    try:
        base = Base(f"tiny-any-{model_type}", model, tokenizer, adapter_for(model))
    except UsageError as err:
        return SurveyRow(model_type, REFUSED, reason=str(err))
    task = get_task("rte")
    tokenizer.padding_side = "left"
    batch = base.encode([task.template.render(ex) for ex in bundled_examples("rte")[:3]])
    specs = ["base", "instance"] if base.adapter.supports_guidance else ["base"]
    worst = 0.0
    try:
        for spec in specs:
            certificate = certify(load_guided(spec, base=base), batch)
            if certificate.max_abs_diff is None:
                return SurveyRow(model_type, INEXACT, reason=certificate.unavailable or "nothing checked")
            worst = max(worst, certificate.max_abs_diff)
    except Exception as err:  # discovery served it but a forward failed: report it, never a number
        return SurveyRow(model_type, INEXACT, reason=_one_line(err))
    status = EXACT if worst <= 1e-5 else INEXACT
    return SurveyRow(model_type, status, worst, base.adapter.supports_guidance)


def survey(model_types: Iterable[str] | None = None) -> Iterator[SurveyRow]:
    """:func:`survey_one` over ``model_types`` (default: every registered one), one row at a time."""
    for model_type in model_types if model_types is not None else all_model_types():
        yield survey_one(model_type)
