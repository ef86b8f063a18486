"""``anchorlens.inspect``: one input through one model, shown inline in Jupyter.

Accepts what users hold: a spec string (``"instance"``), a loaded ``Base`` or ``GuidedModel``, a
transformers model plus its tokenizer, or a PEFT prompt-learning model plus its tokenizer.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from anchorlens.analyses import average_heads, metrics_frame
from anchorlens.analyses.evidence import parse_evidence
from anchorlens.analyses.evidence_table import NORM, WEIGHT, example_evidence, nullable_layers
from anchorlens.capture.certificate import Certificate, certify, require_exact
from anchorlens.capture.collect import collect_maps, encode_batches, stream_statistics
from anchorlens.capture.maps import AttentionMaps
from anchorlens.capture.run import check_selection, num_heads, stack_layers
from anchorlens.capture.selection import Selection
from anchorlens.errors import ArgumentTypeError, UnknownNameError, UsageError
from anchorlens.figures import attention_map_figure, clean_token, figure_to_png_bytes
from anchorlens.methods.guided import GuidedModel
from anchorlens.methods.spec import load_guided
from anchorlens.models.base import Base
from anchorlens.models.loading import discovered_adapter
from anchorlens.roles.jinja import JinjaTemplate
from anchorlens.roles.templates import Template
from anchorlens.tasks import TASKS, Task, get_task
from anchorlens.tasks.prompts import PromptOptions, Prompts, build_prompts
from anchorlens.workflows.statistics import model_reducers

STATIC_DPI = 90  # the PNG fallback of a saved notebook: readable, a few hundred KB at most
TOP_ANCHORS = 3
TEXT_TASK = "text"


def _task_for(example: Mapping, task: str | Path | Task | None) -> Task:
    """The task named (a built-in name, a task file, a Task), or the first built-in whose fields the example has."""
    if task is not None:
        return get_task(task)
    for spec in TASKS.values():
        if all(f in example for f in spec.fields):
            return spec
    raise UsageError(f"no task template has the fields {sorted(example)}; pass task=... or a plain string")


MODEL_KINDS = "a spec string (e.g. 'instance'), a Base, a GuidedModel, a transformers model or a PEFT model"


def _check_model_arg(model_or_spec: Any) -> None:
    """Refuse what is none of the accepted model kinds, naming the argument and the kinds."""
    if isinstance(model_or_spec, (str, Base, GuidedModel)) or _is_peft(model_or_spec):
        return
    if hasattr(getattr(model_or_spec, "config", None), "model_type"):
        return
    shown = repr(model_or_spec)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise ArgumentTypeError(
        f"inspect(): argument 'model_or_spec' must be {MODEL_KINDS}, got {type(model_or_spec).__name__} {shown}"
    )


def _check_example(example: Mapping, template: Template | JinjaTemplate) -> None:
    """Every field the template needs is present, not None, and text or a number: a missing field is named as missing."""
    for name in template.fields:
        value = example.get(name)
        if value is None:
            state = "is missing (its value is None)" if name in example else "is missing"
            raise UsageError(
                f"inspect(): field {name!r} of the example {state}; template {template.name!r} needs "
                f"{', '.join(template.fields)} (give each as text)"
            )
        if template.needs_scalars and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise UsageError(
                f"inspect(): field {name!r} of the example must be text or a number, got {type(value).__name__}"
            )


def _is_peft(obj: object) -> bool:
    return hasattr(obj, "peft_config") and hasattr(obj, "get_base_model")


def _hf_base(model: Any, tokenizer: Any) -> Base:
    """A transformers model and its tokenizer as a frozen ``Base`` (the model is put in eval mode)."""
    if tokenizer is None:
        raise UsageError("a transformers model needs its tokenizer: inspect(model, text, tokenizer=tokenizer)")
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "model_type"):
        raise UsageError(f"expected a transformers model, got {type(model).__name__}; pass a spec string or a Base")
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    name = str(getattr(cfg, "name_or_path", "") or type(model).__name__)
    return Base(spec=name, model=model, tokenizer=tokenizer, adapter=discovered_adapter(model, name))


def _peft_model(peft: Any, tokenizer: Any) -> GuidedModel:
    """A PEFT prompt-learning model as a GuidedModel (its adapter saved to a temp dir, read back by load_peft)."""
    from anchorlens.methods.peft_import import load_peft

    base = _hf_base(peft.get_base_model(), tokenizer)
    with tempfile.TemporaryDirectory(prefix="anchorlens-peft-") as tmp:
        peft.save_pretrained(tmp)
        return load_peft(tmp, base)


def as_model(
    model_or_spec: Any, *, tokenizer: Any = None, base: str | Base = "smollm2-135m"
) -> tuple[GuidedModel, str]:
    """(guided model, checkpoint name) from a spec, Base, GuidedModel, HF model (+ tokenizer) or PEFT model."""
    if isinstance(model_or_spec, str):
        return load_guided(model_or_spec, base), model_or_spec
    if isinstance(model_or_spec, (Base, GuidedModel)):
        model = load_guided(model_or_spec)
        return model, model.name
    if _is_peft(model_or_spec):
        model = _peft_model(model_or_spec, tokenizer)
        return model, f"{model.base.spec} + PEFT"
    hf = _hf_base(model_or_spec, tokenizer)
    return load_guided(hf), hf.spec


@contextmanager
def kept_attention(model: Any) -> Iterator[None]:
    """Run a capture and give the model back in the attention implementation it had (sdpa, eager...), also when the
    capture raised: the capture switches it to anchorlens' own function, which returns no attention weights, so a
    user's ``model(..., output_attentions=True)`` after ``inspect`` would otherwise get none."""
    hf = getattr(model, "model", model)
    config = getattr(hf, "config", None)
    before = getattr(config, "_attn_implementation", None)
    try:
        yield
    finally:
        if before is not None and getattr(config, "_attn_implementation", None) != before:
            hf.set_attn_implementation(before)


def _flag(message: str) -> str:
    """A Selection error worded for the Python API (``layers=`` rather than the CLI's ``--layers``)."""
    for flag in ("layers", "heads"):
        if message.startswith(f"--{flag} "):
            return f"inspect(): {flag}={message[len(flag) + 3 :]}"
    return f"inspect(): {message}"


def checked_selection(model: Any, layers: tuple[int, ...] | None, heads: tuple[int, ...] | None) -> Selection:
    """The Selection of ``inspect(layers=, heads=)``: UsageError for an empty tuple or an index the model lacks;
    heads named twice (``1`` and ``-3`` of 4) are captured once, in the order first named."""
    for what, values in (("layers", layers), ("heads", heads)):
        if values is not None and len(values) == 0:
            raise UsageError(f"inspect(): {what}=() selects nothing; pass None for all {what}, or e.g. {what}=(0, -1)")
    try:
        check_selection(model, Selection(layers=layers, heads=heads))
    except UsageError as err:
        raise type(err)(_flag(str(err))) from None
    count = num_heads(model.model)
    if heads is not None and count is not None:
        heads = tuple(dict.fromkeys(h + count if h < 0 else h for h in heads))
    return Selection(layers=layers, heads=heads)


@dataclass
class Inspection:
    """Maps and metrics of one input; in Jupyter an interactive map plus a static PNG of the same map."""

    model: Any
    example: dict
    prompts: Prompts
    maps: AttentionMaps
    selection: Selection
    checkpoint: str = "model"
    certificate: Certificate | None = None
    evidence: dict = field(default_factory=dict)  # name -> options of the evidence reducers (parse_evidence)
    _png: bytes | None = field(default=None, repr=False)
    _frame: pd.DataFrame | None = field(default=None, repr=False)

    def plot(
        self,
        layer: int | Literal["mean"] | None = "mean",
        head: int | Literal["mean"] | None = "mean",
        stack: str | None = None,
        scale: str = "sqrt",
    ) -> Figure:
        """Paper-style heatmap of one layer/head (or their means), titled with the checkpoint.

        ``layer``/``head``: a captured index (negative counts from the end of the model, as in ``inspect``), or
        ``"mean"``/None for the mean over the captured ones. UsageError for one that was not captured."""
        sm = self._stack(stack)
        name = stack or self.maps.default_stack
        layer = self._index("layer", layer, sm.layers, stack_layers(self.model)[0].get(name))
        head = self._index("head", head, sm.heads, num_heads(self.model.model))
        if scale not in ("linear", "sqrt", "log"):
            raise UsageError(f"plot(): scale must be 'linear', 'sqrt' or 'log', got {scale!r}")
        return attention_map_figure(
            {self.checkpoint: self.maps}, stack=stack, layer=layer, head=head, scale=scale, title="Attention map"
        )

    def _stack(self, stack: str | None) -> Any:
        """The maps of ``stack`` (default: the default stack); UnknownNameError naming the captured stacks."""
        name = stack or self.maps.default_stack
        if name not in self.maps.stacks:
            raise UnknownNameError(f"stack {name!r} was not captured; choose one of {', '.join(self.maps.stacks)}")
        return self.maps[name]

    @staticmethod
    def _index(what: str, value: Any, captured: Sequence[int], size: int | None) -> int | Literal["mean"] | None:
        """A plot's layer/head: "mean"/None as is, a negative index counted from the end of the model, and a
        UsageError (one line, the captured indices) for anything else or an index that was not captured."""
        if value is None or value == "mean":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ArgumentTypeError(f"plot(): {what} must be an int or 'mean', got {type(value).__name__} {value!r}")
        index = int(value) + size if value < 0 and size is not None else int(value)
        if index not in captured:
            raise UsageError(
                f"plot(): {what} {int(value)} was not captured; choose 'mean' or one of {list(captured)} "
                f"(inspect(..., {what}s=...) chooses what is captured)"
            )
        return index

    def metrics(self, per_head: bool = False) -> pd.DataFrame:
        """Tidy metric rows (anchor mass, structural attention, entropy, role flow...) of this input, with the
        evidence reducers' rows when ``inspect(evidence=...)`` asked for them (computed once)."""
        if self._frame is None:
            reducers = model_reducers(self.model, self.prompts.roles, self.evidence)
            batches = encode_batches(self.model, [self.example], self.prompts, batch_size=1)
            with kept_attention(self.model):
                stream_statistics(self.model, batches, reducers, self.selection)
            self._frame = metrics_frame(reducers, anchors=self.model.anchors())
        return self._frame.copy() if per_head else average_heads(self._frame)

    def field_flow(self) -> pd.DataFrame:
        """[field group x key group] mean attention mass the content tokens of each template field (``content:<field>``
        rows) put on the keys of every role and field group (columns), averaged over layers and heads; cells the mask
        fixes are NaN. Empty when the task's template has no fields."""
        groups = list(self.prompts.roles.group_names)
        columns = [*self.prompts.roles.names, *groups]
        frame = self.metrics()
        flow = frame[(frame["metric"] == "role_flow") & frame["query_role"].isin(groups)]
        if flow.empty:
            return pd.DataFrame(index=pd.Index([], name="query group"), columns=pd.Index([], name="key group"))
        table = flow.groupby(["query_role", "key_role"], observed=True)["value"].mean().unstack("key_role")
        table = table.reindex(index=[g for g in groups if g in table.index], columns=[c for c in columns if c in table])
        table.index.name, table.columns.name = "query group", "key group"
        return table

    def _evidence_rows(self, reducer: str, prefixes: tuple[str, ...]) -> pd.DataFrame:
        """Per-head rows of one evidence reducer; UsageError naming the fix when it did not run."""
        if reducer not in self.evidence:
            raise UsageError(f"{reducer} did not run: inspect(..., evidence='{reducer}') (or evidence='all')")
        frame = self.metrics(per_head=True)
        return frame[frame["metric"].astype(str).str.startswith(prefixes)].reset_index(drop=True)

    @property
    def value_mass(self) -> pd.DataFrame:
        """``value_mass`` rows (norm_mass, norm_share, norm_total per layer, head, query and key role)."""
        return self._evidence_rows("value_mass", ("norm_",))

    @property
    def sink_battery(self) -> pd.DataFrame:
        """``sink_battery`` rows (alpha of the first and top keys, sink heads and rates per eps)."""
        return self._evidence_rows("sink_battery", ("sink_",))

    @property
    def massive_activations(self) -> pd.DataFrame:
        """``massive_activations`` rows (top |h|, their token and dimension, the median, the count)."""
        return self._evidence_rows("massive_activations", ("massive_",))

    def evidence_table(self) -> pd.DataFrame:
        """Per layer (and ``layer`` <NA>: the mean over layers) of this input: mass input queries give the first token,
        the sink and the anchor by weight and by norm, sink rates, massive activations (as in compare's evidence.csv)."""
        if not self.evidence:
            raise UsageError("no evidence reducer ran: inspect(..., evidence='all')")
        anchors = [a for a in self.model.anchors() if a != "first_token"]
        table = example_evidence(self.metrics(per_head=True), anchors).drop(columns="example")
        table["layer"] = nullable_layers(table["layer"])
        return table

    def _evidence_lines(self) -> list[str]:
        """Weight vs norm of the first token and the anchor, and the sink rates, over all layers (summary lines)."""
        if not self.evidence:
            return []
        table = self.evidence_table()
        overall = table[table["layer"].isna()]
        pairs = overall[overall["measure"].isin([WEIGHT, NORM])].pivot_table(
            index="key", columns="measure", values="value", sort=False
        )
        lines = [
            f"  input → {key}: {row.get(WEIGHT, float('nan')):.3f} by weight, {row.get(NORM, float('nan')):.3f} by norm"
            for key, row in pairs.iterrows()
        ]
        rates = overall[overall["measure"].str.startswith("sink_rate")]
        lines += [f"  {r.measure}: {r.value:.3f} of heads" for r in rates.itertuples()]
        return ["  evidence (mean over layers and heads):", *lines]

    def top_anchors(self, k: int = TOP_ANCHORS, stack: str | None = None) -> list[tuple[int, str, float]]:
        """(position, token, mean attention received) of the ``k`` keys that receive the most attention.

        Mean over layers, heads and the queries that can see the key (q >= k in a causal stack).
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise UsageError(f"top_anchors(): k must be a whole number >= 0, got {k!r}")
        sm = self._stack(stack)
        qk = sm.probs.float().mean(dim=(0, 1)).numpy()  # [Q, K]
        seen = np.ones(qk.shape, bool)
        if qk.shape[0] == qk.shape[1] and not np.triu(qk, 1).any():
            seen = np.tril(seen)
        received = (qk * seen).sum(0) / np.maximum(seen.sum(0), 1)
        top = np.argsort(-received, kind="stable")[:k]
        return [(int(i), clean_token(sm.k_tokens[i], mathtext=False), float(received[i])) for i in top]

    def summary(self) -> str:
        """A few lines: checkpoint, template, tokens, layers x heads, the top anchors."""
        stack = self.maps.default_stack
        sm = self.maps[stack]
        anchors = ", ".join(f"#{p} {t!r} {v:.3f}" for p, t, v in self.top_anchors())
        return (
            f"Inspection of {self.checkpoint} (task {self.prompts.task.name}, {stack} stack)\n"
            f"  roles: {', '.join(self.prompts.roles.names)}\n"
            + (
                f"  field groups (parts of content): {', '.join(self.prompts.roles.group_names)}\n"
                if self.prompts.roles.fields
                else ""
            )
            + f"  {len(sm.q_tokens)} query x {len(sm.k_tokens)} key tokens, "
            f"{len(sm.layers)} layers x {len(sm.heads)} heads captured\n"
            f"  top anchors (mean attention received): {anchors}\n"
            f"  exactness: {self.certificate.summary() if self.certificate else 'not certified'}\n"
            + "".join(f"{line}\n" for line in self._evidence_lines())
            + f"  .plot(layer=, head=, scale=)  .metrics()  .maps['{stack}'].probs [L, H, Q, K]"
            + ("  .field_flow()" if self.prompts.roles.fields else "")
            + ("  .value_mass  .sink_battery  .evidence_table()" if self.evidence else "")
        )

    def __repr__(self) -> str:
        return self.summary()

    def static_png(self) -> bytes:
        """PNG of the layer- and head-mean map (cached): what a saved or untrusted notebook shows."""
        if self._png is None:
            self._png = figure_to_png_bytes(self.plot(), dpi=STATIC_DPI)
        return self._png

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """text/html (interactive canvas, with the static PNG inside for script-less renderers),
        image/png (static map) and text/plain (summary) in one bundle."""
        from anchorlens.notebook.widget import widget_html

        stack = self.maps.default_stack
        png = self.static_png()
        html = widget_html(
            self.maps[stack],
            title=f"{self.checkpoint} · {stack} attention · task {self.prompts.task.name}",
            fallback_png=png,
        )
        if self.evidence:
            lines = "\n".join(self._evidence_lines())
            html = f'{html}\n<pre class="anchorlens-evidence">{escape(lines)}</pre>'
        return {"text/html": html, "image/png": png, "text/plain": self.summary()}


def inspect(
    model_or_spec: Any,
    text_or_example: str | Mapping,
    *,
    tokenizer: Any = None,
    task: str | Path | Task | None = None,
    base: str | Base = "smollm2-135m",
    layers: tuple[int, ...] | None = None,
    heads: tuple[int, ...] | None = None,
    name: str | None = None,
    chat: bool | None = None,
    system: str | None = None,
    allow_inexact: bool = False,
    evidence: str | Sequence[str] | Mapping[str, Mapping] | None = None,
) -> Inspection:
    """Capture full maps of one input (a string, or a task example dict) through a model.

    ``model_or_spec``: a spec string (loaded on ``base``), a ``Base``/``GuidedModel``, a transformers model
    or a PEFT prompt-learning model (both with ``tokenizer=``). ``task``: a built-in name, a task file (.toml
    or harness .yaml) or a Task; a string without one is plain text (the ``text`` task's roles: newline,
    punct, content). ``chat``/``system``: render through the tokenizer's chat template. ``name`` overrides
    the checkpoint title. The capture of this input is certified against eager attention (``.certificate``);
    ``allow_inexact`` keeps maps that differ from eager beyond the threshold (InexactCaptureError otherwise).
    ``evidence``: opt-in evidence reducers (``"all"``, ``"value_mass,sink_battery:eps=0.1/0.3"``, as ``--evidence``):
    ``.value_mass``, ``.sink_battery``, ``.massive_activations`` and ``.evidence_table()`` give their rows, and the
    summary shows weight vs norm mass of the first token and the anchor.
    """
    _check_model_arg(model_or_spec)
    if not isinstance(text_or_example, (str, Mapping)):
        raise ArgumentTypeError(
            "inspect(): argument 'text_or_example' must be a string or a dict of the task's fields, "
            f"got {type(text_or_example).__name__}"
        )
    if isinstance(text_or_example, str):
        spec = get_task(TEXT_TASK if task is None else task)
        example = {(spec.fields[0] if len(spec.fields) == 1 else "text"): text_or_example}
    else:
        example, spec = dict(text_or_example), _task_for(text_or_example, task)
    _check_example(example, spec.template)
    extra = parse_evidence(evidence)
    model, checkpoint = as_model(model_or_spec, tokenizer=tokenizer, base=base)
    prompts = build_prompts(spec, model.base.tokenizer, PromptOptions(chat=chat, system=system, shots=0))
    selection = checked_selection(model, layers, heads)
    batch = next(encode_batches(model, [example], prompts, batch_size=1))
    with kept_attention(model):
        certificate = certify(model, batch, selection)
        require_exact(certificate, name or checkpoint, allow_inexact)
        maps = collect_maps(model, [batch], selection, max_examples=1)[0]
    return Inspection(
        model, example, prompts, maps, selection, checkpoint=name or checkpoint, certificate=certificate, evidence=extra
    )
