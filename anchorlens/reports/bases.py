"""What a comparison's summary says about the bases its checkpoints ran on and the PEFT adapters they applied."""

from __future__ import annotations

from typing import Any


def base_sentence(facts: dict[str, Any]) -> str:
    """``base X (every checkpoint runs on this one base)``, or each checkpoint's base in a cross-model run."""
    bases = facts.get("bases")
    if not bases:
        return f"base {facts['base']} (every checkpoint runs on this one base)"
    each = "; ".join(f"{name} on {record['spec']}" for name, record in bases.items())
    return f"bases per checkpoint: {each} (one tokenizer: every example gives the same tokens as on {facts['base']})"


def adapter_lines(facts: dict[str, Any]) -> list[str]:
    """One summary line per checkpoint that applies a PEFT layer adapter (LoRA, DoRA, IA3, ...), then a blank."""
    lines = [
        f"{name} applies the PEFT {a['peft_type']} adapter {a['path']} ({a['parameters']:,} adapter values, "
        f"{'merged' if a['merged'] else 'unmerged'})."
        for name, a in facts.get("peft_adapters", {}).items()
    ]
    return [*lines, ""] if lines else []
