"""PEFT adapters that change the base's own layers (LoRA, DoRA, IA3, LoHa, LoKr), applied by PEFT itself.

A prompt-learning adapter becomes guidances (:mod:`anchorlens.methods.peft_import`); an adapter of
these types is injected by ``peft.PeftModel.from_pretrained`` into a copy of the base's module tree
that *shares* the base's weights, so the shared base of a comparison stays untouched and only the
adapter's own tensors are new. Merged (``DIR:merge=true``), the weights of the adapted layers alone
are copied first and PEFT merges into the copies. Either way the adapted projections still run
inside the same attention modules, so capture through the attention interface stays exact.

Before PEFT runs: the files are checked (safetensors only, never a pickle), the recorded base name
is checked like every adapter's (``--allow-other-base``); after injection, every saved tensor must
have found its module and every injected module its tensor (a base of another depth or
architecture), and PEFT's size mismatches (another width) become one line.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import itertools
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from anchorlens.errors import CheckpointError, UsageError
from anchorlens.methods.peft_base import check_peft_base
from anchorlens.methods.peft_files import INJECTED_TYPES, WEIGHTS_FILE, adapter_type, is_peft_dir, read_adapter_json
from anchorlens.methods.peft_limits import check_adapter_limits
from anchorlens.models.base import Base, fingerprint_hash
from anchorlens.rundir import file_digest
from anchorlens.tensorfile import check_float_tensors, load_tensors

# PEFT types injected into the base's layers and tested against PEFT's own forward (DoRA is LORA with use_dora)
DIRECTORY_OPTIONS = ("merge",)
_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+?):.*?shape torch\.Size\((\[[^\]]*\])\).*?current model is torch\.Size\((\[[^\]]*\])\)"
)
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def is_injected(path: str | Path) -> bool:
    """True when the PEFT adapter at ``path`` changes the base's layers (LoRA family) rather than adding prompts."""
    return adapter_type(path) in INJECTED_TYPES


def parse_directory_options(path: str | Path, text: str, original: str) -> bool:
    """``merge=true`` (the only directory option, for LoRA-family adapters) -> whether to merge; UsageError else."""
    if not (is_peft_dir(path) and is_injected(path)):
        raise UsageError(
            f"{original!r}: only a LoRA-family PEFT adapter directory ({', '.join(INJECTED_TYPES)}) takes options "
            f"(merge=true); {path} takes none"
        )
    merge = False
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        value = value.strip().lower() if eq else "true"
        if key.strip().lower() != "merge" or value not in _TRUE + _FALSE:
            raise UsageError(
                f"unknown option {item!r} for the adapter {path}; valid: merge=true (merge the adapter into "
                "copies of the weights it changes) or merge=false (the default: PEFT's unmerged layers)"
            )
        merge = value in _TRUE
    return merge


@dataclass
class AdaptedBase(Base):
    """A base whose layers carry a PEFT adapter: ``model`` is a weight-sharing copy of the plain base's model.

    ``peft``: the ``PeftModel`` wrapping that copy (None once merged and unloaded); ``plain``: the base it
    was made from; ``facts``: what the adapter is (recorded in the run's manifest).
    """

    plain: Base | None = dataclasses.field(default=None, repr=False, compare=False)
    peft: Any = dataclasses.field(default=None, repr=False, compare=False)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def fingerprint(self) -> dict[str, Any]:
        """The plain base's fingerprint plus the adapter (type and weights digest), hashed together (cached).

        A guidance checkpoint trained on the adapted model is thereby refused on the plain base (and a plain
        one on the adapted model) unless ``--allow-other-base``; merged and unmerged have one fingerprint.
        """
        if self._fingerprint is None:
            plain = self.plain.fingerprint() if self.plain is not None else super().fingerprint()
            facts = {k: v for k, v in plain.items() if k != "hash"}
            facts["adapter"] = f"{self.facts.get('peft_type')}:{self.facts.get('weights_digest')}"
            self._fingerprint = {**facts, "hash": fingerprint_hash(facts)}
        return dict(self._fingerprint)

    def provenance(self) -> dict[str, Any]:
        """The plain base's provenance plus the adapter's path and type."""
        return {
            **super().provenance(),
            "peft_adapter": self.facts.get("path"),
            "peft_type": self.facts.get("peft_type"),
        }


def _weight_sharing_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model``'s module tree (and config) whose parameters and buffers are the original tensors."""
    memo: dict[int, Any] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def _unshare_adapted_weights(model: torch.nn.Module) -> None:
    """Give every layer PEFT adapted its own copy of its base layer's parameters (merging writes into them)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        layer = module.get_base_layer()
        for name, param in list(layer.named_parameters(recurse=False)):
            setattr(layer, name, torch.nn.Parameter(param.detach().clone(), requires_grad=False))


def _adapter_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The adapter's saved tensors (safetensors only), checked floating and finite."""
    file = path / WEIGHTS_FILE
    if not file.is_file():
        pickled = [p.name for p in path.glob("adapter_model.bin")]
        found = f" (it holds {pickled[0]})" if pickled else ""
        raise UsageError(f"PEFT adapter {path} lacks {WEIGHTS_FILE}{found}; anchorlens never unpickles .bin files")
    tensors = load_tensors(file, f"PEFT adapter weights of {path}:")
    check_float_tensors(tensors, file)
    return tensors


def _module_of(key: str) -> str:
    """``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`` -> ``model.layers.3.self_attn.q_proj``."""
    parts = key.removeprefix("base_model.model.").split(".")
    for i, part in enumerate(parts):
        if "_" in part and part.split("_")[0] in ("lora", "ia3", "hada", "lokr"):
            return ".".join(parts[:i])
    return ".".join(parts[:-1])


def _check_fit(peft_model, saved: dict[str, torch.Tensor], path: Path, base: Base, recorded: str) -> None:
    """CheckpointError when the saved tensors and the modules PEFT injected into ``base`` do not correspond."""
    from peft import get_peft_model_state_dict

    wanted = set(get_peft_model_state_dict(peft_model))
    extra = sorted({_module_of(k) for k in set(saved) - wanted})
    missing = sorted({_module_of(k) for k in wanted - set(saved)})
    if not extra and not missing:
        return
    made_for = f" (made for {recorded!r})" if recorded else " (it records no base model)"
    what = (
        f"its weights name {len(extra)} module(s) the base lacks (e.g. {extra[0]})"
        if extra
        else f"it has no weights for {len(missing)} module(s) of the base it targets (e.g. {missing[0]})"
    )
    raise CheckpointError(
        f"PEFT adapter {path}{made_for} does not fit the base {base.spec!r} ({base.config.model_type}, "
        f"{base.num_layers} layers, d={base.hidden_size}): {what}; load it with the base it was trained on"
    )


def _peft_error(err: Exception, path: Path, base: Base, recorded: str = "") -> CheckpointError:
    """One line for an error PEFT raised while applying the adapter (``recorded``: the base it names, if any)."""
    text = " ".join(str(err).split())
    made_for = f" (made for {recorded!r})" if recorded else " (it records no base model)"
    found = _SIZE_MISMATCH.search(text)
    if found:
        name, saved, wanted = found.groups()
        return CheckpointError(
            f"PEFT adapter {path}{made_for} does not fit the base {base.spec!r} (d={base.hidden_size}): {name} is "
            f"{saved} in the adapter but {wanted} on this base; load it with the base it was trained on"
        )
    return CheckpointError(
        f"PEFT could not apply the adapter {path}{made_for} to {base.spec!r} ({text[:240]}); load it with the base "
        "it was trained on"
    )


def apply_adapter(base: Base, path: str | Path, *, merge: bool = False, allow_other_base: bool = False) -> AdaptedBase:
    """``base`` with the LoRA-family PEFT adapter at ``path`` applied by PEFT (``merge``: merged into copied weights).

    The returned base shares every weight the adapter does not change with ``base`` (``base`` itself is
    never modified); its ``facts`` say what was applied, ``facts["other_base"]`` what ``allow_other_base`` let
    through.
    """
    from peft import PeftModel
    from peft import __version__ as peft_version

    path = Path(path).expanduser()
    if isinstance(base, AdaptedBase):
        raise UsageError(
            f"one LoRA-family adapter per model: {path} would go on top of {base.facts.get('path')}; "
            "merge them with PEFT first, or compare them as separate --ckpt"
        )
    cfg = read_adapter_json(path)
    kind = adapter_type(path)
    if kind not in INJECTED_TYPES:
        raise UsageError(f"PEFT adapter {path} is of type {kind}; layer adapters anchorlens applies: {INJECTED_TYPES}")
    saved = _adapter_tensors(path)
    name = cfg.get("base_model_name_or_path") if isinstance(cfg.get("base_model_name_or_path"), str) else ""
    other = check_peft_base(cfg, base, path, allow_other_base)  # before PEFT reads the recorded base's config
    check_adapter_limits(cfg, path, base.model)  # before PEFT allocates the ranks or matches the patterns
    model = _weight_sharing_copy(base.model)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # PEFT's own notes; what matters is checked below
            peft_model: Any = PeftModel.from_pretrained(model, str(path), is_trainable=False)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise _peft_error(err, path, base, name or "") from None
    _check_fit(peft_model, saved, path, base, name or "")
    adapter_cfg = peft_model.peft_config["default"]
    params = sum(t.numel() for t in saved.values())
    facts: dict[str, Any] = {
        "path": str(path),
        "peft_version": peft_version,
        "peft_type": kind + ("+DoRA" if getattr(adapter_cfg, "use_dora", False) else ""),
        "recorded_base": name or None,
        "parameters": int(params),
        "weights_digest": file_digest(path / WEIGHTS_FILE),
        "merged": merge,
    }
    if merge:
        _unshare_adapted_weights(model)
        try:
            model = peft_model.merge_and_unload(safe_merge=True)
        except (RuntimeError, ValueError, NotImplementedError) as err:
            raise UsageError(
                f"PEFT cannot merge {path} ({' '.join(str(err).split())[:200]}); load it unmerged"
            ) from None
        peft_model = None
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if other:
        facts["other_base"] = other
    return AdaptedBase(
        spec=base.spec,
        model=model,
        tokenizer=base.tokenizer,
        adapter=base.adapter,
        origin=base.origin,
        plain=base,
        peft=peft_model,
        facts=facts,
    )


__all__ = ["DIRECTORY_OPTIONS", "INJECTED_TYPES", "AdaptedBase", "apply_adapter", "is_injected"]
