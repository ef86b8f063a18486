"""``anchorlens models``: the verified families, or what discovery finds in one base."""

from __future__ import annotations

from typing import Annotated

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import cli_command


def layout_lines(base) -> list[str]:
    """What discovery found in a loaded base: stacks, attention layers, mechanisms, guidance and prefix support."""
    adapter = base.adapter
    found = getattr(adapter, "found", None)
    lines = [f"{base.spec}: model_type {base.config.model_type}, {base.num_parameters():,} parameters"]
    for stack in adapter.stacks():
        sites = [site for site, _ in base.sites() if site.stack == stack]
        total = adapter.num_layers(base.model, adapter.block_stack(stack))
        lines.append(f"  {stack}: {len(sites)} softmax-attention layers of {total} blocks")
    if found is not None:
        for kind, layers in found.other_layers("decoder").items():
            lines.append(f"  layers without softmax attention ({kind}): {', '.join(map(str, layers))}")
        lines.append(f"  mechanisms: {', '.join(found.mechanisms) or 'none beyond causal softmax attention'}")
    guidance = "yes" if adapter.supports_guidance else f"no ({adapter.guidance_refusal or 'capture only'})"
    prefix = "yes" if adapter.supports_prefix else f"no ({adapter.prefix_refusal or 'not for this family'})"
    lines += [f"  guidance (prompt, deep prompt, instance, capsule): {guidance}", f"  PEFT prefix: {prefix}"]
    return lines


@app.command()
@cli_command
def models(
    base: Annotated[
        str | None,
        typer.Argument(help="A base to inspect (hub id, local dir, smollm2-135m or tiny-<family>); none: the table."),
    ] = None,
    survey: Annotated[
        bool,
        typer.Option(
            "--survey",
            help="Build a tiny random model of every model_type transformers has (or of --only), discover and "
            "certify each: one line per type (minutes).",
        ),
    ] = False,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="With --survey: only these model types (repeat).")
    ] = None,
) -> None:
    """Print the families verified on every commit (markdown), or what discovery finds in BASE."""
    if survey:
        _survey(only)
        return
    if base is None:
        from anchorlens.models.verified import verified_table

        typer.echo(verified_table())
        return
    from anchorlens.models.loading import load_base

    typer.echo("\n".join(layout_lines(load_base(base))))


def _survey(only: list[str] | None) -> None:
    """Print one survey line per model type as it is done, then the counts."""
    from collections import Counter

    from anchorlens.workflows.survey import survey

    counts: Counter[str] = Counter()
    for row in survey(only):
        counts[row.status] += 1
        diff = "" if row.max_abs_diff is None else f" max |Δ| {row.max_abs_diff:.1e}"
        guided = " (+instance)" if row.guidance else ""
        typer.echo(f"{row.model_type:<28} {row.status}{diff}{guided}{': ' + row.reason if row.reason else ''}")
    typer.echo("; ".join(f"{status}: {count}" for status, count in counts.most_common()))
