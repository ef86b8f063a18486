"""From task examples to captured statistics or maps: render, encode, batch, capture."""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Sequence

from anchorlens.capture.maps import AttentionMaps
from anchorlens.capture.reducer import Reducer
from anchorlens.capture.run import CaptureTarget, capture_batch
from anchorlens.capture.selection import Selection
from anchorlens.capture.sinks import MapSink, StreamSink
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.templates import Template


def _base(target: CaptureTarget):
    """The Base under a guided model (or the target itself)."""
    return getattr(target, "base", target)


def encode_batches(
    target: CaptureTarget,
    examples: Sequence[Mapping],
    template: Template,
    batch_size: int = 8,
    example_ids: Sequence[int] | None = None,
    max_length: int | None = None,
    sort_by_length: bool = True,
) -> Iterator[Encoded]:
    """Render and encode examples in batches; length-sorted batches waste less padding."""
    ids = list(range(len(examples))) if example_ids is None else list(example_ids)
    rendered = [template.render(ex) for ex in examples]
    order = list(range(len(examples)))
    if sort_by_length:
        order.sort(key=lambda i: len(rendered[i].text))
    base = _base(target)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        yield base.encode([rendered[i] for i in chunk], example_ids=[ids[i] for i in chunk], max_length=max_length)


def stream_statistics(
    target: CaptureTarget,
    batches: Iterable[Encoded],
    reducers: Sequence[Reducer],
    selection: Selection = Selection(),
    progress=None,
) -> Sequence[Reducer]:
    """Feed every batch's attention to ``reducers``; memory stays one batch of one site's maps."""
    sink = StreamSink(reducers)
    for batch in batches:
        capture_batch(target, batch, sink, selection)
        if progress is not None:
            progress.update(batch.batch_size)
    return reducers


def collect_maps(
    target: CaptureTarget,
    batches: Iterable[Encoded],
    selection: Selection = Selection(),
    max_examples: int = 8,
) -> list[AttentionMaps]:
    """Full maps of the first ``max_examples`` examples (use for a handful, not for datasets)."""
    sink = MapSink(max_examples=max_examples)
    seen = 0
    for batch in batches:
        if seen >= max_examples:
            break
        capture_batch(target, batch, sink, selection)
        seen += batch.batch_size
    return sink.maps(dict(_base(target).adapter.stack_sequences))
