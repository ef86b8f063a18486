"""Which attention sites and heads to capture, TransformerLens-style filterable names.

``Site`` is re-exported from the adapters, which name every site of an architecture.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from anchorlens.errors import UnknownNameError, UsageError
from anchorlens.methods.knockout import MOST_INDICES, count_indices, range_outside, span_text
from anchorlens.models.adapters.site import Site

__all__ = ["IndexRanges", "Selection", "Site", "parse_heads", "parse_indices", "parse_layers", "parse_ranges"]


def _normalize(index: int, size: int) -> int:
    """``index`` in ``-size..size-1`` as ``0..size-1``."""
    return index + size if index < 0 else index


@dataclass(frozen=True, eq=False)
class IndexRanges(Sequence[int]):
    """Indices as the inclusive ranges a flag wrote (``--layers 0,5-8,-1``), not expanded: a range such as
    ``0-1000000000`` costs nothing until it is checked against a model (:meth:`outside`); iterating it builds the
    indices, refused (one line) past more than any model has (the knockout's bound, ``MOST_INDICES``)."""

    flag: str
    text: str
    spans: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        """How many indices (counted, not built)."""
        return count_indices(self.spans)

    def __iter__(self) -> Iterator[int]:
        """The indices in written order; UsageError naming the flag when they are more than any model has."""
        if len(self) > MOST_INDICES:
            raise UsageError(
                f"{self.flag} {self.text} names {len(self):,} indices, more than any model has; give indices within "
                "the model's"
            )
        for first, last in self.spans:
            yield from range(first, last + 1)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        """One index, or a slice as a tuple (built: bounded as :meth:`__iter__`)."""
        return tuple(self)[index]

    def __eq__(self, other: object) -> bool:
        """Equal to indices (ranges, a tuple or a list) that are the same in the same order."""
        if not isinstance(other, (IndexRanges, tuple, list)) or len(other) != len(self):
            return False
        return tuple(self) == tuple(other)

    def __hash__(self) -> int:
        """The hash of the spans (a tuple of the same indices may hash differently)."""
        return hash(self.spans)

    def outside(self, size: int) -> tuple[int, int] | None:
        """The first written range not within ``-size..size-1`` (None when all are), found without expanding any."""
        return range_outside(self.spans, -size, size - 1)


def _check_range(flag: str, indices: Sequence[int], size: int, what: str) -> None:
    """UsageError naming the valid range when an index falls outside ``-size..size-1``; ranges as written
    (:class:`IndexRanges`) are checked as ranges first, naming the range, before any index is built."""
    if isinstance(indices, IndexRanges):
        flag = indices.flag
        bad = indices.outside(size)
        if bad is not None:
            raise UsageError(
                f"{flag} {span_text(*bad)} is out of range: this base has {size} {what} (0..{size - 1}, or -{size}..-1)"
            )
    for index in indices:
        if not -size <= index < size:
            raise UsageError(
                f"{flag} {index} is out of range: this base has {size} {what} (0..{size - 1}, or -{size}..-1)"
            )


def _check_attention(
    layers: Sequence[int],
    stacks: Collection[str],
    layers_per_stack: Mapping[str, int],
    attention_layers: Mapping[str, Collection[int]],
) -> None:
    """UsageError when every selected layer lacks softmax attention in every selected stack (nothing to capture)."""
    for stack in stacks:
        have = set(attention_layers.get(stack, ()))
        if any(_normalize(layer, layers_per_stack[stack]) in have for layer in layers):
            return
    stack = next(iter(stacks))
    listed = sorted(attention_layers.get(stack, ()))
    raise UsageError(
        f"--layers {','.join(map(str, layers))} selects only layers without softmax attention in the {stack} "
        f"(hybrid model); its attention layers are {', '.join(map(str, listed))}"
    )


@dataclass(frozen=True)
class Selection:
    """Filter of sites and heads. None means all.

    stacks: stack names; layers: layer indices (negative counts from the end); heads: head indices
    (negative counts from the end); names: glob patterns over site names (``"decoder.*"``,
    ``"encoder.1[0-2]"``). :meth:`validate` checks the indices against a model. Layers and heads given as the
    ranges a flag wrote (:class:`IndexRanges`, from :func:`parse_ranges`) are checked as ranges there, then become
    plain tuples.
    """

    stacks: tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None

    @classmethod
    def written(cls, layers: IndexRanges | None = None, heads: IndexRanges | None = None, **kw: Any) -> Selection:
        """A selection of layers and heads as written on the command line, expanded only once :meth:`validate`
        has checked them against a model."""
        return cls(layers=layers, heads=heads, **kw)  # type: ignore[arg-type]  # tuples once validated

    def validate(
        self,
        layers_per_stack: Mapping[str, int],
        num_heads: int | None,
        attention_layers: Mapping[str, Collection[int]] | None = None,
    ) -> None:
        """Raise UsageError (one line, the valid range) for stacks, layers or heads the model does not have.

        ``attention_layers``: per stack, the layers that have softmax attention (hybrid models have others); a
        ``--layers`` selection that names only layers without it is refused, naming the layers that have it.
        """
        if self.stacks is not None:
            unknown = [s for s in self.stacks if s not in layers_per_stack]
            if unknown:
                raise UnknownNameError(
                    f"unknown stack {unknown[0]!r}: this base has {', '.join(sorted(layers_per_stack))}"
                )
        stacks = self.stacks if self.stacks is not None else tuple(layers_per_stack)
        if self.layers is not None and stacks:
            _check_range("--layers", self.layers, max(layers_per_stack[s] for s in stacks), "layers")
            if attention_layers is not None:
                _check_attention(self.layers, stacks, layers_per_stack, attention_layers)
        if self.heads is not None and num_heads is not None:
            _check_range("--heads", self.heads, num_heads, "heads")
        self._expand()

    def _expand(self) -> None:
        """Ranges as written (checked by :meth:`validate`) become the tuples of indices they name."""
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if isinstance(value, IndexRanges):
                object.__setattr__(self, name, tuple(value))  # frozen: the same selection, its indices built

    def head_indices(self, num_heads: int) -> tuple[int, ...] | None:
        """The selected heads as ``0..num_heads-1`` (negative ones counted from the end), or None for all."""
        if self.heads is None:
            return None
        return tuple(_normalize(h, num_heads) for h in self.heads)

    def accepts(self, site: Site, num_layers: int) -> bool:
        """Whether ``site`` (in a stack of ``num_layers`` layers) is selected; out-of-range layers select nothing."""
        if self.stacks is not None and site.stack not in self.stacks:
            return False
        if self.layers is not None:
            wanted = {_normalize(layer, num_layers) for layer in self.layers}
            if site.layer not in wanted:
                return False
        if self.names is not None and not any(fnmatch.fnmatch(site.name, p) for p in self.names):
            return False
        return True


def parse_ranges(text: str | None, flag: str = "--layers") -> IndexRanges | None:
    """Parse ``"0,2,5-8,-1"`` into the ranges written, not expanded (:class:`IndexRanges`); None or ``"all"`` means
    all. UsageError names ``flag`` on bad text or a reversed range."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                cut = part.index("-", 1)
                lo, hi = int(part[:cut]), int(part[cut + 1 :])
                if hi < lo:
                    raise UsageError(f"{flag} {part} is a reversed range: write {hi}-{lo}")
                spans.append((lo, hi))
            else:
                spans.append((int(part), int(part)))
        except ValueError as err:
            if isinstance(err, UsageError):
                raise
            raise UsageError(f"{flag} {text!r} is not a list of indices: write e.g. 0,2,5-8,-1") from None
    return IndexRanges(flag, text.strip(), tuple(spans))


def parse_indices(text: str | None, flag: str = "--layers") -> tuple[int, ...] | None:
    """Parse ``"0,2,5-8,-1"`` into indices; None or ``"all"`` means all. UsageError names ``flag`` on bad text, and
    on more indices than any model has (refused before they are built; :func:`parse_ranges` keeps them as ranges
    for a check against the model)."""
    ranges = parse_ranges(text, flag)
    return None if ranges is None else tuple(ranges)


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """Parse a ``--layers`` value (``"0,2,5-8,-1"``, ``"all"``)."""
    return parse_indices(text, "--layers")


def parse_heads(text: str | None) -> tuple[int, ...] | None:
    """Parse a ``--heads`` value (``"0,2,5-8,-1"``, ``"all"``)."""
    return parse_indices(text, "--heads")
