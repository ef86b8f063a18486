"""Role names, order and colours for figures, taken from the run's data.

Tasks may define roles of their own (``scaffold``, ``system``, ``demo``, ``newline`` ...) beside the
built-in ones, so no figure lists roles from a fixed table: the names come from the frame's
``query_role`` / ``key_role`` values or the maps' role sequences. Built-in roles keep their colours
and their canonical order; other roles follow them in the order the data first names them and take
colours from a fallback palette in that order, so one figure never gives two roles one colour.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import seaborn as sns

from anchorlens.roles.kinds import GUIDANCE_ROLES, Role
from anchorlens.roles.table import is_field_group

_CB = sns.color_palette("colorblind").as_hex()
BUILTIN_COLORS: dict[str, str] = {
    Role.SPECIAL.label: _CB[7],  # grey
    Role.STRUCTURAL.label: _CB[1],  # orange
    Role.CONTENT.label: _CB[0],  # blue
    Role.SOFT_PROMPT.label: _CB[2],  # green
    Role.INSTANCE.label: _CB[4],  # purple
    Role.CAPSULE.label: _CB[3],  # vermillion
}
BUILTIN_ORDER: tuple[str, ...] = tuple(BUILTIN_COLORS)  # the built-ins' canonical order (Role order)
GUIDANCE_NAMES: tuple[str, ...] = tuple(r.label for r in GUIDANCE_ROLES)
# Colours for roles that are not built in: the colorblind palette's unused entries, then its dark variant.
FALLBACK_COLORS: tuple[str, ...] = (
    _CB[5],
    _CB[6],
    _CB[8],
    _CB[9],
    *sns.color_palette("dark").as_hex(),
)
# Pooled labels of the decomposition and the frames (not roles of a position).
POOLED_COLORS: dict[str, str] = {"sink": "#2b2b2b", "guidance": _CB[4], "input": "#555555"}
UNKNOWN_COLOR = "#555555"


def role_name(role: object) -> str:
    """A role's label: built-in Roles (or their ints) by name, any other name as written."""
    if isinstance(role, Role):
        return role.label
    if not isinstance(role, str) and hasattr(role, "__int__"):
        value = int(role)
        return Role(value).label if value in Role._value2member_map_ else f"role {value}"
    text = str(role).strip()
    return text.lower() if text.lower() in BUILTIN_COLORS else text


def ordered_roles(names: Iterable[object]) -> list[str]:
    """The distinct role names of ``names``: built-ins in canonical order, then the others as first seen, then the
    field groups (``content:<field>``, parts of ``content``) as first seen."""
    seen = [n for n in dict.fromkeys(role_name(r) for r in names) if n != ""]
    others = [r for r in seen if r not in BUILTIN_COLORS and not is_field_group(r)]
    return [r for r in BUILTIN_ORDER if r in seen] + others + [r for r in seen if is_field_group(r)]


def role_palette(names: Iterable[object]) -> dict[str, str]:
    """A colour per role of ``names`` (in :func:`ordered_roles` order): fixed for built-ins, content's for its field
    groups (``content:<field>``: parts of it), fallback for others."""
    palette: dict[str, str] = {}
    extra = 0
    for name in ordered_roles(names):
        if name in BUILTIN_COLORS:
            palette[name] = BUILTIN_COLORS[name]
        elif name in POOLED_COLORS:
            palette[name] = POOLED_COLORS[name]
        elif is_field_group(name):
            palette[name] = BUILTIN_COLORS[Role.CONTENT.label]
        else:
            palette[name] = FALLBACK_COLORS[extra % len(FALLBACK_COLORS)]
            extra += 1
    return palette


def role_color(role: object, palette: dict[str, str] | None = None) -> str:
    """Colour of one role: from ``palette`` (see :func:`role_palette`), else its built-in or pooled colour."""
    name = role_name(role)
    if palette and name in palette:
        return palette[name]
    if is_field_group(name):
        return BUILTIN_COLORS[Role.CONTENT.label]
    return BUILTIN_COLORS.get(name) or POOLED_COLORS.get(name) or UNKNOWN_COLOR


def is_guidance(role: object) -> bool:
    """Whether a role is guidance inserted by a method (soft prompt, instance token, capsule)."""
    return role_name(role) in GUIDANCE_NAMES


def role_labels(values: Sequence[object]) -> list[str]:
    """Role labels of a role sequence (ints of built-in Roles, Roles, or names)."""
    return [role_name(v) for v in values]
