"""Guidance checkpoints: a directory with ``anchorlens.json`` and ``guidance.safetensors`` (no pickle).

``anchorlens.json`` is validated at the door (``read_meta``): every field's JSON type, the version
a positive integer <= ``FORMAT_VERSION``, methods typed by their registered configs (unknown
kinds, options and keys refused with the known ones). Tensors must be finite floating tensors whose
sizes match the configs before anything is allocated from a config number. Every error is a
one-line ``CheckpointError`` naming the file and the field.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from anchorlens.atomic import atomic_dir
from anchorlens.errors import CheckpointError, UsageError
from anchorlens.methods.config import MethodConfig
from anchorlens.models.base import fingerprint_hash
from anchorlens.tensorfile import check_float_tensors, load_tensors, save_tensors

FORMAT_VERSION = 1
META_FILE = "anchorlens.json"
TENSOR_FILE = "guidance.safetensors"

# field -> (JSON types allowed, required); bool is never an int here
_NUMBER = (int, float)
META_SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    "format_version": ((int,), True),
    "methods": ((list,), True),
    "base": ((dict,), True),
    "seed": ((int,), False),
    "num_trainable": ((int,), False),
    "share_of_base": (_NUMBER, False),
    "task": ((str, type(None)), False),
    "template": ((str, type(None)), False),
    "training": ((dict,), False),
}
BASE_SCHEMA: dict[str, tuple[type, ...]] = {"spec": (str, type(None)), "fingerprint": (dict,), "provenance": (dict,)}
FINGERPRINT_TYPES: dict[str, tuple[type, ...]] = {
    "model_type": (str,),
    "num_layers": (int,),
    "hidden_size": (int,),
    "num_heads": (int,),
    "vocab_size": (int,),
    "hash": (str,),
    "weights": (str,),
}


def _type_names(types: tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def _check_type(file: Path, field: str, value: Any, types: tuple[type, ...]) -> None:
    """CheckpointError naming ``file`` and ``field`` when ``value`` is not of ``types`` (bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, types):
        raise CheckpointError(f"{file}: field {field} must be {_type_names(types)}; got {json.dumps(value)[:60]}")


def is_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a directory holding ``anchorlens.json``."""
    return (Path(path).expanduser() / META_FILE).is_file()


def validate_meta(meta: Any, file: Path) -> dict[str, Any]:
    """``meta`` checked against the schema (types, version, known keys, method configs); returns it."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{file}: must hold a JSON object; got {type(meta).__name__}")
    unknown = sorted(set(meta) - set(META_SCHEMA))
    if unknown:
        raise CheckpointError(
            f"{file}: unknown field {unknown[0]!r} (this anchorlens knows {', '.join(META_SCHEMA)}); upgrade anchorlens"
        )
    for field, (types, required) in META_SCHEMA.items():
        if field not in meta:
            if required:
                raise CheckpointError(f"{file}: field {field} is missing; re-save the checkpoint")
            continue
        _check_type(file, field, meta[field], types)
    version = meta["format_version"]
    if version < 1:
        raise CheckpointError(f"{file}: field format_version must be a positive integer; got {version}")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{file}: format_version {version} is newer than this anchorlens reads ({FORMAT_VERSION}); upgrade it"
        )
    base = meta["base"]
    for key in base:
        if key not in BASE_SCHEMA:
            raise CheckpointError(f"{file}: unknown field base.{key} (this anchorlens knows {', '.join(BASE_SCHEMA)})")
        _check_type(file, f"base.{key}", base[key], BASE_SCHEMA[key])
    for key, value in base.get("fingerprint", {}).items():
        if key in FINGERPRINT_TYPES:
            _check_type(file, f"base.fingerprint.{key}", value, FINGERPRINT_TYPES[key])
    method_configs(meta, file)
    return meta


def method_configs(meta: dict[str, Any], file: Path) -> list[MethodConfig]:
    """The typed configs of ``meta["methods"]``; CheckpointError names ``methods[i]``."""
    from anchorlens.methods.registry import method_config

    configs = []
    for i, entry in enumerate(meta["methods"]):
        try:
            configs.append(method_config(entry, f"methods[{i}]"))
        except UsageError as err:
            raise CheckpointError(f"{file}: {err}") from None
    return configs


def read_meta(path: str | Path) -> dict[str, Any]:
    """The checkpoint's validated ``anchorlens.json``; CheckpointError when absent, unreadable or malformed."""
    file = Path(path).expanduser() / META_FILE
    if not file.is_file():
        raise CheckpointError(f"{path} is not an anchorlens checkpoint (no {META_FILE})")
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file} is not valid JSON: {str(err).splitlines()[0]}") from None
    except OSError as err:
        raise CheckpointError(f"{file} cannot be read: {err.strerror or err}") from None
    return validate_meta(meta, file)


def save_checkpoint(
    guided,
    path: str | Path,
    task: str | None = None,
    template: str | None = None,
    training: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``guided``'s methods, base facts and tensors to directory ``path`` atomically; returns the path.

    ``overwrite`` replaces an existing anchorlens checkpoint, never a directory anchorlens did not write.
    """
    out = Path(path).expanduser()
    if out.exists():
        if not overwrite:
            raise UsageError(f"{out} already exists; choose a new directory or pass overwrite=True")
        if not out.is_dir() or (not is_checkpoint(out) and any(out.iterdir())):
            raise UsageError(f"{out} exists and is not an anchorlens checkpoint; refusing to overwrite it")
    config = guided.config()
    meta = {
        "format_version": FORMAT_VERSION,
        "methods": config["methods"],
        "base": config["base"],
        "seed": config["seed"],
        "num_trainable": config["num_trainable"],
        "share_of_base": config["share_of_base"],
        "task": task,
        "template": template,
        "training": training or {},
    }
    text = json.dumps(meta, indent=2, sort_keys=False) + "\n"  # fails before writing if a value is not JSON-able
    tensors = guided.guidance_state_dict()
    with atomic_dir(out, replace=overwrite) as tmp:
        save_tensors(
            tensors, tmp / TENSOR_FILE, metadata={"format": "anchorlens", "format_version": str(FORMAT_VERSION)}
        )
        (tmp / META_FILE).write_text(text)
    return out


def check_base(meta: dict[str, Any], base, path: str | Path, allow_other_base: bool = False) -> list[dict[str, Any]]:
    """Refuse a base of other layers/width always, of another model_type or fingerprint hash unless allowed.

    Returns the ``other_base`` facts (empty when the base is the recorded one); with
    ``allow_other_base`` a differing model_type/hash is a warning instead of a CheckpointError.
    """
    file = Path(path).expanduser() / META_FILE
    saved = meta.get("base", {})
    want = saved.get("fingerprint", {})
    have = base.fingerprint()
    if "hash" in want and "weights" not in want:  # an older checkpoint: its hash covers the shape facts only
        have = {**have, "hash": fingerprint_hash({k: have[k] for k in want if k != "hash" and k in have})}
    for key in ("num_layers", "hidden_size"):
        if key in want and want[key] != have[key]:
            raise CheckpointError(
                f"checkpoint {path} was trained on {saved.get('spec')!r} ({want.get('num_layers')} layers, "
                f"d={want.get('hidden_size')}) but the base is {base.spec!r} ({have['num_layers']} layers, "
                f"d={have['hidden_size']}); load it with its own base"
            )
    differs = [k for k in ("model_type", "hash") if k in want and want[k] != have.get(k)]
    if not differs:
        return []
    said = ", ".join(f"{k} {want[k]!r} vs {have.get(k)!r}" for k in differs)
    if want.get("adapter") != have.get("adapter"):  # a PEFT layer adapter (LoRA) on one side: say which
        said += f", PEFT adapter {want.get('adapter') or 'none'} vs {have.get('adapter') or 'none'}"
    if not allow_other_base:
        raise CheckpointError(
            f"{file}: base.fingerprint: checkpoint {path} was trained on {saved.get('spec')!r} but the base is "
            f"{base.spec!r} ({said}); load it with its own base, or pass allow_other_base=True (--allow-other-base)"
        )
    warnings.warn(
        f"checkpoint {path} was trained on {saved.get('spec')!r}, loaded on {base.spec!r} ({said})", stacklevel=3
    )
    keys = ("model_type", "hash")
    return [
        {
            "source": str(path),
            "recorded": {"spec": saved.get("spec"), **{k: want.get(k) for k in keys}},
            "base": {"spec": base.spec, **{k: have.get(k) for k in keys}},
        }
    ]


def _check_tensor_sizes(configs: list[MethodConfig], tensors: dict, base, file: Path) -> None:
    """CheckpointError when the tensors of ``methods[i]`` do not hold the values its config needs on ``base``."""
    for i, config in enumerate(configs):
        have = sum(t.numel() for k, t in tensors.items() if k.split(".", 1)[0] == str(i))
        need = config.parameter_count(base)
        if have != need:
            raise CheckpointError(
                f"{file}: tensors of methods[{i}] ({config}) hold {have} values; its options need {need} on {base.spec}; "
                "the checkpoint is inconsistent: re-save it"
            )
    stray = sorted(k for k in tensors if not k.split(".", 1)[0].isdigit() or int(k.split(".", 1)[0]) >= len(configs))
    if stray:
        raise CheckpointError(
            f"{file}: tensor {stray[0]!r} belongs to no method of {META_FILE}; re-save the checkpoint"
        )


def load_checkpoint(path: str | Path, base=None, *, allow_other_base: bool = False):
    """Rebuild the GuidedModel saved at ``path``; ``base`` (a Base or spec) defaults to the checkpoint's base spec."""
    from anchorlens.methods.guided import GuidedModel
    from anchorlens.models.base import Base
    from anchorlens.models.loading import load_base

    meta = read_meta(path)
    file = Path(path).expanduser() / META_FILE
    if not isinstance(base, Base):
        base = load_base(base if isinstance(base, str) else meta["base"].get("spec"))
    other = check_base(meta, base, path, allow_other_base)
    configs = method_configs(meta, file)
    for i, config in enumerate(configs):  # bounds before any allocation derived from a config number
        try:
            config.check_fits(base)
        except UsageError as err:
            raise CheckpointError(f"{file}: methods[{i}]: {err}") from None
    tensor_file = Path(path).expanduser() / TENSOR_FILE
    tensors = load_tensors(tensor_file, f"checkpoint tensors of {path}:")
    check_float_tensors(tensors, tensor_file)
    _check_tensor_sizes(configs, tensors, base, tensor_file)
    guided = GuidedModel(base, [c.build() for c in configs], seed=int(meta.get("seed", 0)))
    try:
        guided.load_guidance_state_dict(tensors)
    except (KeyError, RuntimeError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint {path}: {TENSOR_FILE} does not match its {META_FILE} ({str(err).splitlines()[0]})"
        ) from None
    guided.meta = {**meta, **({"other_base": other} if other else {})}
    return guided


def checkpoint_guidances(path: str | Path, base) -> list:
    """The checkpoint's guidances, bound to ``base`` and loaded (for composing with other methods)."""
    return load_checkpoint(path, base).guidances
