"""The layout of a loaded model, discovered from what its probe forward did (no table of families).

From :func:`~anchorlens.models.adapters.probe.run_probe`'s records: the attention sites (the modules that called
the attention interface), the block list each lives in and its index there (= the layer), which stack it serves
(decoder, encoder or cross, from the model's encoder and the calls' shapes and masks), the blocks' arguments and
what each carries (hidden states, mask, position ids, position embeddings and the module that produced them),
per-layer sliding windows and attention chunks (from the config's layer types, as transformers' masking builds
them, checked against the windows the calls passed), key/value geometry per layer, the layers that have no softmax
attention (hybrid models), and the mechanisms the model uses. When something cannot be decided, the layout says
why guidance or a prefix cannot be inserted (``guidance_refusal``, ``prefix_refusal``), or :func:`discover` refuses
the model with one line naming the reason.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.models.adapters.probe import PROBE_LEN, PROBE_TARGET_LEN, ProbeRecords, block_lists, run_probe

# transformers' mask builders per layer type (``masking_utils.LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING``) reduced to
# what a splice must redo on a longer sequence: nothing (full causal), a sliding band, or chunks.
FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"
_MOE = re.compile(r"moe|experts", re.IGNORECASE)
_QK_NORM = re.compile(r"^(q|k|qk|query|key)_?(norm|layernorm|ln)$", re.IGNORECASE)


@dataclass(frozen=True)
class SiteLayout:
    """One softmax-attention site: stack, layer (its block's index), module path and the call's geometry.

    heads / kv_heads: query and key/value heads; head_dim: the query's; key_dim: the key's; window: the sliding
    window the call passed (None: none); sinks: learned sink logits (``s_aux``); softcap: logit soft-capping;
    mask_bias: the call's mask holds more than visibility (one mask per head, or values besides 0 and the dtype's
    minimum: a position bias such as Falcon's ALiBi added into the mask).
    """

    stack: str
    layer: int
    path: str
    heads: int
    kv_heads: int
    head_dim: int
    key_dim: int
    scaling: float | None
    window: int | None
    sinks: bool
    softcap: float | None
    bias: bool = False
    mask_bias: bool = False


@dataclass(frozen=True)
class StackLayout:
    """One stack: its block list's path, how many blocks, query/key sequences, causality."""

    name: str
    blocks: str
    num_layers: int
    sequences: tuple[str, str]
    causal: bool


@dataclass(frozen=True)
class BlockArgs:
    """How the blocks of one block list are called: positional parameter names and the role of each argument.

    roles: argument name -> ``hidden`` | ``mask`` | ``positions`` | ``rotary`` | ``static``; rotary: argument
    name -> path of the module (outside the blocks) whose output it is, per layer (None where absent);
    rotary_values: how many different position-embedding values the blocks received in one forward (Gemma 3:
    one per layer type).
    """

    positional: tuple[str, ...]
    roles: dict[str, str]
    rotary: dict[str, tuple[str | None, ...]]
    rotary_values: int = 0


@dataclass(frozen=True)
class Discovered:
    """The discovered layout of one model (see the module docstring)."""

    model_type: str
    stacks: dict[str, StackLayout]
    sites: tuple[SiteLayout, ...]
    block_args: dict[str, BlockArgs]
    layer_kinds: dict[str, tuple[str, ...]]  # per block stack, per layer: "attention" or the layer's own type
    masks: dict[str, tuple[tuple[str, int | None], ...]]  # per block stack, per layer: (FULL|SLIDING|CHUNKED, size)
    mechanisms: tuple[str, ...]
    guidance_refusal: str | None = None
    prefix_refusal: str | None = None
    layer_refusal: str | None = None  # why positions cannot be inserted per layer (input-level guidance still can)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def is_encoder_decoder(self) -> bool:
        """Whether the model has an encoder and a decoder stack."""
        return "cross" in self.stacks or ("encoder" in self.stacks and "decoder" in self.stacks)

    def sites_of(self, stack: str) -> list[SiteLayout]:
        """The sites of ``stack`` in layer order."""
        return sorted((s for s in self.sites if s.stack == stack), key=lambda s: s.layer)

    def other_layers(self, stack: str) -> dict[str, list[int]]:
        """Layers of ``stack``'s blocks without softmax attention, by their kind (``linear_attention``: [0, 1, 2])."""
        out: dict[str, list[int]] = {}
        for layer, kind in enumerate(self.layer_kinds.get(stack, ())):
            if kind != "attention":
                out.setdefault(kind, []).append(layer)
        return out


def text_config(model: torch.nn.Module) -> Any:
    """The model's (text) config."""
    config: Any = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _block_of(path: str, lists: dict[str, torch.nn.ModuleList]) -> tuple[str, int] | None:
    """(block list path, index) of the outermost ModuleList element that contains module ``path``."""
    best: tuple[str, int] | None = None
    for list_path in lists:
        prefix = f"{list_path}." if list_path else ""
        if not path.startswith(prefix):
            continue
        head = path[len(prefix) :].split(".", 1)[0]
        if head.isdigit() and (best is None or len(list_path) < len(best[0])):
            best = (list_path, int(head))
    return best


def _causal(record, module: torch.nn.Module) -> bool:
    """Whether a recorded call was causal: its mask says so, else its ``is_causal``, else the module's."""
    if record.mask_causal is not None:
        return record.mask_causal
    if record.is_causal is not None:
        return bool(record.is_causal)
    return bool(getattr(module, "is_causal", True))


def _window(value: Any) -> int | None:
    """A call's ``sliding_window`` as one int (ModernBERT passes (left, right)); None when absent."""
    if value is None:
        return None
    if isinstance(value, tuple | list):
        return int(max(value)) if value else None
    return int(value)


def layer_masks(config: Any, num_layers: int) -> tuple[tuple[tuple[str, int | None], ...], str | None]:
    """Per layer (FULL|SLIDING|CHUNKED, window or chunk) as transformers' masking builds it, and a reason when some
    layer type's mask is none of these (None otherwise).

    ``config.layer_types`` picks the builder per layer (``masking_utils.LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING``);
    without layer types, ``config.sliding_window`` applies to every layer (Mistral, Starcoder2) or is absent.
    """
    from transformers import masking_utils as mu

    window = getattr(config, "sliding_window", None)
    chunk = getattr(config, "attention_chunk_size", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        kind = (SLIDING, int(window)) if window is not None else (FULL, None)
        return tuple([kind] * num_layers), None
    builders = {FULL: mu.create_causal_mask, SLIDING: mu.create_sliding_window_causal_mask}
    chunked = getattr(mu, "create_chunked_causal_mask", None)
    recurrent = getattr(mu, "create_recurrent_attention_mask", None)
    table = getattr(mu, "LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING", {})
    out: list[tuple[str, int | None]] = []
    problem = None
    for layer in range(num_layers):
        layer_type = types[layer] if layer < len(types) else None
        builder = table.get(layer_type)
        if builder is builders[SLIDING] and window is not None:
            out.append((SLIDING, int(window)))
        elif builder is chunked and chunked is not None and chunk is not None:
            out.append((CHUNKED, int(chunk)))
        elif builder is builders[FULL] or builder is recurrent or (builder is builders[SLIDING] and window is None):
            out.append((FULL, None))
        else:
            out.append((FULL, None))
            problem = (
                problem or f"layer type {layer_type!r} builds a mask anchorlens cannot extend for inserted positions"
            )
    return tuple(out), problem


def _arg_roles(calls: list, lists_len: int, producers: dict[int, str], seq: int) -> tuple[BlockArgs, list[str]]:
    """Roles of the block arguments of one block list (from its calls), and the arguments a splice cannot extend."""
    roles: dict[str, str] = {}
    rotary: dict[str, list[str | None]] = {}
    unknown: list[str] = []
    values: set[tuple[int, ...]] = set()
    positional: tuple[str, ...] = ()
    for index, call in calls:
        names = list(call.args)
        if not positional:
            positional = tuple(names)
        for position, (name, summary) in enumerate(call.args.items()):
            if position == 0:
                roles[name] = "hidden"
                continue
            kind = summary[0]
            ids = call.ids.get(name, ())
            source = next((producers[i] for i in ids if i in producers), None)
            if source is not None and kind in ("tensor", "tuple"):
                roles[name] = "rotary"
                values.add(ids)
                rotary.setdefault(name, [None] * lists_len)[index] = source
            elif kind == "tensor" and "mask" in name and "encoder" not in name:
                roles.setdefault(name, "mask")
            elif kind == "tensor" and name == "position_ids":
                roles.setdefault(name, "positions")
            elif kind == "tensor" and seq in summary[1]:
                roles[name] = "sequence"
                if name not in unknown:
                    unknown.append(name)
            else:
                roles.setdefault(name, "static")
    return BlockArgs(positional, roles, {k: tuple(v) for k, v in rotary.items()}, len(values)), unknown


def _mechanisms(model: torch.nn.Module, config: Any, sites: list[SiteLayout], found: dict[str, Any]) -> list[str]:
    """What the model uses, from its calls, module tree and config (for the manifest and ``anchorlens models``)."""
    out: list[str] = []
    if any(s.kv_heads == 1 < s.heads for s in sites):
        out.append("multi-query attention")
    elif any(s.kv_heads < s.heads for s in sites):
        out.append("grouped-query attention")
    if found["sliding"]:
        out.append("sliding windows")
    if found["chunked"]:
        out.append("chunked attention")
    if found["mixed"]:
        out.append("mixed layer types")
    if any(s.sinks for s in sites):
        out.append("learned sinks")
    if any(s.softcap is not None for s in sites):
        out.append("logit soft-capping")
    if any(s.scaling is not None and abs(s.scaling - s.head_dim**-0.5) > 1e-9 * s.scaling for s in sites):
        out.append("attention scale other than 1/sqrt(head dim)")
    if found["other"]:
        out.append("hybrid (layers without softmax attention)")
    names = {n for n, _ in model.named_modules()}
    site_paths = [s.path for s in sites]
    if any(_QK_NORM.match(n.rsplit(".", 1)[-1]) for n in names if any(n.startswith(p + ".") for p in site_paths)):
        out.append("QK-norm")
    if any(_MOE.search(type(m).__name__) for _, m in model.named_modules()):
        out.append("mixture of experts")
    if getattr(config, "kv_lora_rank", None):
        out.append("multi-head latent attention")
    rope = getattr(config, "rope_parameters", None) or {}
    partial = getattr(config, "partial_rotary_factor", None) or (
        rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    )
    if (partial is not None and float(partial) < 1.0) or found["partial"]:
        out.append("partial rotary")
    if found["per_type_rotary"]:
        out.append("rotary per layer type")
    if found["nope"]:
        out.append("NoPE layers")
    if any(s.bias for s in sites):
        out.append("relative position bias")
    if any(s.mask_bias for s in sites):
        out.append("position bias in the attention mask")
    if found["parallel"]:
        out.append("parallel attention and MLP")
    if found["bidirectional"]:
        out.append("bidirectional attention")
    if found["cross"]:
        out.append("cross-attention")
    return out


def _nope_layers(model: torch.nn.Module, sites: list[SiteLayout], config: Any) -> bool:
    """Whether some attention layers apply no rotary while others do (``use_rope`` off, ``no_rope_layers``)."""
    flags = [getattr(model.get_submodule(s.path), "use_rope", None) for s in sites]
    if any(f is not None for f in flags) and len({bool(f) for f in flags if f is not None}) > 1:
        return True
    layers = getattr(config, "no_rope_layers", None)
    return isinstance(layers, list | tuple) and len(set(layers)) > 1


def _partial_rotary(model: torch.nn.Module, producers: set[str], sites: list[SiteLayout]) -> bool:
    """Whether a rotary producer rotates fewer dimensions than the heads have (2 x its inv_freq < head dim)."""
    dims = {s.head_dim for s in sites}
    for path in producers:
        module = model.get_submodule(path)
        for name, buffer in module.named_buffers(recurse=False):
            if name.endswith("inv_freq") and buffer.dim() == 1 and all(2 * buffer.numel() < d for d in dims):
                return True
    return False


def _parallel(model: torch.nn.Module, records: ProbeRecords, sites: list[SiteLayout], lists) -> bool:
    """Whether a block's feed-forward reads what its attention reads (a parallel block: Falcon, Phi, GPT-NeoX).

    In the first attention block: the feed-forward child is the largest direct child that is not the one holding
    the attention. Parallel when it read the attention child's input, the block's input, or what a child reading
    the block's input returned (its own norm of the block input); a sequential block feeds it the sum after attention.
    """
    if not sites:
        return False
    site = sites[0]
    place = _block_of(site.path, lists)
    if place is None:
        return False
    block = lists[place[0]][place[1]]
    prefix = f"{place[0]}.{place[1]}."
    holder = site.path[len(prefix) :].split(".", 1)[0]
    calls = [c for c in records.children if c.block is block]
    others = [(n, c) for n, c in block.named_children() if n != holder and not isinstance(c, torch.nn.ModuleList)]
    if not calls or not others:
        return False
    ffn = max(others, key=lambda item: sum(p.numel() for p in item[1].parameters()))[0]
    first = {c.name: c for c in reversed(calls)}  # the first call of each child
    block_input = next((b.ids for b in records.blocks if b.module is block), {})
    hidden = next(iter(block_input.values()), ())
    read = {first[n].input_id for n in first if n == holder}
    read.update(hidden)
    read.update(c.output_id for c in first.values() if c.input_id in hidden and c.name != ffn)
    return ffn in first and first[ffn].input_id in read


def discover(model: torch.nn.Module, records: ProbeRecords | None = None) -> Discovered:
    """The layout of ``model`` (see the module docstring); UsageError (one line) when the model cannot be captured."""
    config = text_config(model)
    model_type = str(getattr(model.config, "model_type", type(model).__name__))
    records = records if records is not None else run_probe(model)
    if not records.implementation_set:
        raise UsageError(
            f"{model_type}: its attention bypasses transformers' AttentionInterface (transformers cannot switch "
            "it to a registered attention function), so anchorlens cannot capture it exactly; use a model whose "
            "attention transformers implements with the interface"
        )
    if records.error is not None:
        raise UsageError(f"{model_type}: the probe forward failed ({records.error}); anchorlens cannot discover it")
    if not records.attention:
        raise UsageError(
            f"{model_type}: no module called transformers' AttentionInterface in a forward (its attention is "
            "written inline or it has no softmax attention), so anchorlens cannot capture it exactly"
        )
    names = {id(m): n for n, m in model.named_modules()}
    lists = block_lists(model)
    encoder_path = None
    get_encoder = getattr(model, "get_encoder", None)
    if getattr(model.config, "is_encoder_decoder", False) and callable(get_encoder):
        encoder_path = names.get(id(get_encoder()))
    sites: list[SiteLayout] = []
    stack_lists: dict[str, str] = {}
    causal: dict[str, set[bool]] = {}
    seen: set[tuple[str, int]] = set()
    _refuse_shared_modules(model_type, records, names)
    for record in records.attention:
        path = names.get(id(record.module))
        place = None if path is None else _block_of(path, lists)
        if path is None or place is None:
            raise UsageError(
                f"{model_type}: the attention module {path or type(record.module).__name__} is not inside a list "
                "of blocks, so anchorlens cannot tell its layer"
            )
        list_path, layer = place
        if encoder_path is not None:
            if path.startswith(encoder_path + "."):
                stack = "encoder"
            elif record.query[2] == PROBE_TARGET_LEN and record.key[2] == PROBE_LEN:
                stack = "cross"
            else:
                stack = "decoder"
        else:
            stack = "decoder" if _causal(record, record.module) else "encoder"
        block_stack = "decoder" if stack == "cross" else stack
        if stack_lists.setdefault(block_stack, list_path) != list_path:
            raise UsageError(
                f"{model_type}: attention runs in two lists of blocks ({stack_lists[block_stack]}, {list_path}); "
                "anchorlens captures one list per stack"
            )
        if (stack, layer) in seen:  # another module of the same block (one module called twice is refused above)
            raise UsageError(
                f"{model_type}: block {layer} of {list_path} calls attention twice in one stack; anchorlens "
                "captures one attention module per block and stack"
            )
        seen.add((stack, layer))
        causal.setdefault(stack, set()).add(_causal(record, record.module))
        sites.append(
            SiteLayout(
                stack=stack,
                layer=layer,
                path=path,
                heads=record.query[1],
                kv_heads=record.key[1],
                head_dim=record.query[3],
                key_dim=record.key[3],
                scaling=record.scaling,
                window=_window(record.sliding_window),
                sinks=record.sinks,
                softcap=record.softcap,
                bias=record.position_bias,
                mask_bias=_mask_bias(record),
            )
        )
    if encoder_path is None and len(stack_lists) > 1:
        raise UsageError(
            f"{model_type}: its decoder mixes causal and bidirectional attention layers; anchorlens captures one "
            "kind per stack"
        )
    for stack, kinds in causal.items():
        if len(kinds) > 1 and stack != "cross":
            raise UsageError(
                f"{model_type}: the {stack} mixes causal and bidirectional attention layers; anchorlens captures "
                "one kind per stack"
            )
    return _assemble(model, model_type, config, records, names, lists, sites, stack_lists, causal)


def _refuse_shared_modules(model_type: str, records: ProbeRecords, names: dict[int, str]) -> None:
    """UsageError (one line) when one attention module ran more than once in the probe forward.

    ALBERT runs one shared layer (and its one attention module) for every layer: a capture hooks modules, so the
    calls would land on one site, and eager returns one map per call. Anchorlens cannot tell such layers apart.
    """
    modules = {id(record.module): record.module for record in records.attention}
    counts = Counter(id(record.module) for record in records.attention)
    for key, calls in counts.items():
        if calls > 1:
            path = names.get(key, type(modules[key]).__name__)
            raise UsageError(
                f"{model_type} reuses one attention module ({path}) for {calls} attention calls in one forward "
                "(layers that share weights); anchorlens needs one attention module per layer, so it cannot "
                "capture this model: use a model whose layers have their own attention modules"
            )


def _mask_bias(record) -> bool:
    """Whether a call's 4D mask holds more than visibility: one mask per head, or bias values (ALiBi)."""
    shape = record.mask
    return bool(record.mask_bias) or (shape is not None and len(shape) == 4 and shape[1] != 1)


def _assemble(model, model_type, config, records, names, lists, sites, stack_lists, causal) -> Discovered:
    """The Discovered layout from the classified sites (see :func:`discover`)."""
    sequences = {"encoder": ("input", "input"), "decoder": ("input", "input"), "cross": ("target", "input")}
    encoder_decoder = "encoder" in stack_lists and "decoder" in stack_lists
    if encoder_decoder:
        sequences["decoder"] = ("target", "target")
    stacks: dict[str, StackLayout] = {}
    for stack in ("encoder", "decoder", "cross"):
        block_stack = "decoder" if stack == "cross" else stack
        if block_stack not in stack_lists or not any(s.stack == stack for s in sites):
            continue
        list_path = stack_lists[block_stack]
        stacks[stack] = StackLayout(
            stack, list_path, len(lists[list_path]), sequences[stack], stack != "cross" and True in causal[stack]
        )
    producers = {i: names[id(p.module)] for p in records.producers for i in p.output_ids if id(p.module) in names}
    block_args: dict[str, BlockArgs] = {}
    layer_kinds: dict[str, tuple[str, ...]] = {}
    masks: dict[str, tuple[tuple[str, int | None], ...]] = {}
    unknown: dict[str, list[str]] = {}
    problems: list[str] = []
    types = getattr(config, "layer_types", None)
    for block_stack, list_path in stack_lists.items():
        blocks = list(lists[list_path])
        index = {id(b): i for i, b in enumerate(blocks)}
        calls = [(index[id(c.module)], c) for c in records.blocks if id(c.module) in index]
        if encoder_decoder or not calls:
            calls = calls[: len(blocks)]
        block_args[block_stack], unknown[block_stack] = _arg_roles(
            calls, len(blocks), producers, _seq(block_stack, encoder_decoder)
        )
        have = {s.layer for s in sites if s.stack == block_stack}
        layer_kinds[block_stack] = tuple(
            "attention"
            if i in have
            else (str(types[i]) if types is not None and i < len(types) else "no softmax attention")
            for i in range(len(blocks))
        )
        masks[block_stack], problem = layer_masks(config, len(blocks))
        if problem and block_stack == "decoder":
            problems.append(problem)
    decoder_sites = [s for s in sites if s.stack == "decoder"]
    for site in decoder_sites:
        kind, size = masks.get("decoder", ())[site.layer] if "decoder" in masks else (FULL, None)
        if site.window is not None and (kind != SLIDING or size != site.window):
            problems.append(
                f"layer {site.layer}'s attention passes sliding_window={site.window} but its config mask is {kind}"
                + (f" {size}" if size else "")
            )
            break
    rotary_paths = {p for args in block_args.values() for per in args.rotary.values() for p in per if p}
    found = {
        "sliding": any(k == SLIDING for m in masks.values() for k, _ in m) or any(s.window for s in sites),
        "chunked": any(k == CHUNKED for m in masks.values() for k, _ in m),
        "mixed": len({k for m in masks.values() for k, _ in m}) > 1,
        "other": any(k != "attention" for kinds in layer_kinds.values() for k in kinds),
        "partial": _partial_rotary(model, rotary_paths, sites),
        "nope": _nope_layers(model, decoder_sites, config),
        "per_type_rotary": any(args.rotary_values > 1 for args in block_args.values()),
        "parallel": _parallel(model, records, decoder_sites or sites, lists),
        "bidirectional": "encoder" in stacks and not encoder_decoder,
        "cross": "cross" in stacks,
    }
    mechanisms = _mechanisms(model, config, sites, found)
    guidance = _guidance_refusal(model_type, stacks, encoder_decoder, unknown.get("decoder", []), problems)
    layer_refusal = guidance or _layer_refusal(model_type, decoder_sites)
    prefix = guidance or _prefix_refusal(model_type, layer_kinds.get("decoder", ()), decoder_sites)
    if prefix is None and getattr(config, "kv_lora_rank", None):  # the cache holds compressed latents, not keys
        prefix = f"{model_type} caches compressed key/value latents (multi-head latent attention), not per-head keys"
    return Discovered(
        model_type=model_type,
        stacks=stacks,
        sites=tuple(sorted(sites, key=lambda s: (list(sequences).index(s.stack), s.layer))),
        block_args=block_args,
        layer_kinds=layer_kinds,
        masks=masks,
        mechanisms=tuple(mechanisms),
        guidance_refusal=guidance,
        prefix_refusal=prefix,
        layer_refusal=layer_refusal,
    )


def _seq(block_stack: str, encoder_decoder: bool) -> int:
    """The probe's sequence length in ``block_stack``'s blocks."""
    return PROBE_TARGET_LEN if encoder_decoder and block_stack == "decoder" else PROBE_LEN


def _guidance_refusal(
    model_type: str, stacks: dict[str, StackLayout], encoder_decoder: bool, unknown: list[str], problems: list[str]
) -> str | None:
    """Why positions cannot be inserted per layer into this model (None: they can)."""
    if encoder_decoder:
        return f"{model_type} is an encoder-decoder: guidance is verified on T5 only"
    if "decoder" not in stacks:
        return f"{model_type} is a bidirectional encoder: it supports capture only"
    if unknown:
        return f"{model_type}'s blocks take {', '.join(unknown)}, which depends on the sequence and anchorlens cannot extend"
    if problems:
        return f"{model_type}: {problems[0]}"
    return None


def _layer_refusal(model_type: str, sites: list[SiteLayout]) -> str | None:
    """Why positions cannot be inserted at every layer while input-level ones can (None: they can).

    A position bias the model adds into the attention mask (Falcon's ALiBi: [B, heads, Q, K], slope x key position)
    is computed once from the input's length; a splice extends only visibility, so inserted positions would get no
    bias and the old keys a stale one. Input-level guidance is exact: the model builds the bias for the longer input.
    """
    biased = [s.layer for s in sites if s.mask_bias]
    if not biased:
        return None
    return (
        f"{model_type} adds a position bias (ALiBi) into the attention mask of layer {biased[0]}, which anchorlens "
        "cannot extend for positions inserted per layer; use input-level guidance (instance, soft prompt) on it"
    )


def _prefix_refusal(model_type: str, kinds: tuple[str, ...], sites: list[SiteLayout]) -> str | None:
    """Why key-only prefixes (PEFT prefix tuning) cannot be prepended (None: they can)."""
    if any(k != "attention" for k in kinds):
        return f"{model_type} has layers without softmax attention, which hold no keys for a prefix"
    geometry = {(s.kv_heads, s.key_dim) for s in sites}
    if len(geometry) != 1 or any(s.key_dim != s.head_dim for s in sites):
        return f"{model_type}'s layers differ in key/value geometry, so one prefix shape cannot serve them all"
    return None
