"""Architecture adapters, chosen from ``config.model_type``.

Decoder-only families are rows of data (``families.DECODER_LAYOUTS``) served by one
``DecoderAdapter``; encoders (BERT) and encoder-decoders (T5) are their own modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from anchorlens.errors import UnknownNameError
from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.bert import BertAdapter
from anchorlens.models.adapters.decoder import DecoderAdapter, DecoderLayout
from anchorlens.models.adapters.families import DECODER_LAYOUTS
from anchorlens.models.adapters.t5 import T5Adapter


def _decoder(layout: DecoderLayout) -> Callable[[], ArchAdapter]:
    return lambda: DecoderAdapter(layout)


ADAPTERS: dict[str, Callable[[], ArchAdapter]] = {
    **{t: _decoder(layout) for layout in DECODER_LAYOUTS for t in layout.model_types},
    **{t: BertAdapter for t in BertAdapter.model_types},
    **{t: T5Adapter for t in T5Adapter.model_types},
}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(factory().family for factory in ADAPTERS.values()))


def adapter_for(model_type_or_config: str | Mapping[str, Any] | Any) -> ArchAdapter:
    """The adapter for a HF ``model_type``, or for a config (object or config.json dict) whose settings are also checked.

    UnknownNameError (one line) lists the supported model types; a config whose attention anchorlens
    cannot mirror exactly gets UsageError from ``check_config``.
    """
    config = None if isinstance(model_type_or_config, str) else model_type_or_config
    if config is None:
        model_type = model_type_or_config
    else:
        model_type = config.get("model_type") if isinstance(config, Mapping) else getattr(config, "model_type", None)
    if model_type not in ADAPTERS:
        raise UnknownNameError(
            f"unsupported architecture {model_type!r}; anchorlens supports (model_type): {', '.join(ADAPTERS)}"
        )
    adapter = ADAPTERS[model_type]()
    if config is not None:
        adapter.check_config(config)
    return adapter


__all__ = [
    "ADAPTERS",
    "FAMILIES",
    "ArchAdapter",
    "BertAdapter",
    "DecoderAdapter",
    "DecoderLayout",
    "T5Adapter",
    "adapter_for",
]
