"""What a PEFT adapter directory holds, read without PEFT: its file names, its type and its JSON config.

Shared by the prompt-learning import (:mod:`anchorlens.methods.peft_import`) and the LoRA-family adapters
(:mod:`anchorlens.methods.peft_lora`), which import this module and never each other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anchorlens.errors import CheckpointError
from anchorlens.methods.peft_base import CONFIG_FILE

WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_TYPES = ("PROMPT_TUNING", "P_TUNING", "PREFIX_TUNING")  # loaded as guidance
INJECTED_TYPES = ("LORA", "IA3", "LOHA", "LOKR")  # applied by PEFT to the base's layers


def is_peft_dir(path: str | Path) -> bool:
    """True when ``path`` holds a PEFT ``adapter_config.json``."""
    return (Path(path).expanduser() / CONFIG_FILE).is_file()


def read_adapter_json(path: str | Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` as a dict; CheckpointError naming the file when absent or malformed."""
    file = Path(path).expanduser() / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path} is not a PEFT adapter directory (no {CONFIG_FILE})")
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: not valid JSON ({str(err).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: must hold a JSON object; got {type(cfg).__name__}")
    return cfg


def adapter_type(path: str | Path) -> str:
    """The adapter's ``peft_type`` (upper case; ``?`` when absent)."""
    kind = read_adapter_json(path).get("peft_type")
    return kind.upper() if isinstance(kind, str) else "?"
