"""What an attention view sends to the browser: quantised, compressed maps and their inverse.

Every map is sent on one scale shared by every layer, head and checkpoint of the view (so colours compare
across them), sqrt-coded so values down to ~1e-9 of the largest stay non-zero:

- full maps (one layer and head, a layer's mean over heads, a head's mean over layers, the mean over all):
  the visible cells only (row-major; under a causal mask the lower triangle) as 12-bit codes,
  ``value = (code / 4095)^2 * vmax`` (so ``|shown - value| <= sqrt(value * vmax) / 4095``: 0.024 % of vmax at
  most, 0.8 % of a value of vmax/1000), all high bytes then all low bytes (they compress better apart), zlib,
  base64: about 0.6 MB for a 1,000-token causal map of SmolLM2;
- thumbnails (every head of every layer, plus the means): ``T x T`` block means over the visible cells, ``uint8``,
  ``value = (code / 254)^2 * tvmax``; code 255 marks a block with no visible cell (masked, drawn hatched).

Masked cells (the causal upper triangle) are never sent; a query row with no attention at all (a fully masked
row, all zeros) is recognised by its zero sum and drawn hatched too, never as a value.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence

import numpy as np
import torch

CODE_MAX = 4095  # full maps: 12-bit codes in two byte planes
THUMB_MAX = 254  # thumbnails: uint8, 255 = no visible cell
THUMB_MASKED = 255
THUMB_SIZE = 48  # thumbnails are at most THUMB_SIZE x THUMB_SIZE blocks


def is_causal(probs: torch.Tensor) -> bool:
    """True when every map is square with an all-zero strict upper triangle (a causal mask)."""
    q, k = probs.shape[-2:]
    return q == k and q > 1 and not torch.triu(probs, diagonal=1).any().item()


def visible(q: int, k: int, causal: bool) -> np.ndarray:
    """[Q, K] bool: the cells a query can attend to (all of them unless ``causal``)."""
    cells = np.ones((q, k), dtype=bool)
    return np.tril(cells) if causal else cells


def encode_full(qk: np.ndarray, vmax: float, causal: bool) -> str:
    """base64(zlib(high bytes, low bytes)) of the 12-bit sqrt codes of the visible cells of ``qk`` [Q, K], row-major."""
    cells = qk[visible(qk.shape[0], qk.shape[1], causal)]
    codes = np.round(np.sqrt(np.clip(cells, 0.0, None) / vmax) * CODE_MAX).astype(np.uint16)
    planes = np.concatenate([(codes >> 8).astype(np.uint8), (codes & 0xFF).astype(np.uint8)])
    return base64.b64encode(zlib.compress(planes.tobytes(), 6)).decode("ascii")


def decode_full(b64: str, shape: tuple[int, int], vmax: float, causal: bool) -> np.ndarray:
    """[Q, K] float64 from :func:`encode_full` (what the browser shows); NaN on masked cells."""
    planes = np.frombuffer(zlib.decompress(base64.b64decode(b64)), dtype=np.uint8)
    half = planes.size // 2
    codes = planes[:half].astype(np.int64) * 256 + planes[half:]
    out = np.full(shape, np.nan)
    out[visible(*shape, causal)] = (codes.astype(np.float64) / CODE_MAX) ** 2 * vmax
    return out


def blocks(n: int, size: int = THUMB_SIZE) -> np.ndarray:
    """[n] thumbnail block index of each position: ``min(n, size)`` blocks of near-equal length."""
    t = min(n, size)
    return (np.arange(n) * t) // max(n, 1)


def thumbnail(qk: np.ndarray, causal: bool, size: int = THUMB_SIZE) -> np.ndarray:
    """[Tq, Tk] mean of the visible cells of each block of ``qk`` [Q, K]; NaN for a block with none."""
    q, k = qk.shape
    seen = visible(q, k, causal)
    starts_q = np.flatnonzero(np.diff(blocks(q, size), prepend=-1))
    starts_k = np.flatnonzero(np.diff(blocks(k, size), prepend=-1))

    def block_sums(x: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.add.reduceat(x, starts_q, axis=0), starts_k, axis=1)

    total, count = block_sums(np.where(seen, qk, 0.0)), block_sums(seen.astype(np.float64))
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def encode_thumbs(thumbs: np.ndarray, tvmax: float) -> str:
    """base64(zlib(uint8 sqrt codes)) of thumbnails [..., Tq, Tk]; NaN (no visible cell) as 255."""
    codes = np.round(np.sqrt(np.clip(np.nan_to_num(thumbs), 0.0, None) / tvmax) * THUMB_MAX).astype(np.uint8)
    codes[np.isnan(thumbs)] = THUMB_MASKED
    return base64.b64encode(zlib.compress(codes.tobytes(), 6)).decode("ascii")


def decode_thumbs(b64: str, shape: Sequence[int], tvmax: float) -> np.ndarray:
    """Inverse of :func:`encode_thumbs`: float64 of ``shape``, NaN where no cell is visible."""
    codes = np.frombuffer(zlib.decompress(base64.b64decode(b64)), dtype=np.uint8).reshape(shape)
    out = (codes.astype(np.float64) / THUMB_MAX) ** 2 * tvmax
    out[codes == THUMB_MASKED] = np.nan
    return out


def empty_rows(qk: np.ndarray, causal: bool) -> np.ndarray:
    """[Q] bool: query rows with no attention on any visible key (fully masked rows), shown hatched."""
    seen = visible(qk.shape[0], qk.shape[1], causal)
    return np.asarray(~(np.where(seen, qk, 0.0) > 0).any(axis=1))
