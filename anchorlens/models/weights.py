"""The weights of a local HF model directory: every file checked before loading, and the model loaded whole or
refused in one line (a missing, unexpected or wrongly sized tensor would otherwise be randomly initialised)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from anchorlens.atomic import os_errors
from anchorlens.errors import DataError, PathError

_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_RESAVE = "restore the file or re-save the model with save_pretrained"
_SHOWN_KEYS = 3


def _weight_files(path: Path, label: str) -> list[Path]:
    """The safetensors files transformers will read from ``path``; DataError/PathError naming a missing one."""
    if (path / _WEIGHTS).is_file():
        return [path / _WEIGHTS]
    index = path / _INDEX
    if not index.is_file():
        raise DataError(f"{label} has neither {_WEIGHTS} nor {_INDEX}; re-save the model with save_pretrained")
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
        shards = sorted({str(name) for name in weight_map.values()})
    except (ValueError, AttributeError, TypeError):
        raise DataError(f"{index} is not a valid safetensors index (no weight_map); {_RESAVE}") from None
    missing = [name for name in shards if not (path / name).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PathError(
            f"cannot read weight shard {path / missing[0]}{more} listed in {index}: no such file; {_RESAVE}"
        )
    return [path / name for name in shards]


def check_weight_files(path: Path, label: str) -> None:
    """DataError naming the first weights file of ``path`` that is missing or not readable as safetensors."""
    from safetensors import SafetensorError, safe_open

    for file in _weight_files(path, label):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise DataError(f"{file} is damaged ({reason}); {_RESAVE}") from None


def _first(keys: Any) -> str:
    """The first few of ``keys`` (sorted), and how many more there are."""
    names = sorted(str(k) for k in keys)
    more = f" and {len(names) - _SHOWN_KEYS} more" if len(names) > _SHOWN_KEYS else ""
    return ", ".join(names[:_SHOWN_KEYS]) + more


def _unused_submodule(model: torch.nn.Module, key: str) -> bool:
    """True when checkpoint ``key`` belongs to a whole submodule ``model`` does not build (a pooler, another head).

    A key inside a module the model has (an extra parameter, an extra block of a layer list) means the config
    disagrees with the weights.
    """
    module = model
    for part in key.split(".")[:-1]:
        child = getattr(module, part, None)
        if not isinstance(child, torch.nn.Module):
            return not isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))
        module = child
    return False


def loading_refusal(model: torch.nn.Module, info: dict[str, Any]) -> str | None:
    """Why the weights transformers reported in ``info`` (``output_loading_info``) do not make ``model`` whole, and the
    fix (None: they do)."""
    resave = "re-save the model with save_pretrained"
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: str(m[0]))
    if mismatched:
        key, ckpt, wanted = mismatched[0]
        return (
            f"config.json disagrees with the weights on {len(mismatched)} tensor(s), first {key}: "
            f"{tuple(ckpt)} in the weights, {tuple(wanted)} by config.json; restore the config.json saved with "
            f"these weights or {resave}"
        )
    missing = info.get("missing_keys") or ()
    if missing:
        return (
            f"the weights lack {len(missing)} tensor(s) the model needs ({_first(missing)}); restore them or {resave}"
        )
    unexpected = [k for k in info.get("unexpected_keys") or () if not _unused_submodule(model, k)]
    if unexpected:
        return (
            f"the weights hold {len(unexpected)} tensor(s) config.json does not build ({_first(unexpected)}); "
            f"restore the config.json saved with these weights or {resave}"
        )
    errors = info.get("error_msgs") or ()
    if errors:
        return f"the weights do not load ({str(errors[0]).splitlines()[0]}); {resave}"
    return None


class _NoLoadReport(logging.Filter):
    """Drops transformers' multi-line LOAD REPORT (:func:`from_pretrained_whole` refuses what it would report)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the report's record."""
        return "LOAD REPORT" not in str(record.msg)


def from_pretrained_whole(auto: Any, path: Path, label: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    """``auto.from_pretrained`` with transformers' load report replaced by one line: DataError when any weight the
    model needs is missing, unexpected or of another size (never a randomly initialised weight)."""
    from safetensors import SafetensorError

    logger = hf_logging.get_logger("transformers.modeling_utils")
    quiet = _NoLoadReport()
    logger.addFilter(quiet)  # the multi-line LOAD REPORT becomes our one-line refusal (a level would change more)
    try:
        with os_errors(path, f"cannot read the weights of {label}"):
            model, info = auto.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except SafetensorError as err:
        raise DataError(f"the weights of {label} are damaged ({str(err).splitlines()[0]}); {_RESAVE}") from None
    except RuntimeError as err:
        if "loading state_dict" not in str(err) and "conversion of the weights" not in str(err):
            raise
        raise DataError(f"the weights of {label} do not load ({str(err).splitlines()[0]}); {_RESAVE}") from None
    finally:
        logger.removeFilter(quiet)
    refusal = loading_refusal(model, info)
    if refusal is not None:
        raise DataError(f"{label}: {refusal}")
    return model
