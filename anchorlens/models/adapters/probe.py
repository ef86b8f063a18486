"""One short forward that records how a loaded model runs: which modules call the attention interface, with
what, inside which blocks, and which module produced each block's position embeddings.

The model is switched to a recording attention function for the probe only (transformers' own sdpa underneath)
and switched back afterwards. Nothing is read from names or tables: what the records say is what the model did.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

PROBE_IMPLEMENTATION = "anchorlens_probe"
PROBE_LEN = 7  # input length of the probe: odd, so no other dimension of a tiny model is mistaken for it
PROBE_TARGET_LEN = 3  # decoder length of an encoder-decoder probe (cross-attention: 3 queries, 7 keys)
PROBE_PAD = 2  # left padding of the probe's second row (so that masks are materialized)


@dataclass
class AttentionRecord:
    """One call of the attention interface: the module and what it passed.

    query: [B, H, Q, D] shape; key: [B, H_kv, K, D] shape; mask: shape of the mask or None, and whether the
    unpadded row's visible keys form a causal triangle (None without a boolean/additive 4D mask);
    mask_bias: whether an additive mask carries values other than 0 (visible) and the dtype's minimum (hidden),
    a position bias added into the mask (Falcon's ALiBi, one value per head and key).
    """

    module: torch.nn.Module
    query: tuple[int, ...]
    key: tuple[int, ...]
    mask: tuple[int, ...] | None
    mask_causal: bool | None
    is_causal: bool | None
    scaling: float | None
    sliding_window: Any
    softcap: float | None
    sinks: bool
    position_bias: bool
    extra: tuple[str, ...]
    mask_bias: bool = False


@dataclass
class BlockCall:
    """One call of a candidate block (an element of a ModuleList): its argument names and their values' kinds.

    args: (name, summary) per argument, positional ones named by the forward's signature; a summary is
    ``("tensor", shape, dtype)``, ``("tuple", (element ids))``, ``("none",)`` or ``("other", type name)``.
    ids: argument name -> id() of tensor (or tuple element) values, to match them with producers' outputs.
    """

    module: torch.nn.Module
    args: dict[str, tuple]
    ids: dict[str, tuple[int, ...]]


@dataclass
class ProducerCall:
    """A module outside the blocks that was called during the probe, with the ids of what it returned."""

    module: torch.nn.Module
    output_ids: tuple[int, ...]


@dataclass
class ChildCall:
    """A direct child of a candidate block was called: the ids of the tensor it read first and returned first."""

    block: torch.nn.Module
    name: str
    input_id: int | None
    output_id: int | None


@dataclass
class ProbeRecords:
    """Everything one probe forward recorded, in call order."""

    attention: list[AttentionRecord] = field(default_factory=list)
    blocks: list[BlockCall] = field(default_factory=list)
    producers: list[ProducerCall] = field(default_factory=list)
    children: list[ChildCall] = field(default_factory=list)
    implementation_set: bool = True
    error: str | None = None
    # every tensor whose id() is recorded stays referenced while the records live, so no id is reused
    keep: list = field(default_factory=list, repr=False)


_ACTIVE: contextvars.ContextVar[ProbeRecords | None] = contextvars.ContextVar("anchorlens_probe", default=None)


def _mask_summary(mask: Any, q_len: int) -> tuple[tuple[int, ...] | None, bool | None]:
    """(shape, causal?) of an attention mask; causal: row 0 (unpadded) sees exactly keys 0..q of the last q."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return (tuple(mask.shape) if isinstance(mask, torch.Tensor) else None), None
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    row = visible[0, 0, -q_len:, -q_len:].cpu()
    if q_len < 2:
        return tuple(mask.shape), None
    return tuple(mask.shape), bool(torch.equal(row, torch.ones_like(row).tril()))


def mask_carries_bias(mask: Any) -> bool:
    """Whether an additive mask holds values other than 0 (visible) and the dtype's minimum (hidden)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype == torch.bool or not mask.is_floating_point():
        return False
    visible = mask > torch.finfo(mask.dtype).min / 2
    return bool((visible & (mask != 0)).any())


def probe_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Record the call, then compute the output with transformers' sdpa (the probe's numbers are never used)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    records = _ACTIVE.get()
    if records is not None:
        shape, causal = _mask_summary(attention_mask, query.shape[2])
        records.attention.append(
            AttentionRecord(
                module=module,
                query=tuple(query.shape),
                key=tuple(key.shape),
                mask=shape,
                mask_causal=causal,
                is_causal=is_causal,
                scaling=None if scaling is None else float(scaling),
                sliding_window=kwargs.get("sliding_window"),
                softcap=kwargs.get("softcap"),
                sinks=kwargs.get("s_aux") is not None,
                position_bias=kwargs.get("position_bias") is not None,
                extra=tuple(sorted(k for k, v in kwargs.items() if v is not None)),
                mask_bias=mask_carries_bias(attention_mask),
            )
        )
    kwargs = {k: v for k, v in kwargs.items() if k not in ("s_aux", "softcap", "sliding_window", "output_attentions")}
    bias = kwargs.pop("position_bias", None)
    if bias is not None:
        attention_mask = bias if attention_mask is None else attention_mask + bias
    output, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )
    return output, None


def register_probe() -> str:
    """Register the recording attention function and its mask builder (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(PROBE_IMPLEMENTATION, probe_attention_forward)
    AttentionMaskInterface.register(PROBE_IMPLEMENTATION, sdpa_mask)
    return PROBE_IMPLEMENTATION


def block_lists(model: torch.nn.Module) -> dict[str, torch.nn.ModuleList]:
    """Every ModuleList of the model by path, outermost first (candidates for lists of blocks)."""
    return {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.ModuleList)}


def _summary(value: Any) -> tuple[tuple, tuple[int, ...]]:
    """(summary, ids) of one block argument (see :class:`BlockCall`)."""
    if value is None:
        return ("none",), ()
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype), (id(value),)
    if isinstance(value, tuple | list) and value and all(isinstance(v, torch.Tensor) for v in value):
        return ("tuple", tuple(tuple(v.shape) for v in value)), tuple(id(v) for v in value)
    return ("other", type(value).__name__), ()


def _first_tensor(values: Any) -> torch.Tensor | None:
    """The first tensor among ``values`` (a tensor, or a tuple/list/dict values of them)."""
    if isinstance(values, torch.Tensor):
        return values
    items = values.values() if isinstance(values, dict) else values if isinstance(values, tuple | list) else ()
    return next((v for v in items if isinstance(v, torch.Tensor)), None)


def _child_hooks(block: torch.nn.Module, records: ProbeRecords) -> list:
    """Hooks on the block's direct children recording what each reads and returns (to tell parallel blocks)."""
    handles = []
    for name, child in block.named_children():
        if isinstance(child, torch.nn.ModuleList):
            continue

        def pre(module, args, kwargs, name=name):
            found = _first_tensor(args) if args else _first_tensor(kwargs)
            records.keep.append(found)
            records.children.append(ChildCall(block, name, None if found is None else id(found), None))

        def post(module, args, kwargs, output, name=name):
            found = _first_tensor(output)
            records.keep.append(found)
            for call in reversed(records.children):
                if call.block is block and call.name == name and call.output_id is None:
                    call.output_id = None if found is None else id(found)
                    break

        handles.append(child.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(child.register_forward_hook(post, with_kwargs=True))
    return handles


def _named_arguments(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name (positional ones named by the forward's signature)."""
    try:
        names = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        names = []
    named = {names[i] if i < len(names) else f"arg{i}": a for i, a in enumerate(args)}
    named.update(kwargs)
    return named


@contextmanager
def _recording_hooks(model: torch.nn.Module, records: ProbeRecords) -> Iterator[None]:
    """Pre-hooks on every ModuleList element (candidate blocks), forward hooks on every module outside them."""
    handles = []
    inside: set[int] = set()
    for module_list in block_lists(model).values():
        for block in module_list:
            inside.update(id(m) for m in block.modules())

            def pre(module, args, kwargs):
                named = _named_arguments(module, args, kwargs)
                records.keep.append(named)
                summaries = {name: _summary(value) for name, value in named.items()}
                records.blocks.append(
                    BlockCall(
                        module, {n: s for n, (s, _) in summaries.items()}, {n: i for n, (_, i) in summaries.items()}
                    )
                )

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            handles.extend(_child_hooks(block, records))

    def post(module, args, output):
        ids = (
            (id(output),)
            if isinstance(output, torch.Tensor)
            else tuple(id(o) for o in output if isinstance(o, torch.Tensor))
            if isinstance(output, tuple)
            else ()
        )
        if ids:
            records.keep.append(output)
            records.producers.append(ProducerCall(module, ids))

    for module in model.modules():
        if id(module) not in inside and module is not model and not isinstance(module, torch.nn.ModuleList):
            handles.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def probe_inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Keyword arguments of the probe forward: 2 rows of :data:`PROBE_LEN` token ids, the second left-padded;
    an encoder-decoder also gets :data:`PROBE_TARGET_LEN` decoder ids."""
    config: Any = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    device = next(model.parameters()).device
    ids = (torch.arange(PROBE_LEN, device=device) % max(vocab - 3, 1) + min(3, max(vocab - 1, 0))).expand(2, -1)
    mask = torch.ones(2, PROBE_LEN, dtype=torch.long, device=device)
    mask[1, :PROBE_PAD] = 0
    inputs = {"input_ids": ids.contiguous(), "attention_mask": mask}
    if getattr(config, "is_encoder_decoder", False):
        start = getattr(config, "decoder_start_token_id", None) or 0
        inputs["decoder_input_ids"] = torch.full((2, PROBE_TARGET_LEN), int(start), dtype=torch.long, device=device)
    return inputs


def run_probe(model: torch.nn.Module) -> ProbeRecords:
    """Run the probe forward on ``model`` (no grad, no cache) and return what it recorded.

    The model's attention implementation is restored afterwards. ``implementation_set`` is False when
    transformers would not switch the model to a registered attention function (its attention bypasses
    ``AttentionInterface``); ``error`` holds the one-line reason when the probe forward raised.
    """
    import logging

    from transformers.utils import logging as hf_logging

    records = ProbeRecords()
    before = getattr(model.config, "_attn_implementation", None)
    register_probe()
    logger = hf_logging.get_logger("transformers.modeling_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the "cannot set its attention implementation" warning becomes our refusal
    try:
        model.set_attn_implementation(PROBE_IMPLEMENTATION)  # type: ignore[operator]
    finally:
        logger.setLevel(level)
    records.implementation_set = getattr(model.config, "_attn_implementation", None) == PROBE_IMPLEMENTATION
    token = _ACTIVE.set(records)
    try:
        with _recording_hooks(model, records), torch.no_grad():
            kwargs: dict[str, Any] = {"use_cache": False} if "use_cache" in _forward_parameters(model) else {}
            model(**probe_inputs(model), **kwargs)
    except Exception as err:  # the reason becomes a one-line refusal, never a traceback
        records.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
    finally:
        _ACTIVE.reset(token)
        if records.implementation_set and before is not None:
            model.set_attn_implementation(before)  # type: ignore[operator]
    return records


def _forward_parameters(model: torch.nn.Module) -> set[str]:
    """Names the model's forward accepts."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()
