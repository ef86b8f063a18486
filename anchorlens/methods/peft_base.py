"""Whether a PEFT adapter was made for the running base: its recorded ``base_model_name_or_path`` checked as far
as it can be (a model directory here or a hub id in the HF cache: model type, depth, width, heads, vocabulary;
otherwise full names), and a prompt adapter's recorded depth and heads, named base or not.

A checkpoint from another architecture of the same width must not slip through on a matching folder name
(``q/final`` vs ``l/final``); ``allow_other_base`` loads it anyway, recorded as ``other_base``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from anchorlens.errors import CheckpointError, UsageError

CONFIG_FILE = "adapter_config.json"


def _fail(file: Path, message: str) -> CheckpointError:
    return CheckpointError(f"{file}: {message}")


def _model_name(text: str) -> str:
    """``org/Name``, ``org/Name@rev``, ``/path/to/name`` -> ``name`` (case-folded)."""
    from anchorlens.models.hub import parse_hub_id

    try:
        hub = parse_hub_id(text)
    except UsageError:
        hub = None
    return (hub.repo_id if hub else text).rstrip("/").rsplit("/", 1)[-1].lower()


# what tells one base from another, under the keys PEFT reads them in (a VLM's text part in text_config)
_FACT_KEYS: dict[str, tuple[str, ...]] = {
    "model_type": ("model_type",),
    "num_layers": ("num_hidden_layers", "num_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "vocab_size": ("vocab_size",),
}
_ALIASES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")


def _config_facts(config: dict[str, Any]) -> dict[str, Any]:
    """model_type, layers, width, heads, key/value heads and vocabulary of an HF config dict (None: not recorded)."""
    text = config.get("text_config")
    sources = [config, text] if isinstance(text, dict) else [config]
    facts: dict[str, Any] = {}
    for fact, keys in _FACT_KEYS.items():
        wanted = str if fact == "model_type" else int
        found = (src.get(key) for src in sources for key in keys)
        facts[fact] = next((v for v in found if isinstance(v, wanted) and not isinstance(v, bool) and v != ""), None)
    facts["num_kv_heads"] = facts["num_kv_heads"] or facts["num_heads"]
    return facts


def _base_facts(base) -> dict[str, Any]:
    """:func:`_config_facts` of the running base (attribute aliases such as gpt2's ``n_layer`` resolved)."""
    config = base.config
    values = dict(config.to_dict())
    for key in _ALIASES:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            values[key] = value
    return _config_facts(values)


def _cached_hub_config(name: str) -> Path | None:
    """config.json of the hub id ``name`` when the HF cache holds it (never downloaded), else None."""
    from anchorlens.models.hub import parse_hub_id

    try:
        hub = parse_hub_id(name)
        if hub is None:
            return None
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(hub.repo_id, "config.json", revision=hub.revision)
    except Exception:  # noqa: BLE001 - a cache that cannot be read proves nothing; the name checks follow
        return None
    return Path(found) if isinstance(found, str) else None


def _recorded_config(name: str) -> dict[str, Any] | None:
    """The config of the recorded base when it is a model directory here or a hub id in the HF cache, else None."""
    try:
        file = Path(name).expanduser() / "config.json"
        if not file.is_file():
            cached = _cached_hub_config(name)
            if cached is None:
                return None
            file = cached
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RuntimeError):  # unreadable, not JSON, an unknown ~user: nothing to compare with
        return None
    return config if isinstance(config, dict) else None


def _ids(text: str) -> set[str]:
    """Normalised full ids of a spec: itself, its resolved directory when it is one here, its hub repo id."""
    from anchorlens.models.hub import parse_hub_id

    text = text.strip().rstrip("/")
    ids = {text.lower()}
    try:
        path = Path(text).expanduser()
        if path.exists():
            ids.add(str(path.resolve()).lower())
    except (OSError, RuntimeError):
        pass
    try:
        hub = parse_hub_id(text)
    except UsageError:
        hub = None
    if hub is not None:
        ids.add(hub.repo_id.lower())
    return ids


def _base_ids(base) -> tuple[set[str], set[str], set[str]]:
    """(full ids, every name's last part, last parts of the names a base is known by beyond a local directory)."""
    from anchorlens.models.embedded import EMBEDDED_REPO

    origin = base.provenance()
    texts = [base.spec, getattr(base.config, "_name_or_path", "") or "", origin.get("repo_id") or ""]
    texts.append(origin.get("path") or "")
    named = [origin.get("repo_id") or ""]
    if origin.get("kind") in ("tiny", "hub", "embedded"):
        named.append(base.spec)
    if origin.get("kind") == "embedded":
        texts.append(EMBEDDED_REPO)  # an adapter trained on the hub model runs on its embedded copy
        named.append(EMBEDDED_REPO)
    full = set().union(*(_ids(t) for t in texts if t))
    return full, {_model_name(t) for t in texts if t}, {_model_name(t) for t in named if t}


def _is_name(text: str) -> bool:
    """True for ``ORG/NAME[@REV]`` or a bare name, False for a filesystem path."""
    from anchorlens.models.hub import parse_hub_id

    if "/" not in text and "\\" not in text:
        return not text.startswith(("~", "."))
    try:
        return parse_hub_id(text) is not None
    except UsageError:
        return True


def _geometry(cfg: dict[str, Any], kind: str, have: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Depth and heads a prompt adapter's config records (PEFT writes the base's) that differ from the base's."""
    if kind not in ("PROMPT_TUNING", "P_TUNING"):
        return {}  # prefixes: depth is checked with the tensors; LoRA family: PEFT matches modules and shapes
    found: dict[str, tuple[Any, Any]] = {}
    for key, fact in (("num_layers", "num_layers"), ("num_attention_heads", "num_heads")):
        value, own = cfg.get(key), have.get(fact)
        if isinstance(value, int) and own is not None and value != own:
            found[fact] = (value, own)
    return found


def _other_base(path: Path, name: str, base, said: str, differs: dict[str, tuple[Any, Any]]) -> list[dict[str, Any]]:
    """Warn that the adapter loads on another base (allowed); the ``other_base`` facts."""
    made = f"was made for {name!r}" if name else "records no base model"
    warnings.warn(f"PEFT adapter {path} {made}, loaded on {base.spec!r}{said}", stacklevel=4)
    return [
        {
            "source": str(path),
            "recorded": {"spec": name or None, **{k: w for k, (w, _) in differs.items()}},
            "base": {"spec": base.spec, **{k: h for k, (_, h) in differs.items()}},
        }
    ]


def check_peft_base(cfg: dict[str, Any], base, path: Path, allow_other_base: bool = False) -> list[dict[str, Any]]:
    """Refuse an adapter for another width always, for another base unless allowed; returns ``other_base`` facts.

    The recorded ``base_model_name_or_path`` proves the base only as far as it can be checked: a model
    directory here (or a hub id in the HF cache) must have the base's model_type, layers, width, heads,
    key/value heads and vocabulary; a name that cannot be found must be the base's own id (or, for a
    base known by a hub or tiny name, end in that name). Prompt adapters must also record the base's
    depth and heads, with or without a recorded name.
    """
    file = path / CONFIG_FILE
    kind = str(cfg.get("peft_type")).upper()
    recorded = cfg.get("base_model_name_or_path")
    name = recorded.strip() if isinstance(recorded, str) else ""
    none = "" if name else " (the adapter records no base model: base_model_name_or_path is null)"
    token_dim = cfg.get("token_dim")
    widths = {base.hidden_size}
    if kind == "PREFIX_TUNING" and base.adapter.supports_prefix:
        _, kv_heads, head_dim = base.adapter.kv_geometry(base.model)
        widths.add(kv_heads * head_dim)  # grouped-query models: PEFT's prefix token_dim is the key/value width
    if token_dim is not None and token_dim not in widths:
        raise _fail(
            file,
            f"field token_dim is {token_dim} but the base {base.spec!r} has d={base.hidden_size}{none}; "
            "load it on its own base",
        )
    have = _base_facts(base)
    differs = _geometry(cfg, kind, have)
    fix = "load it on that base, or pass allow_other_base=True (--allow-other-base)"
    if not name:
        if not differs:
            return []  # nothing recorded to check beyond the shapes
        said = ", ".join(f"{k} {w!r} vs {h!r}" for k, (w, h) in differs.items())
        if not allow_other_base:
            raise _fail(
                file,
                f"the adapter records no base model (base_model_name_or_path is null) and does not fit the base "
                f"{base.spec!r} ({said}); load it on the base it was made for, or pass allow_other_base=True "
                "(--allow-other-base)",
            )
        return _other_base(path, name, base, f" ({said})", differs)
    full, last_parts, known_names = _base_ids(base)
    problem = f"field base_model_name_or_path names {name!r} but the base is {base.spec!r}"
    if not _ids(name) & full:
        config = _recorded_config(name)
        if config is not None:
            differs = {
                **{
                    k: (w, have[k])
                    for k, w in _config_facts(config).items()
                    if w is not None and have.get(k) is not None and w != have[k]
                },
                **differs,
            }
            if not differs and _model_name(name) not in last_parts:
                differs = {"name": (name, base.spec)}  # another model of the same shapes
        elif _model_name(name) in last_parts and not (_is_name(name) and _model_name(name) in known_names):
            problem = (
                f"field base_model_name_or_path names {name!r}, which is neither a directory here nor in the HF "
                f"cache, so the base {base.spec!r} cannot be checked against it (only the last part of the names "
                "agrees)"
            )
            differs = {"name": (name, base.spec)}
        elif _model_name(name) not in known_names:
            differs = {"name": (name, base.spec)}
    if not differs:
        return []
    said = ", ".join(f"{k} {w!r} vs {h!r}" for k, (w, h) in differs.items() if k != "name")
    said = f" ({said})" if said else ""
    if not allow_other_base:
        raise _fail(file, f"{problem}{said}; {fix}")
    return _other_base(path, name, base, said, {k: v for k, v in differs.items() if k != "name"})
