"""From task examples to captured statistics or maps: render, encode, batch, capture."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from anchorlens.capture.maps import AttentionMaps
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.reducer import Reducer
from anchorlens.capture.run import CaptureTarget, capture_batch
from anchorlens.capture.selection import Selection
from anchorlens.capture.sinks import MapSink, StreamSink, merge_plans
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.scheme import RoleScheme
from anchorlens.roles.templates import Rendered


class PromptRenderer(Protocol):
    """What renders examples for a run: a task's prompts (template, demonstrations, chat) or a bare Template."""

    @property
    def scheme(self) -> RoleScheme:
        """The run's role table and token rules."""
        ...

    def render(self, example: Mapping) -> Rendered:
        """One example's text with a role for every character."""
        ...


class InputTruncated(UserWarning):
    """Some inputs were longer than the limit and lost their right end."""


def encode_batches(
    target: CaptureTarget,
    examples: Sequence[Mapping],
    prompts: PromptRenderer,
    batch_size: int = 8,
    example_ids: Sequence[int] | None = None,
    max_length: int | None = None,
    sort_by_length: bool = True,
) -> Iterator[Encoded]:
    """Render (``prompts``: the task's prompts, or a Template) and encode examples in batches with the run's role
    scheme; length-sorted batches waste less padding, and the longest batch
    (by rendered characters) comes first, so that memory peaks at once (an input too long for the machine
    fails before any other work) and the capture's reused buffers are allocated at about their largest.

    Inputs longer than ``max_length`` (default: the base's context length) are truncated; a
    ``InputTruncated`` warning says how many once all batches are out.
    """
    ids = list(range(len(examples))) if example_ids is None else list(example_ids)
    context = target.context_length
    limit = min(x for x in (max_length, context) if x is not None) if (max_length or context) else None
    rendered = [prompts.render(ex) for ex in examples]
    scheme = prompts.scheme
    order = list(range(len(examples)))
    if sort_by_length:
        order.sort(key=lambda i: len(rendered[i].text), reverse=True)
    truncated = 0
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = target.encode(
            [rendered[i] for i in chunk], example_ids=[ids[i] for i in chunk], max_length=limit, scheme=scheme
        )
        truncated += int(batch.meta.get("truncated", 0))
        yield batch
    if truncated:
        why = "--max-length" if max_length is not None and limit == max_length else "the base's context length"
        warnings.warn(
            InputTruncated(
                f"truncated {truncated} of {len(examples)} examples to {limit} tokens ({why}); "
                "pass --max-length to choose the limit"
            ),
            stacklevel=2,
        )


def stream_statistics(
    target: CaptureTarget,
    batches: Iterable[Encoded],
    reducers: Sequence[Reducer],
    selection: Selection = Selection(),
    progress=None,
    options: CaptureOptions = CaptureOptions(),
    *,
    plans: dict[str, str] | None = None,
) -> Sequence[Reducer]:
    """Feed every batch's attention to ``reducers`` and flush them (those that have ``flush``); memory stays one
    batch of one site's maps.

    ``plans``: a dict to fill with the plan the engine took at each site (site name -> ``"kernel"``,
    ``"materialised"``, or ``"mixed"`` where batches or calls differed; merged with what it holds,
    :func:`~anchorlens.capture.sinks.merge_plans`)."""
    sink = StreamSink(reducers)
    scratch: dict = {}  # the recompute's buffers, shared by every batch
    for batch in batches:
        capture_batch(target, batch, sink, selection, need_logits=False, options=options, scratch=scratch)
        if progress is not None:
            progress.update(batch.batch_size)
    sink.close()
    if plans is not None:
        merge_plans(plans, sink.plans)
    return reducers


def collect_maps(
    target: CaptureTarget,
    batches: Iterable[Encoded],
    selection: Selection = Selection(),
    max_examples: int = 8,
    options: CaptureOptions = CaptureOptions(),
) -> list[AttentionMaps]:
    """Full maps of the first ``max_examples`` examples (use for a handful, not for datasets)."""
    sink = MapSink(max_examples=max_examples)
    scratch: dict = {}
    seen = 0
    for batch in batches:
        if seen >= max_examples:
            break
        capture_batch(target, batch, sink, selection, need_logits=False, options=options, scratch=scratch)
        seen += batch.batch_size
    return sink.maps(dict(target.adapter.stack_sequences))
