"""Row-level edits of an encoded batch: fit to a length by cutting the longest field, append tokens."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import torch

from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import Role


@dataclass
class Row:
    """The valid positions of one example: ids, roles, fields and token strings (equal lengths)."""

    ids: list[int]
    roles: list[int]
    fields: list[str]
    tokens: list[str]

    def keep(self, positions: list[int]) -> Row:
        """The row restricted to ``positions`` (in order)."""
        return Row(
            [self.ids[i] for i in positions],
            [self.roles[i] for i in positions],
            [self.fields[i] for i in positions],
            [self.tokens[i] for i in positions],
        )


def split_rows(batch: Encoded) -> list[Row]:
    """The valid (unpadded) positions of every example of ``batch``."""
    rows = []
    for b in range(batch.batch_size):
        pos = batch.attention_mask[b].nonzero().flatten().tolist()
        rows.append(
            Row(
                [int(batch.input_ids[b, i]) for i in pos],
                [int(batch.roles[b, i]) for i in pos],
                [batch.fields[b][i] for i in pos],
                [batch.tokens[b][i] for i in pos],
            )
        )
    return rows


def join_rows(batch: Encoded, rows: list[Row], pad_id: int, pad_token: str) -> Encoded:
    """A new batch (same padding side, example ids, target side and meta) holding ``rows``.

    input_ids, attention_mask, roles: [B, T'] with T' the longest row.
    """
    width = max(len(r.ids) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    roles = torch.full((b, width), int(Role.SPECIAL), dtype=torch.long)
    fields, tokens = [], []
    for i, r in enumerate(rows):
        n, pad = len(r.ids), width - len(r.ids)
        lo = pad if batch.padding_side == "left" else 0
        ids[i, lo : lo + n] = torch.tensor(r.ids, dtype=torch.long)
        mask[i, lo : lo + n] = 1
        roles[i, lo : lo + n] = torch.tensor(r.roles, dtype=torch.long)
        if batch.padding_side == "left":
            fields.append([""] * pad + r.fields)
            tokens.append([pad_token] * pad + r.tokens)
        else:
            fields.append(r.fields + [""] * pad)
            tokens.append(r.tokens + [pad_token] * pad)
    return replace(
        batch, input_ids=ids, attention_mask=mask, roles=roles, fields=fields, tokens=tokens, meta=dict(batch.meta)
    )


def fit_row(row: Row, max_length: int) -> Row:
    """Cut content tokens from the end of the longest field(s) until ``row`` has ``max_length`` positions.

    Template text, specials and the end of the input (``answer:``) are kept; ValueError when the
    non-content positions alone exceed ``max_length``.
    """
    excess = len(row.ids) - max_length
    if excess <= 0:
        return row
    counts = Counter(f for f, r in zip(row.fields, row.roles) if r == int(Role.CONTENT))
    if sum(counts.values()) < excess:
        raise ValueError(f"cannot fit an input of {len(row.ids)} tokens into {max_length}: too little content")
    drop: Counter = Counter()
    for _ in range(excess):  # one token at a time from the currently longest field
        name = max(counts, key=lambda f: (counts[f] - drop[f], f))
        drop[name] += 1
    keep: list[int] = []
    seen: Counter = Counter()
    for i in reversed(range(len(row.ids))):
        name = row.fields[i]
        if row.roles[i] == int(Role.CONTENT) and seen[name] < drop[name]:
            seen[name] += 1
            continue
        keep.append(i)
    return row.keep(sorted(keep))


def strip_trailing_specials(row: Row) -> Row:
    """The row without specials at its end (an appended ``</s>``), so it ends at ``answer:``."""
    end = len(row.ids)
    while end > 1 and row.roles[end - 1] == int(Role.SPECIAL):
        end -= 1
    return row.keep(list(range(end)))


def append_tokens(row: Row, ids: list[int], tokens: list[str], role: Role, field: str) -> Row:
    """The row with ``ids`` appended at its end under ``role``/``field``."""
    return Row(
        row.ids + list(ids),
        row.roles + [int(role)] * len(ids),
        row.fields + [field] * len(ids),
        row.tokens + list(tokens),
    )
