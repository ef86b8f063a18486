"""Stream a model's attention over examples into a tidy metrics frame, and certify the capture against eager."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from anchorlens import runtime as rt
from anchorlens.analyses import default_reducers, metrics_frame
from anchorlens.capture.certificate import CertifyOptions, certify, require_exact
from anchorlens.capture.collect import encode_batches, stream_statistics
from anchorlens.capture.selection import Selection
from anchorlens.tasks.prompts import Prompts
from anchorlens.workflows.inputs import Inputs


def capture_statistics(
    model,
    inputs: Inputs,
    *,
    selection: Selection = Selection(),
    batch_size: int = 8,
    max_length: int | None = None,
    anchors: Sequence[str] | None = None,
    progress=None,
    prompts: Prompts | None = None,
) -> pd.DataFrame:
    """Per-example metric rows (reducers + derived metrics) of ``model`` on ``inputs`` (rendered by ``prompts``, built
    from the inputs and the model's tokenizer when not given)."""
    from anchorlens.methods import load_guided

    model = load_guided(model)  # a Base becomes GuidedModel(base); a GuidedModel passes
    anchors = tuple(anchors or model.anchors())
    entropy_anchor = model.entropy_anchor() or "capsule"
    prompts = prompts or inputs.prompts(model.base.tokenizer, max_length)
    rows = prompts.examples(inputs.examples)  # the examples, or a text task's windows
    reducers = default_reducers(entropy_anchor, roles=prompts.roles)
    info = rt.dist_info()
    ids = list(range(len(rows)))
    if rt.initialized():  # torchrun / accelerate: this rank streams its shard, then ranks sum their states
        ids = rt.shard(ids, info.rank, info.world_size)
    batches = encode_batches(
        model,
        [rows[i] for i in ids],
        prompts,
        batch_size=batch_size,
        example_ids=ids,
        max_length=max_length,
    )
    stream_statistics(model, batches, reducers, selection, progress=progress)
    rt.all_reduce_reducers(reducers)
    return metrics_frame(reducers, anchors=anchors)


def certify_capture(
    model,
    rows: Sequence,
    prompts: Prompts,
    *,
    selection: Selection = Selection(),
    max_length: int | None = None,
    options: CertifyOptions = CertifyOptions(),
    label: str = "the capture",
) -> dict | None:
    """The manifest's ``exactness`` record of ``model``'s capture on the first rows (None when disabled).

    InexactCaptureError (one line naming the layer) when the capture differs from eager beyond the dtype's threshold,
    unless ``options.allow_inexact``.
    """
    if not options.enabled or not rows:
        return None
    count = min(options.examples, len(rows))
    batch = next(
        encode_batches(
            model,
            [rows[i] for i in range(count)],
            prompts,
            batch_size=count,
            example_ids=range(count),
            max_length=max_length,
        )
    )
    certificate = certify(model, batch, selection)
    require_exact(certificate, label, options.allow_inexact)
    return certificate.to_json()
