"""Plain text: documents cut into windows of at most ``max_length`` tokens, each window one example.

A document is tokenized once (with offsets, without specials; a long one in pieces, see :class:`Windows`); window
w holds tokens ``[w·L', (w+1)·L')`` where L' is ``max_length`` less the specials the tokenizer adds (a BOS per
window), and its text is the document's characters from the end of the previous window to its last token's end
(the windows tile the document). Windows are examples like any other: rendered (one content span), encoded with the
task's token rules. Re-tokenizing a window's text gives back its tokens except, rarely, at a merge across the cut;
every window is truncated to ``max_length`` all the same. Only the (document, start, end) triples are kept; the
text is read from the documents when a window is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from anchorlens.tasks.explode import Row

TEXT_FIELD = "text"
DEFAULT_WINDOW = 512
PIECE = 1 << 16  # characters of a document tokenized at once
BATCH_CHARS = 1 << 20  # characters per tokenizer call


def _added_specials(tokenizer: Any) -> int:
    """How many tokens the tokenizer adds to one text (a BOS, an EOS...)."""
    return len(tokenizer("a", add_special_tokens=True)["input_ids"]) - len(
        tokenizer("a", add_special_tokens=False)["input_ids"]
    )


class Windows(Sequence[Row]):
    """The windows of a sequence of documents: example i is ``{"text", "idx", "document", "window", "tokens"}``.

    A document is tokenized in pieces of at most :data:`PIECE` characters, each cut before a whitespace (one
    50 MB line in one call took tiny-llama's fast tokenizer 73 s and 9 GB; in pieces, 26 s and under 1 GB): the
    time grows with the text, the tokenizer's memory with a batch of pieces only. A piece that starts at a space
    tokenizes as it would inside the whole text (byte-level and most other tokenizers start a word at its space);
    only a word longer than half a piece is cut inside.
    """

    def __init__(self, documents: Sequence[Row], tokenizer: Any, max_length: int, batch: int = 64) -> None:
        if max_length < 2:
            raise ValueError(f"windows need --max-length of at least 2 tokens, got {max_length}")
        self.documents = documents
        self.max_length = int(max_length)
        self.per_window = max(1, self.max_length - max(0, _added_specials(tokenizer)))
        self._document: tuple[int, str, int | str] = (-1, "", -1)  # the last one read: (position, text, id)
        rows: list[tuple[int, int, int, int, int]] = []
        cutter = _Cutter(self.per_window, rows)
        pending: list[tuple[int, int, str, int]] = []  # (document, piece start, piece text, document length)
        chars = 0
        for document in range(len(documents)):
            text = str(documents[document][TEXT_FIELD])
            for lo, hi in _pieces(text):
                pending.append((document, lo, text[lo:hi], len(text)))
                chars += hi - lo
                if len(pending) >= batch or chars >= BATCH_CHARS:
                    self._tokenize(tokenizer, pending, cutter)
                    pending, chars = [], 0
        self._tokenize(tokenizer, pending, cutter)
        cutter.finish()
        self._spans = np.asarray(rows, dtype=np.int64).reshape(-1, 5)

    @staticmethod
    def _tokenize(tokenizer: Any, pending: list[tuple[int, int, str, int]], cutter: _Cutter) -> None:
        """Tokenize ``pending`` pieces in one call and feed their token ends, in order, to ``cutter``."""
        if not pending:
            return
        enc = tokenizer(
            [piece for _, _, piece, _ in pending],
            add_special_tokens=False,
            return_offsets_mapping=True,
            return_attention_mask=False,
        )
        for (document, start, _, length), offsets in zip(pending, enc["offset_mapping"]):
            ends = np.fromiter((end for _, end in offsets), dtype=np.int64, count=len(offsets)) + start
            cutter.feed(document, ends, length)

    def __len__(self) -> int:
        return int(self._spans.shape[0])

    def __getitem__(self, i: int) -> Row:  # type: ignore[override]
        """Window ``i`` as an example."""
        doc, w, lo, hi, n = (int(v) for v in self._spans[i])
        cached = self._document
        if cached[0] != doc:  # one read of a (long) document per document, not per window
            source = self.documents[doc]
            cached = self._document = (doc, str(source[TEXT_FIELD]), _document_id(source.get("idx"), doc))
        return {
            TEXT_FIELD: cached[1][lo:hi],
            "idx": i,
            "document": cached[2],
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


def _pieces(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the pieces of ``text`` tokenized at once: at most :data:`PIECE` characters, each but the
    last ending before the last whitespace of its second half (so the next piece starts at a word's space)."""
    lo, n = 0, len(text)
    while n - lo > PIECE:
        hi = lo + PIECE
        cut = max(text.rfind(c, lo + PIECE // 2, hi) for c in " \n\t\r")
        hi = cut if cut > lo else hi
        yield lo, hi
        lo = hi
    yield lo, n


class _Cutter:
    """Cuts the token ends of documents, fed piece by piece in order, into windows of ``per_window`` tokens: rows
    (document, window, char start, char end, tokens) appended to ``rows``. The windows tile a document's text (a
    window starts where the previous one ended, so whitespace a tokenizer's offsets leave out between tokens is
    kept, and the last one runs to the end); a document without tokens has no window."""

    def __init__(self, per_window: int, rows: list[tuple[int, int, int, int, int]]) -> None:
        self.per_window = per_window
        self.rows = rows
        self.document, self.length = -1, 0
        self.window = self.begin = self.count = 0

    def feed(self, document: int, ends: np.ndarray, length: int) -> None:
        """The token ends (absolute character offsets) of the next piece of ``document`` (``length`` characters)."""
        if document != self.document:
            self.finish()
            self.document, self.length = document, length
            self.window = self.begin = self.count = 0
        first = self.per_window - self.count - 1  # the piece's token that fills the open window
        for k in range(first, len(ends), self.per_window):
            end = int(ends[k])
            self.rows.append((document, self.window, self.begin, end, self.per_window))
            self.window, self.begin = self.window + 1, end
        if first >= len(ends):
            self.count += len(ends)
        else:  # the tokens after the last window closed in this piece
            self.count = (len(ends) - first - 1) % self.per_window

    def finish(self) -> None:
        """Close the open document: its last window runs to the end of its text."""
        if self.document < 0:
            return
        if self.count:
            self.rows.append((self.document, self.window, self.begin, self.length, self.count))
        elif self.rows and self.rows[-1][0] == self.document:
            doc, w, lo, _, n = self.rows[-1]
            self.rows[-1] = (doc, w, lo, self.length, n)
        self.document, self.count = -1, 0


def _document_id(idx: Any, position: int) -> int | str:
    """A document's id: its ``idx`` as the data wrote it (an integer, or text such as ``doc-a``), else its position."""
    if idx is None:
        return position
    if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
        return int(idx)
    return str(idx)
