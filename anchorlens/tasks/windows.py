"""Plain text: documents cut into windows of at most ``max_length`` tokens, each window one example.

A document is tokenized once (with offsets, without specials); window w holds tokens ``[w·L', (w+1)·L')`` where
L' is ``max_length`` less the specials the tokenizer adds (a BOS per window), and its text is the document's
characters from the end of the previous window to its last token's end (the windows tile the document). Windows are examples like any other: rendered
(one content span), encoded with the task's token rules. Re-tokenizing a window's text gives back its tokens
except, rarely, at a merge across the cut; every window is truncated to ``max_length`` all the same. Only the
(document, start, end) triples are kept; the text is read from the documents when a window is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from anchorlens.tasks.explode import Row

TEXT_FIELD = "text"
DEFAULT_WINDOW = 512


def _added_specials(tokenizer: Any) -> int:
    """How many tokens the tokenizer adds to one text (a BOS, an EOS...)."""
    return len(tokenizer("a", add_special_tokens=True)["input_ids"]) - len(
        tokenizer("a", add_special_tokens=False)["input_ids"]
    )


class Windows(Sequence[Row]):
    """The windows of a sequence of documents: example i is ``{"text", "idx", "document", "window", "tokens"}``."""

    def __init__(self, documents: Sequence[Row], tokenizer: Any, max_length: int, batch: int = 64) -> None:
        if max_length < 2:
            raise ValueError(f"windows need --max-length of at least 2 tokens, got {max_length}")
        self.documents = documents
        self.max_length = int(max_length)
        self.per_window = max(1, self.max_length - max(0, _added_specials(tokenizer)))
        parts: list[np.ndarray] = []
        for start in range(0, len(documents), batch):
            docs = [documents[i] for i in range(start, min(len(documents), start + batch))]
            enc = tokenizer(
                [str(d[TEXT_FIELD]) for d in docs],
                add_special_tokens=False,
                return_offsets_mapping=True,
                return_attention_mask=False,
            )
            for k, offsets in enumerate(enc["offset_mapping"]):
                parts.append(self._cut(start + k, offsets, len(str(docs[k][TEXT_FIELD]))))
        self._spans = np.concatenate(parts) if parts else np.zeros((0, 5), dtype=np.int64)

    def _cut(self, document: int, offsets: Sequence[tuple[int, int]], length: int) -> np.ndarray:
        """[W, 5] int64 rows (document, window, char start, char end, tokens) of one document; the windows tile its
        text (a window starts where the previous one ended, so whitespace a tokenizer's offsets leave out between
        tokens is kept, and the last one runs to the end)."""
        n = len(offsets)
        rows = []
        begin = 0
        for w, lo in enumerate(range(0, n, self.per_window)):
            hi = min(n, lo + self.per_window)
            end = length if hi == n else int(offsets[hi - 1][1])
            rows.append((document, w, begin, end, hi - lo))
            begin = end
        return np.asarray(rows, dtype=np.int64).reshape(-1, 5)

    def __len__(self) -> int:
        return int(self._spans.shape[0])

    def __getitem__(self, i: int) -> Row:  # type: ignore[override]
        """Window ``i`` as an example."""
        doc, w, lo, hi, n = (int(v) for v in self._spans[i])
        text = str(self.documents[doc][TEXT_FIELD])
        source = self.documents[doc]
        return {
            TEXT_FIELD: text[lo:hi],
            "idx": i,
            "document": _document_id(source.get("idx"), doc),
            "window": w,
            "tokens": n,
            "label": None,
            "labelled": False,
        }

    def __iter__(self) -> Iterator[Row]:
        return (self[i] for i in range(len(self)))

    def tokens(self) -> int:
        """Total number of document tokens the windows cover."""
        return int(self._spans[:, 4].sum()) if len(self) else 0


def _document_id(idx: Any, position: int) -> int | str:
    """A document's id: its ``idx`` as the data wrote it (an integer, or text such as ``doc-a``), else its position."""
    if idx is None:
        return position
    if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
        return int(idx)
    return str(idx)
