"""The ``--evidence`` spec: which opt-in evidence reducers a run adds to the defaults, and their options, parsed once.

Syntax (``capture``/``compare --evidence``, ``inspect(evidence=...)``): ``all``, or reducer names separated by
commas, each optionally with options after a colon; an option after a comma belongs to the reducer before it::

    all
    value_mass,sink_battery
    sink_battery:eps=0.1/0.3/0.5,top=5,value_mass
    all,massive_activations:abs_threshold=50

Options: ``sink_battery``: ``eps`` (thresholds in (0, 1), ``/``-separated), ``top`` (keys ranked); ``massive_activations``:
``top``, ``abs_threshold``, ``ratio``; ``value_mass``: none. The result is name -> options in the order of
:data:`~anchorlens.analyses.defaults.EVIDENCE_REDUCERS`, for ``default_reducers(extra=...)``; every reducer is built
once here so a bad value (an eps outside (0, 1), a top of 0) is a one-line UsageError before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from anchorlens.analyses.defaults import EVIDENCE_REDUCERS
from anchorlens.analyses.registry import make_reducer
from anchorlens.errors import UsageError

ALL_EVIDENCE = "all"
EvidenceSpec = dict[str, dict[str, Any]]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split("/") if v.strip()]


def _int(text: str) -> int:
    return int(text)


# reducer -> option -> parser of its text value
OPTIONS: dict[str, dict[str, Callable[[str], Any]]] = {
    "sink_battery": {"eps": _floats, "top": _int},
    "massive_activations": {"top": _int, "abs_threshold": float, "ratio": float},
    "value_mass": {},
}


def _option(name: str, item: str) -> tuple[str, Any]:
    """``key=value`` of reducer ``name`` parsed with its option's parser; UsageError naming the fix."""
    key, eq, text = item.partition("=")
    key = key.strip()
    known = OPTIONS[name]
    if not eq or not key:
        raise UsageError(f"--evidence option {item!r} of {name} is not KEY=VALUE (e.g. sink_battery:eps=0.1/0.3)")
    if key not in known:
        choices = ", ".join(known) or "none"
        raise UsageError(f"--evidence: {name} has no option {key!r} (its options: {choices})")
    try:
        return key, known[key](text.strip())
    except ValueError:
        raise UsageError(f"--evidence {name}:{key}={text.strip()!r} is not a number of the right kind") from None


def _name(text: str) -> str:
    """A reducer name (or ``all``) as given; UsageError listing the choices."""
    name = text.strip().lower().replace("-", "_")
    if name != ALL_EVIDENCE and name not in OPTIONS:
        raise UsageError(f"--evidence: unknown reducer {text.strip()!r}; choose all or {', '.join(EVIDENCE_REDUCERS)}")
    return name


def parse_evidence(spec: str | Sequence[str] | Mapping[str, Mapping] | None) -> EvidenceSpec:
    """``--evidence`` values (one string, several, or an already parsed mapping) -> name -> options (module docstring).

    None or an empty list: no evidence reducer (an empty string is refused). Every reducer is built once to check its options (one UsageError line).
    """
    if spec is None or (not isinstance(spec, str | Mapping) and not list(spec)):
        return {}
    if isinstance(spec, Mapping):
        items = {_name(str(k)): dict(v or {}) for k, v in spec.items()}
        for name, opts in items.items():
            if name == ALL_EVIDENCE and opts:
                raise UsageError("--evidence: 'all' takes no options; name the reducer (e.g. sink_battery:eps=0.3)")
    else:
        texts = [spec] if isinstance(spec, str) else list(spec)
        items = {}
        current: str | None = None
        for token in (t for text in texts for t in str(text).split(",")):
            if not token.strip():
                continue
            if "=" in token and ":" not in token:
                if current is None or current == ALL_EVIDENCE:
                    raise UsageError(
                        f"--evidence option {token.strip()!r} follows no reducer name (e.g. sink_battery:eps=0.3)"
                    )
                key, value = _option(current, token)
                items[current][key] = value
                continue
            head, colon, rest = token.partition(":")
            current = _name(head)
            items.setdefault(current, {})
            if colon:
                if current == ALL_EVIDENCE:
                    raise UsageError("--evidence: 'all' takes no options; name the reducer (e.g. sink_battery:eps=0.3)")
                key, value = _option(current, rest)
                items[current][key] = value
        if not items:
            raise UsageError(f"--evidence is empty; give all or some of {', '.join(EVIDENCE_REDUCERS)}")
    if items.pop(ALL_EVIDENCE, None) is not None:
        items = {name: items.get(name, {}) for name in EVIDENCE_REDUCERS}
    out = {name: items[name] for name in EVIDENCE_REDUCERS if name in items}
    for name, opts in out.items():
        unknown = set(opts) - set(OPTIONS[name])
        if unknown:
            raise UsageError(
                f"--evidence: {name} has no option {sorted(unknown)[0]!r} (its options: {', '.join(OPTIONS[name]) or 'none'})"
            )
        try:
            make_reducer(name, **opts)  # the reducer's own checks: eps in (0, 1), top >= 1, thresholds > 0
        except UsageError as err:
            raise UsageError(f"--evidence {name}: {err}") from None
    return out


def evidence_record(reducers: Sequence[Any]) -> dict[str, dict]:
    """The manifest's ``evidence``: name -> options of the evidence reducers among ``reducers`` (as they ran)."""
    return {
        r.name: {k: v for k, v in r.state_options().items() if k != "roles"}
        for r in reducers
        if r.name in EVIDENCE_REDUCERS
    }


__all__ = ["ALL_EVIDENCE", "EvidenceSpec", "OPTIONS", "evidence_record", "parse_evidence"]
