"""A loaded base model: HF model + tokenizer + architecture adapter, ready for capture."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from anchorlens.errors import UsageError
from anchorlens.models.adapters import ArchAdapter
from anchorlens.models.adapters.site import Site
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import StaticLayout
from anchorlens.roles.scheme import DEFAULT_SCHEME, RoleScheme
from anchorlens.roles.templates import Rendered
from anchorlens.roles.tokenize import encode

WEIGHT_SLICE = 4096


def fingerprint_hash(facts: dict[str, Any]) -> str:
    """Short hash of fingerprint facts (every key but ``hash``); over an old fingerprint's keys it gives its old hash."""
    body = {k: v for k, v in facts.items() if k != "hash"}
    return hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def skip_lm_head(model: torch.nn.Module) -> dict:
    """Forward kwargs that keep only the last position's logits, when the model supports it."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


@dataclass
class Base:
    """A frozen pretrained (or tiny random) model with its tokenizer and adapter."""

    spec: str
    model: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer
    adapter: ArchAdapter
    origin: dict[str, Any] | None = None  # provenance facts set by load_base (kind, repo_id, commit, path)
    _fingerprint: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def config(self):
        """The HF config."""
        return self.model.config

    @property
    def num_layers(self) -> int:
        """Blocks in the first stack (decoder for decoder-only, encoder otherwise)."""
        return self.adapter.num_layers(self.model)

    @property
    def hidden_size(self) -> int:
        """Model width d."""
        cfg = self.config
        return int(getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None) or cfg.n_embd)

    @property
    def num_heads(self) -> int:
        """Query heads per attention module."""
        cfg = self.config
        return int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "num_heads", None) or cfg.n_head)

    @property
    def context_length(self) -> int | None:
        """Longest input the base's positions allow (None for relative positions, as in T5)."""
        if self.is_encoder_decoder:
            return None
        cfg = self.config
        value = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        return int(value) if value else None

    @property
    def is_encoder_decoder(self) -> bool:
        """True for T5-style models."""
        return bool(getattr(self.config, "is_encoder_decoder", False))

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    def num_parameters(self) -> int:
        """All parameters of the base model."""
        return sum(p.numel() for p in self.model.parameters())

    def weights_digest(self) -> str:
        """sha256 (16 hex) of fixed weight slices: the input embedding and the first and last block's first parameter.

        The first ``WEIGHT_SLICE`` values of each, rounded to bfloat16 and hashed as float32 bytes, so
        the same weights loaded in float32 or bfloat16 give the same digest (float16 may not).
        """
        blocks = self.adapter.blocks(self.model, self.adapter.stacks()[0])
        embedding = self.adapter.embeddings(self.model).weight
        tensors: list[torch.Tensor] = [cast(torch.Tensor, embedding)]
        tensors += [next(block.parameters()) for block in (blocks[0], blocks[-1])]
        h = hashlib.sha256()
        for tensor in tensors:
            flat = tensor.detach().flatten()[:WEIGHT_SLICE]
            if flat.device.type == "meta":  # offloaded by accelerate: only its shape is known here
                h.update(str(tuple(tensor.shape)).encode())
                continue
            h.update(flat.to("cpu", torch.float32).to(torch.bfloat16).to(torch.float32).numpy().tobytes())
        return h.hexdigest()[:16]

    def fingerprint(self) -> dict[str, Any]:
        """Shape facts a guidance checkpoint depends on, a weights digest, and their short hash (cached)."""
        if self._fingerprint is None:
            facts = {
                "model_type": self.config.model_type,
                "num_layers": self.num_layers,
                "hidden_size": self.hidden_size,
                "num_heads": self.num_heads,
                "vocab_size": int(self.config.vocab_size),
                "weights": self.weights_digest(),
            }
            self._fingerprint = {**facts, "hash": fingerprint_hash(facts)}
        return dict(self._fingerprint)

    def pinned_spec(self) -> str:
        """A spec that reloads exactly these weights: ``ORG/NAME@COMMIT`` for a hub base, else the spec."""
        facts = self.provenance()
        if facts["kind"] == "hub" and facts["repo_id"] and facts["commit"]:
            return f"{facts['repo_id']}@{facts['commit']}"
        return self.spec

    def provenance(self) -> dict[str, Any]:
        """Where the base came from: kind (embedded|tiny|local|hub), spec, repo_id, revision, commit, path."""
        facts: dict[str, Any] = {
            "kind": "local",
            "spec": self.spec,
            "repo_id": None,
            "revision": None,
            "commit": None,
            "path": None,
        }
        facts.update(self.origin or {})
        return facts

    def sites(self) -> list[tuple[Site, torch.nn.Module]]:
        """Every attention (site, module) pair."""
        return self.adapter.attention_sites(self.model)

    def encode(
        self,
        rendered: Sequence[Rendered],
        example_ids: Sequence[int] | None = None,
        max_length: int | None = None,
        scheme: RoleScheme = DEFAULT_SCHEME,
    ) -> Encoded:
        """Tokenize rendered examples with roles (``scheme``: the run's role table and token rules); encoder-decoder
        bases get a one-token decoder side."""
        ids = None if example_ids is None else torch.as_tensor(list(example_ids), dtype=torch.long)
        batch = encode(rendered, self.tokenizer, example_ids=ids, max_length=max_length, scheme=scheme)
        if self.is_encoder_decoder:
            start = getattr(self.config, "decoder_start_token_id", None)
            if start is None:
                raise UsageError(
                    f"{self.spec}: config.json has no decoder_start_token_id; set it to the token the decoder "
                    "starts from (T5 uses its pad_token_id)"
                )
            b = batch.batch_size
            batch.target_ids = torch.full((b, 1), int(start), dtype=torch.long)
            batch.target_mask = torch.ones((b, 1), dtype=torch.long)
            batch.target_roles = torch.full((b, 1), int(Role.SPECIAL), dtype=torch.long)
        return batch

    def layout(self, batch: Encoded) -> StaticLayout:
        """Roles of every site's queries and keys for a plain (unguided) forward."""
        return StaticLayout(batch.sequences(), dict(self.adapter.stack_sequences))

    def forward(self, batch: Encoded, **kwargs):
        """Run the model on an encoded batch (already on the right device)."""
        return self.adapter.forward(self.model, batch, **kwargs)
