"""The roles of one run: the six built-in roles and those its task names, each a small integer in role tensors.

Roles are open: a task file, a chat template, few-shot demonstrations or token rules add roles of their own
(``scaffold``, ``system``, ``demo``, ``demo_label``, ``newline``, ``punct``...). A :class:`RoleTable` is the
ordered list of role names of one run; a role's id is its index. The built-in roles keep their ids (``Role``
values 0-5) in every table, so guidance methods insert the same ids whatever the task, and every table
extends :data:`BUILTIN_ROLES`. Roles a task adds are *input* roles (queries of the pooled ``input`` group);
only the built-in ``soft_prompt``, ``instance`` and ``capsule`` are guidance.

Statistics, frames and figures take their role names from the table (or from the frame's labels), never from
a fixed list; runs record their table in ``manifest.json`` (:meth:`RoleTable.to_json`).

Fields are groups too: a table may name the task's template ``fields`` (``premise``, ``hypothesis``); the content
tokens filled from field ``f`` then also form the *field group* ``content:f`` (:func:`field_group`). Field groups
are a finer partition of the ``content`` role, never roles of their own: a token's role id stays ``content``, and
the analyses report the groups next to the roles (their masses sum to the content mass).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anchorlens.roles.kinds import GUIDANCE_ROLES, ROLE_NAMES, Role

ROLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
RESERVED_LABELS: frozenset[str] = frozenset({"all", "input", "guidance", "sink", "first_token", "none"})
GUIDANCE_NAMES: frozenset[str] = frozenset(r.label for r in GUIDANCE_ROLES)
FIELD_GROUP_PREFIX = Role.CONTENT.label + ":"


def field_group(field: str) -> str:
    """Label of the group of content tokens filled from template field ``field``: ``content:<field>``."""
    return FIELD_GROUP_PREFIX + field


def is_field_group(label: object) -> bool:
    """Whether ``label`` names a field group (``content:<field>``), a part of the content role, not a role."""
    return isinstance(label, str) and label.startswith(FIELD_GROUP_PREFIX)


def check_role_name(name: object) -> str:
    """``name`` as a role name (lower-case identifier, at most 32 characters, not a pooled label); ValueError otherwise."""
    if not isinstance(name, str) or not ROLE_NAME.fullmatch(name):
        raise ValueError(
            f"role name {name!r} must be a lower-case identifier of at most 32 characters (letters, digits, _)"
        )
    if name in RESERVED_LABELS:
        raise ValueError(f"role name {name!r} is reserved for pooled labels ({', '.join(sorted(RESERVED_LABELS))})")
    return name


@dataclass(frozen=True)
class RoleTable:
    """Ordered role names of one run; a role's id in role tensors is its index (the built-ins first, as ``Role``).

    ``descriptions`` maps a role a task added to where it comes from (``"chat template"``, a rule...), for the
    manifest and ``anchorlens tasks``. ``fields``: the task's template fields, whose content tokens form the field
    groups ``content:<field>`` (:attr:`group_names`; ids 0..F-1 in a sequence's ``fields`` tensor).
    """

    names: tuple[str, ...] = ROLE_NAMES
    descriptions: tuple[tuple[str, str], ...] = ()
    fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Check the built-in prefix, the names and their uniqueness."""
        names = tuple(self.names)
        object.__setattr__(self, "names", names)
        if names[: len(ROLE_NAMES)] != ROLE_NAMES:
            raise ValueError(
                f"a role table starts with the built-in roles {ROLE_NAMES}, got {names[: len(ROLE_NAMES)]}"
            )
        for name in names[len(ROLE_NAMES) :]:
            check_role_name(name)
        if len(set(names)) != len(names):
            raise ValueError(f"role names repeat in {names}")
        fields = tuple(str(f) for f in self.fields)
        object.__setattr__(self, "fields", fields)
        if len(set(fields)) != len(fields) or not all(fields):
            raise ValueError(f"field names must be distinct and non-empty, got {fields}")

    @classmethod
    def with_roles(cls, extra: Iterable[str], descriptions: Mapping[str, str] | None = None) -> RoleTable:
        """The built-in roles followed by ``extra`` (built-ins and repeats skipped, order kept)."""
        names = list(ROLE_NAMES)
        for name in extra:
            if name not in names:
                names.append(check_role_name(name))
        about = tuple((k, v) for k, v in (descriptions or {}).items() if k in names)
        return cls(tuple(names), about)

    def extend(self, extra: Iterable[str], descriptions: Mapping[str, str] | None = None) -> RoleTable:
        """This table with ``extra`` roles appended (existing ones kept where they are)."""
        about = {**dict(self.descriptions), **(descriptions or {})}
        return RoleTable.with_roles([*self.extra, *extra], about).with_fields(self.fields)

    def with_fields(self, fields: Iterable[str]) -> RoleTable:
        """This table with template ``fields`` (repeats and empty names skipped, order kept) as its field groups; a
        single field gives none (its group would be the ``content`` role itself, every row twice)."""
        names = tuple(dict.fromkeys(str(f) for f in fields if str(f)))
        return RoleTable(self.names, self.descriptions, names if len(names) > 1 else ())

    @property
    def group_names(self) -> tuple[str, ...]:
        """Labels of the field groups (``content:<field>``), in field order (empty without fields)."""
        return tuple(field_group(f) for f in self.fields)

    def field_id(self, field: str) -> int:
        """Index of a template field among :attr:`fields` (-1 when the table does not list it)."""
        return self.fields.index(field) if field in self.fields else -1

    @property
    def size(self) -> int:
        """Number of roles R (role ids are 0..R-1)."""
        return len(self.names)

    @property
    def extra(self) -> tuple[str, ...]:
        """The roles beyond the built-ins, in id order."""
        return self.names[len(ROLE_NAMES) :]

    def id(self, role: str | int | Role) -> int:
        """Id of a role given by name (case-insensitive, ``-`` read as ``_``), id or ``Role``; ValueError names the choices."""
        if isinstance(role, Role):
            return int(role)
        if isinstance(role, int) and not isinstance(role, bool):
            if 0 <= role < self.size:
                return role
            raise ValueError(f"role id {role} is outside 0..{self.size - 1}")
        key = str(role).strip().lower().replace("-", "_")
        if key in self.names:
            return self.names.index(key)
        raise ValueError(f"unknown role {role!r}; this run's roles are: {', '.join(self.names)}")

    def name(self, role: str | int | Role) -> str:
        """Name of a role given by name, id or ``Role``."""
        return self.names[self.id(role)]

    def is_guidance(self, role: str | int | Role) -> bool:
        """Whether the role is a guidance role (soft_prompt, instance, capsule)."""
        return self.name(role) in GUIDANCE_NAMES

    @property
    def guidance_ids(self) -> tuple[int, ...]:
        """Ids of the guidance roles."""
        return tuple(i for i, n in enumerate(self.names) if n in GUIDANCE_NAMES)

    @property
    def input_ids(self) -> tuple[int, ...]:
        """Ids of the input roles (every role that is not guidance: the built-in special, structural, content and
        every role a task adds)."""
        return tuple(i for i, n in enumerate(self.names) if n not in GUIDANCE_NAMES)

    @property
    def input_names(self) -> tuple[str, ...]:
        """Names of the input roles, in id order."""
        return tuple(self.names[i] for i in self.input_ids)

    @property
    def guidance_names(self) -> tuple[str, ...]:
        """Names of the guidance roles, in id order."""
        return tuple(self.names[i] for i in self.guidance_ids)

    def to_json(self) -> dict[str, Any]:
        """``{"names": [...], "guidance": [...], "added": {name: where it comes from}}`` for manifests (and
        ``"fields": [...]`` when the table has field groups)."""
        out: dict[str, Any] = {
            "names": list(self.names),
            "guidance": list(self.guidance_names),
            "added": {name: dict(self.descriptions).get(name, "") for name in self.extra},
        }
        if self.fields:
            out["fields"] = list(self.fields)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoleTable:
        """Inverse of :meth:`to_json`."""
        added = dict(data.get("added") or {})
        fields = tuple(str(f) for f in data.get("fields") or ())
        return cls(tuple(data["names"]), tuple((k, str(v)) for k, v in added.items() if v), fields)


BUILTIN_ROLES = RoleTable()


def same_table(a: RoleTable, b: RoleTable) -> bool:
    """Whether two tables give every role and field group the same id (descriptions aside)."""
    return a.names == b.names and a.fields == b.fields
