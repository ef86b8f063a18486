"""Guidance checkpoints: a directory with ``anchorlens.json`` and ``guidance.safetensors`` (no pickle)."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from anchorlens.tensorfile import load_tensors

from anchorlens.errors import UsageError

FORMAT_VERSION = 1
META_FILE = "anchorlens.json"
TENSOR_FILE = "guidance.safetensors"


def is_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a directory holding ``anchorlens.json``."""
    return (Path(path).expanduser() / META_FILE).is_file()


def read_meta(path: str | Path) -> dict[str, Any]:
    """The checkpoint's ``anchorlens.json``; UsageError when absent, unreadable or of a newer format."""
    file = Path(path).expanduser() / META_FILE
    if not file.is_file():
        raise UsageError(f"{path} is not an anchorlens checkpoint (no {META_FILE})")
    try:
        meta = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise UsageError(f"{file} is not valid JSON: {err}") from None
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UsageError(f"{file} has format_version {version!r}; this anchorlens reads up to {FORMAT_VERSION}: upgrade it")
    return meta


def save_checkpoint(
    guided,
    path: str | Path,
    task: str | None = None,
    template: str | None = None,
    training: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``guided``'s methods, base facts and tensors to directory ``path``; returns the path."""
    out = Path(path).expanduser()
    if out.exists():
        if not overwrite:
            raise UsageError(f"{out} already exists; choose a new directory or pass overwrite=True")
        if out.is_dir() and not is_checkpoint(out) and any(out.iterdir()):
            raise UsageError(f"{out} exists and is not an anchorlens checkpoint; refusing to overwrite it")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
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
    json.dumps(meta)  # fail before writing anything if a value is not JSON-able
    out.mkdir(parents=True)
    tensors = guided.guidance_state_dict()
    save_file(tensors, str(out / TENSOR_FILE), metadata={"format": "anchorlens", "format_version": str(FORMAT_VERSION)})
    (out / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    return out


def check_base(meta: dict[str, Any], base, path: str | Path) -> None:
    """UsageError if ``base`` differs in layers or width from the checkpoint's base; warn on other differences."""
    saved = meta.get("base", {})
    want = saved.get("fingerprint", {})
    have = base.fingerprint()
    for key in ("num_layers", "hidden_size"):
        if key in want and want[key] != have[key]:
            raise UsageError(
                f"checkpoint {path} was trained on {saved.get('spec')!r} ({want.get('num_layers')} layers, "
                f"d={want.get('hidden_size')}) but the base is {base.spec!r} ({have['num_layers']} layers, "
                f"d={have['hidden_size']}); load it with its own base"
            )
    if want.get("hash") and want["hash"] != have["hash"]:
        warnings.warn(
            f"checkpoint {path} was trained on {saved.get('spec')!r} ({want}); the base {base.spec!r} differs ({have})",
            stacklevel=3,
        )


def checkpoint_guidances(path: str | Path, base) -> list:
    """The checkpoint's guidances, bound to ``base`` and loaded (for composing with other methods)."""
    return load_checkpoint(path, base).guidances


def load_checkpoint(path: str | Path, base=None):
    """Rebuild the GuidedModel saved at ``path``; ``base`` defaults to the checkpoint's base spec."""
    from anchorlens.methods.guided import GuidedModel
    from anchorlens.methods.registry import guidance_from_config
    from anchorlens.models.loading import load_base

    meta = read_meta(path)
    if base is None:
        base = load_base(meta.get("base", {}).get("spec"))
    check_base(meta, base, path)
    tensors = load_tensors(Path(path).expanduser() / TENSOR_FILE, f"checkpoint tensors of {path}:")
    guidances = [guidance_from_config(entry) for entry in meta.get("methods", [])]
    guided = GuidedModel(base, guidances, seed=int(meta.get("seed", 0)))
    try:
        guided.load_guidance_state_dict(tensors)
    except (KeyError, RuntimeError, ValueError) as err:
        raise UsageError(f"checkpoint {path}: {TENSOR_FILE} does not match its {META_FILE} ({str(err).splitlines()[0]})") from None
    guided.meta = meta
    return guided
