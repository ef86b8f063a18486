"""Tokenize rendered templates and give every token a role and field from character offsets.

Role rule for one token with character offsets ``[s, e)`` (spans are *filled* when their text came from
data: a field, a system prompt, a demonstration's answer; *literal* when a template wrote it):

1. tokens the tokenizer added (``special_tokens_mask``, or an empty offset on a special id) and
   padding are SPECIAL, field ``""``; special tokens written in the text (a chat template's
   ``<|im_start|>``) take the role of their span like any other token;
2. a token overlapping a non-whitespace filled character takes that span's role (CONTENT for a
   field); its field is the filled span with the most overlapping (non-whitespace, then any)
   characters, ties to the earliest;
3. else a token overlapping a non-whitespace literal character takes that span's role
   (STRUCTURAL for template text), field = the segment's name (most overlap wins);
4. a token covering only whitespace takes the role of the whitespace it covers (filled first),
   so a lone ``"\\n"`` of the template is STRUCTURAL;
5. a zero-width non-special token takes the role of the character at its offset;
6. the scheme's token rules (:mod:`anchorlens.roles.scheme`) then re-tag tokens by their text.

Punctuation inside a field stays CONTENT unless a rule says otherwise: structural means the
template's own text only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import Role
from anchorlens.roles.scheme import DEFAULT_SCHEME, RoleScheme
from anchorlens.roles.templates import Rendered, Span

SPECIAL = Role.SPECIAL.label


def _overlap_score(text: str, span: Span, start: int, end: int) -> tuple[int, int]:
    """(non-whitespace, total) characters shared by ``[start, end)`` and ``span``."""
    lo, hi = max(start, span.start), min(end, span.end)
    if hi <= lo:
        return (0, 0)
    chunk = text[lo:hi]
    return (sum(not c.isspace() for c in chunk), hi - lo)


def _best(text: str, spans: Sequence[Span], slot: bool, start: int, end: int) -> tuple[tuple[int, int], Span | None]:
    """Best overlap score among filled (``slot``) or literal spans, and the span that has it."""
    best: tuple[int, int] = (0, 0)
    found: Span | None = None
    for span in spans:
        if span.slot != slot or span.end <= start or span.start >= end:
            continue
        score = _overlap_score(text, span, start, end)
        if score > best:
            best, found = score, span
    return best, found


def token_role(rendered: Rendered, start: int, end: int) -> tuple[str, str]:
    """Role name and field of a non-special token with character offsets ``[start, end)`` (rules 2-5)."""
    text, spans = rendered.text, rendered.spans
    if end <= start:  # zero width: the character at its position (or the last one)
        if not spans:
            return SPECIAL, ""
        for span in spans:
            if span.start <= start < span.end:
                return span.role, span.field
        return spans[-1].role, spans[-1].field
    filled, f_span = _best(text, spans, True, start, end)
    written, w_span = _best(text, spans, False, start, end)
    for score, best in ((filled[0], f_span), (written[0], w_span), (filled[1], f_span), (written[1], w_span)):
        if score and best is not None:
            return best.role, best.field
    return SPECIAL, ""  # offsets outside the text: treat as added by the tokenizer


def _pad_id(tokenizer: Any) -> int:
    """The pad id, falling back to eos; ValueError when the tokenizer has neither."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token; set pad_token")


def _tokenize(tokenizer: Any, texts: list[str], max_length: int | None, add_special_tokens: bool) -> Any:
    """Run the fast tokenizer with offsets and special masks; truncation keeps the left part."""
    kwargs: dict[str, Any] = dict(
        add_special_tokens=add_special_tokens,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        padding=False,
    )
    if max_length is None:
        return tokenizer(texts, truncation=False, **kwargs)
    old_side = getattr(tokenizer, "truncation_side", "right")
    tokenizer.truncation_side = "right"
    try:
        return tokenizer(texts, truncation=True, max_length=max_length, **kwargs)
    finally:
        tokenizer.truncation_side = old_side


def encode(
    rendered: Sequence[Rendered],
    tokenizer: Any,
    *,
    example_ids: Sequence[int] | torch.Tensor | None = None,
    max_length: int | None = None,
    padding_side: str | None = None,
    scheme: RoleScheme = DEFAULT_SCHEME,
) -> Encoded:
    """Tokenize a batch of rendered templates into a padded ``Encoded`` with per-token roles.

    Returns input_ids, attention_mask, roles: [B, T] long (T = longest example; ids of ``scheme.table``),
    fields and tokens as B lists of T strings, example_ids: [B] long (default 0..B-1).
    ``meta["truncated"]`` counts the examples cut to ``max_length`` (the left part is kept). A span role
    that is not in the scheme's table is a ValueError naming it.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("encode needs a fast tokenizer (offsets mapping); got " + type(tokenizer).__name__)
    items = list(rendered)
    if not items:
        raise ValueError("encode needs at least one example")
    side = padding_side or getattr(tokenizer, "padding_side", "right") or "right"
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    batch_size = len(items)
    if example_ids is None:
        ids_t = torch.arange(batch_size, dtype=torch.long)
    else:
        ids_t = torch.as_tensor(example_ids, dtype=torch.long).reshape(-1)
        if ids_t.numel() != batch_size:
            raise ValueError(f"{ids_t.numel()} example_ids for {batch_size} examples")
    pad_id = _pad_id(tokenizer)
    pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    special_ids = set(tokenizer.all_special_ids)

    table = scheme.table
    ids_of = {name: i for i, name in enumerate(table.names)}
    for r in items:
        for name in r.roles:
            if name not in ids_of:
                raise ValueError(
                    f"role {name!r} of a rendered span is not one of this run's roles: {', '.join(table.names)}"
                )
    special = ids_of[SPECIAL]
    batch = _tokenize(tokenizer, [r.text for r in items], max_length, scheme.add_special_tokens)
    rows_ids: list[list[int]] = batch["input_ids"]
    truncated = 0
    if max_length is not None:
        truncated = sum(1 for enc in batch.encodings if enc.overflowing)

    rows_roles: list[list[int]] = []
    rows_fields: list[list[str]] = []
    for r, ids, offsets, specials in zip(items, rows_ids, batch["offset_mapping"], batch["special_tokens_mask"]):
        roles, fields = [], []
        for tok_id, (start, end), is_special in zip(ids, offsets, specials):
            if is_special or (start == end and tok_id in special_ids):
                role, field = special, ""
            else:
                name, field = token_role(r, int(start), int(end))
                role = scheme.retag(ids_of[name], r.text[start:end]) if scheme.rules else ids_of[name]
            roles.append(role)
            fields.append(field)
        rows_roles.append(roles)
        rows_fields.append(fields)

    width = max(len(ids) for ids in rows_ids)
    input_ids = torch.full((batch_size, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch_size, width), dtype=torch.long)
    roles_t = torch.full((batch_size, width), special, dtype=torch.long)
    fields_out: list[list[str]] = []
    tokens_out: list[list[str]] = []
    for b, (ids, roles, fields) in enumerate(zip(rows_ids, rows_roles, rows_fields)):
        n, pad = len(ids), width - len(ids)
        lo = pad if side == "left" else 0
        input_ids[b, lo : lo + n] = torch.tensor(ids, dtype=torch.long)
        attention[b, lo : lo + n] = 1
        roles_t[b, lo : lo + n] = torch.tensor(roles, dtype=torch.long)
        toks = list(tokenizer.convert_ids_to_tokens(ids))
        if side == "left":
            fields_out.append([""] * pad + fields)
            tokens_out.append([pad_token] * pad + toks)
        else:
            fields_out.append(fields + [""] * pad)
            tokens_out.append(toks + [pad_token] * pad)

    return Encoded(
        input_ids=input_ids,
        attention_mask=attention,
        roles=roles_t,
        fields=fields_out,
        tokens=tokens_out,
        example_ids=ids_t,
        padding_side=side,
        meta={"truncated": truncated},
        role_table=table,
    )
