"""GuidedModel: a frozen base plus guidance modules, usable for capture and for training."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.config import MethodConfig
from anchorlens.methods.knockout import Knockout, KnockoutForward, install_attention, knockouts_active
from anchorlens.methods.knockout_mean import MeanCollector, mean_hooks
from anchorlens.methods.plan import GuidedLayout, Plan, build_plan
from anchorlens.methods.runtime import LayerSplicer
from anchorlens.models.adapters.site import Site
from anchorlens.models.base import Base, skip_lm_head
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import Role
from anchorlens.roles.scheme import DEFAULT_SCHEME, RoleScheme
from anchorlens.roles.table import RoleTable

FIRST_TOKEN_ANCHOR = "first_token"


class GuidedModel:
    """A base with guidances (none: the base itself); the capture target and the one model type of evaluation.

    Implements the capture-target protocol (``device``, ``sites``, ``layout``, ``forward``).

    Only the guidances' parameters train; the base stays frozen. ``forward`` returns the HF
    output with ``.logits`` re-aligned to the batch's input positions (decoder-only: [B, T, V],
    kept inserted positions removed; T5: decoder logits unchanged). Other outputs (hidden states)
    keep the inserted input-level positions.
    """

    def __init__(self, base: Base, guidances: Iterable[Guidance | MethodConfig] = (), seed: int = 0) -> None:
        built: list[Guidance] = [g.build() if isinstance(g, MethodConfig) else g for g in guidances]
        inserting = [g for g in built if isinstance(g, Guidance) and g.level != "knockout"]
        if inserting and not base.adapter.supports_guidance:
            why = base.adapter.guidance_refusal or f"{base.adapter.family} supports capture only"
            raise UsageError(
                f"guidance ({', '.join(g.kind for g in inserting)}) cannot be inserted into {base.spec}: {why}; "
                "capture the base alone, or use a decoder-only or T5 base"
            )
        self.base: Base = base
        generator = torch.Generator().manual_seed(seed)
        for g in built:
            if not isinstance(g, Guidance):
                raise TypeError(f"expected a Guidance, got {type(g).__name__}")
            if not g.bound:
                g.bind(base, generator)
        self.guidances = nn.ModuleList(built).to(base.device)
        self.seed = seed
        self.meta: dict[str, Any] = {}
        self._sites: dict[int, Site] | None = None
        self._knockouts_paused = False
        self._first_pass_for = ""  # the model (``name``) the mean knockouts' first pass ran on
        inserted = tuple(r.label for r in self.anchor_roles())
        for ko in self.knockout_list():
            ko.check_roles(None, inserted)  # the run's own roles are checked once known

    # ------------------------------------------------------------------ delegation to the base
    @property
    def device(self) -> torch.device:
        """Device of the base model."""
        return self.base.device

    @property
    def model(self) -> nn.Module:
        """The frozen HF model."""
        return self.base.model

    @property
    def tokenizer(self):
        """The base's tokenizer."""
        return self.base.tokenizer

    @property
    def adapter(self):
        """The base's architecture adapter."""
        return self.base.adapter

    @property
    def num_layers(self) -> int:
        """Layers of the base's first stack."""
        return self.base.num_layers

    @property
    def hidden_size(self) -> int:
        """Width d of the base."""
        return self.base.hidden_size

    @property
    def context_length(self) -> int | None:
        """Longest input the base's positions allow (None for relative positions, as in T5)."""
        return self.base.context_length

    @property
    def is_encoder_decoder(self) -> bool:
        """True for T5-style bases."""
        return self.base.is_encoder_decoder

    @property
    def name(self) -> str:
        """Short description: base spec plus methods (``tiny-llama+capsule:fusion=add``)."""
        return "+".join([self.base.spec] + [g.describe() for g in self.guidances if isinstance(g, Guidance)])

    def encode(
        self,
        rendered: Sequence,
        example_ids: Sequence[int] | None = None,
        max_length: int | None = None,
        scheme: RoleScheme = DEFAULT_SCHEME,
    ) -> Encoded:
        """Tokenize with the base (see ``Base.encode``)."""
        return self.base.encode(rendered, example_ids, max_length=max_length, scheme=scheme)

    def sites(self) -> list[tuple[Site, nn.Module]]:
        """Every attention (site, module) pair of the base."""
        return self.base.sites()

    # ------------------------------------------------------------------ capture target
    def plan(self, batch: Encoded) -> Plan:
        """Where every guidance position goes for ``batch``."""
        return build_plan(self.base, self.guidance_list(), batch)

    def layout(self, batch: Encoded):
        """Layout provider with the inserted positions' roles at every (stack, layer)."""
        return self._plan_and_layout(batch)[1]

    def _plan_and_layout(self, batch: Encoded) -> tuple[Plan | None, Any]:
        """The batch's insertion plan (None without inserting guidance) and the layout built from it (one plan)."""
        plan = self.plan(batch) if self.guidance_list() else None
        return plan, self.base.layout(batch) if plan is None else GuidedLayout(self.base.adapter, plan)

    def forward(self, batch: Encoded, **kwargs):
        """Run the guided model on ``batch`` (moved to the device); grads flow to guidance parameters only.

        Knockouts act in every forward: the attention function removes their weights at the sites they select
        (``mode=mean`` knockouts need their first pass, :meth:`prepare`, before: UsageError otherwise).
        """
        knockouts = tuple(self.knockout_list())
        if not knockouts or self._knockouts_paused:
            return self._forward(batch, **kwargs)
        self._drop_stale_means()
        for ko in knockouts:
            ko.check_prepared()
        batch = batch.to(self.device)
        install_attention(self.base.model)
        plan, layout = self._plan_and_layout(batch)
        forward = KnockoutForward(knockouts, self._site_map(), layout)
        with knockouts_active(forward), mean_hooks(forward, self.base.sites()):
            return self._forward(batch, plan, **kwargs)

    def next_token_logits(self, batch: Encoded, positions: torch.Tensor) -> torch.Tensor:
        """[B, V] logits at ``positions`` ([B] long, each row's position in ``batch``: the distribution of the token
        after it), the LM head run only at those positions when the base takes ``logits_to_keep`` (the full [B, T, V]
        logits cost a fifth of a small model's forward); decoder-only bases, knockouts and guidances as in
        :meth:`forward`."""
        batch = batch.to(self.device)
        positions = positions.to(self.device)
        rows = torch.arange(batch.batch_size, device=self.device)
        if self.is_encoder_decoder or not skip_lm_head(self.base.model):
            return self.forward(batch).logits[rows, positions]
        at = positions
        plan = self.plan(batch) if self.guidance_list() else None
        if plan is not None and plan.inputs is not None:  # inserted positions: where each row's position moved to
            at = (plan.inputs.splice.src == positions[:, None]).int().argmax(1)
        keep = torch.unique(at)  # sorted: the positions every row computes logits at
        logits = self.forward(batch, logits_to_keep=keep).logits  # [B, len(keep), V]
        return logits[rows, torch.searchsorted(keep, at)]

    def needs_first_pass(self) -> bool:
        """Whether a knockout needs a first pass over the run's inputs (``mode=mean`` without its means)."""
        self._drop_stale_means()
        return any(ko.needs_first_pass for ko in self.knockout_list())

    def _drop_stale_means(self) -> None:
        """Forget the mean knockouts' means when the model changed since their first pass (a guidance moved)."""
        if self._first_pass_for and self._first_pass_for != self.name:
            for ko in self.knockout_list():
                ko.means = None
            self._first_pass_for = ""

    @torch.no_grad()
    def prepare(self, batches: Iterable[Encoded]) -> list[dict[str, Any]]:
        """The first pass of the ``mode=mean`` knockouts: one forward per batch with every knockout off, averaging
        the attention input at each knockout's keys per layer (over all selected keys of all examples).

        Returns one record per mean knockout (spec, examples, keys, norm of the mean per layer), also kept in
        ``meta["first_pass"]`` for the run's manifest; [] when no knockout needs a pass.
        """
        collector = MeanCollector(self.knockout_list(), self.base.sites())
        if not collector.knockouts:
            return []
        install_attention(self.base.model)  # the same attention function as the knocked-out forwards
        last_only = skip_lm_head(self.base.model)
        for batch in batches:  # _forward: no knockout acts
            batch = batch.to(self.device)
            plan, layout = self._plan_and_layout(batch)
            with collector.hooked(layout, batch.batch_size):
                self._forward(batch, plan, **last_only)
        report = collector.finish()
        self.meta["first_pass"] = report
        self._first_pass_for = self.name
        return report

    @contextmanager
    def knockouts_paused(self) -> Iterator[None]:
        """Forwards inside the block run without the knockouts (the certificate checks the capture against eager
        attention, which has none; each knockout mode is checked against its own eager reference in the tests)."""
        before, self._knockouts_paused = self._knockouts_paused, True
        try:
            yield
        finally:
            self._knockouts_paused = before

    def _site_map(self) -> dict[int, Site]:
        """id(attention module) -> its site (cached)."""
        if self._sites is None:
            self._sites = {id(module): site for site, module in self.base.sites()}
        return self._sites

    def _forward(self, batch: Encoded, plan: Plan | None = None, **kwargs):
        """The forward of the base with the inserting guidances (``plan``: the batch's, when already built)."""
        if not self.guidance_list():
            return self.base.forward(batch.to(self.device), **kwargs)
        batch = batch.to(self.device)
        plan = plan if plan is not None else self.plan(batch)
        adapter, model = self.base.adapter, self.base.model
        embeds = adapter.token_embeddings(model, batch.input_ids)
        hidden, mask = embeds, batch.attention_mask
        if plan.inputs is not None:
            valid = batch.attention_mask.bool()
            vectors = [g.input_vectors(embeds, valid).to(embeds.dtype) for g, _, _ in plan.inputs.owners]
            hidden = plan.inputs.splice.apply(embeds, torch.cat(vectors, dim=1))
            mask = plan.sequences["input"].valid.to(batch.attention_mask.dtype)
        cache = self._prefix_cache(plan, batch.batch_size, embeds.dtype)
        if cache is not None:
            n = sum(plan.prefix.values())
            mask = torch.cat([torch.ones(mask.shape[0], n, dtype=mask.dtype, device=mask.device), mask], dim=1)
        for g in self.guidance_list():
            g.begin()
        try:
            with LayerSplicer(self.base, plan).installed():
                out = adapter.forward_embeds(model, batch, hidden, mask, cache=cache, **kwargs)
        finally:
            for g in self.guidance_list():
                g.begin()  # drop per-forward state (and the graph it references)
        partial = "logits_to_keep" in kwargs  # only the last positions' logits: nothing to realign
        if (
            plan.inputs is not None
            and not self.is_encoder_decoder
            and not partial
            and getattr(out, "logits", None) is not None
        ):
            out.logits = plan.inputs.splice.remove(out.logits)
        return out

    __call__ = forward

    def _prefix_cache(self, plan: Plan, batch_size: int, dtype: torch.dtype):
        """A DynamicCache prefilled with the prefix keys/values (PEFT's mechanism), or None."""
        prefixes = [g for g in self.guidance_list() if g.level == "prefix"]
        if not prefixes:
            return None
        from transformers import DynamicCache

        g = prefixes[0]
        layers = g.layers[g.stacks[0]]
        return DynamicCache([g.prefix_kv(layer, batch_size, dtype) for layer in range(layers)])

    # ------------------------------------------------------------------ anchors (one rule for every caller)
    def guidance_list(self) -> list[Guidance]:
        """The guidances that insert positions, typed, in insertion order (knockouts left out)."""
        return [g for g in self.guidances if isinstance(g, Guidance) and g.level != "knockout"]

    def knockout_list(self) -> list[Knockout]:
        """The knockouts, in spec order."""
        return [g for g in self.guidances if isinstance(g, Knockout)]

    def check_roles(self, table: RoleTable) -> None:
        """UsageError (one line) when a knockout names a role the run's ``table`` lacks or no guidance inserts."""
        inserted = tuple(r.label for r in self.anchor_roles())
        for ko in self.knockout_list():
            ko.check_roles(table, inserted)

    def anchor_roles(self) -> tuple[Role, ...]:
        """Roles of the inserted guidances, in insertion order, each once."""
        return tuple(dict.fromkeys(Role(int(g.role)) for g in self.guidance_list()))

    def anchors(self) -> tuple[str, ...]:
        """Anchors worth reporting: ``first_token`` plus each inserted guidance role's label, in order, once."""
        return (FIRST_TOKEN_ANCHOR, *(r.label for r in self.anchor_roles()))

    def entropy_anchor(self) -> str | None:
        """The role whose queries' entropy is reported: the first guidance role (None without guidance)."""
        roles = self.anchor_roles()
        return roles[0].label if roles else None

    # ------------------------------------------------------------------ parameters
    def trainable_parameters(self) -> list[nn.Parameter]:
        """The guidance parameters (the base has none trainable)."""
        return [p for p in self.guidances.parameters() if p.requires_grad]

    def num_trainable(self) -> int:
        """Number of trainable scalars."""
        return sum(p.numel() for p in self.trainable_parameters())

    def share_of_base(self) -> float:
        """Trainable parameters as a fraction of the base's parameters."""
        return self.num_trainable() / max(1, self.base.num_parameters())

    def parameter_report(self) -> list[dict[str, Any]]:
        """Per guidance: kind, description, trainable parameters and share of base."""
        total = max(1, self.base.num_parameters())
        return [
            {
                "kind": g.kind,
                "method": g.describe(),
                "trainable": g.num_trainable(),
                "share_of_base": g.num_trainable() / total,
            }
            for g in self.guidance_list()
        ]

    def guidance_state_dict(self) -> dict[str, torch.Tensor]:
        """Guidance tensors keyed ``"{index}.{name}"`` (detached, on CPU, contiguous)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.guidances.state_dict().items()}

    def load_guidance_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load tensors saved by ``guidance_state_dict`` (strict: same keys and shapes)."""
        own = self.guidances.state_dict()
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or extra:
            raise UsageError(f"guidance tensors do not match the methods: missing {missing}, unexpected {extra}")
        for key, value in state.items():
            if tuple(value.shape) != tuple(own[key].shape):
                raise UsageError(
                    f"guidance tensor {key} is {tuple(value.shape)}, the methods need {tuple(own[key].shape)}"
                )
        self.guidances.load_state_dict({k: v.to(own[k].device) for k, v in state.items()})

    def config(self) -> dict[str, Any]:
        """JSON-able description: base (pinned spec, fingerprint, provenance), methods with options, parameter counts."""
        return {
            "base": {
                "spec": self.base.pinned_spec(),
                "fingerprint": self.base.fingerprint(),
                "provenance": self.base.provenance(),
            },
            "methods": [{"kind": g.kind, "options": g.options()} for g in self.guidances if isinstance(g, Guidance)],
            "seed": self.seed,
            "num_trainable": self.num_trainable(),
            "share_of_base": self.share_of_base(),
        }

    def train(self, mode: bool = True) -> GuidedModel:
        """Put the guidances in training mode; the base stays in eval mode (frozen, no dropout)."""
        self.guidances.train(mode)
        return self

    def eval(self) -> GuidedModel:
        """Evaluation mode."""
        return self.train(False)

    def __repr__(self) -> str:
        """``GuidedModel(tiny-llama+capsule:..., trainable=256)``."""
        return f"GuidedModel({self.name}, trainable={self.num_trainable()})"
