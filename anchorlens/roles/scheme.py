"""How the tokens of one run get their roles: the run's role table, token rules, and the tokenizer's own specials.

A token first takes the role of the rendered span it covers (:mod:`anchorlens.roles.tokenize`). Token rules
then re-tag tokens by their surface text: ``newline = ['^\\s*\\n\\s*$']`` makes every whitespace token holding
a line break a ``newline`` token. Rules apply, first match wins, to tokens whose span role is one of
``RoleScheme.rule_scope`` (structural and content: the text of the task itself, not a chat scaffold, the
system prompt or a demonstration) and never to the tokenizer's specials.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from anchorlens.roles.kinds import Role
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable, check_role_name

RULE_SCOPE: tuple[str, ...] = (Role.STRUCTURAL.label, Role.CONTENT.label)


@dataclass(frozen=True)
class TokenRule:
    """Tokens whose surface text matches ``pattern`` (``re.search``) get ``role``."""

    role: str
    pattern: re.Pattern[str]

    @classmethod
    def compile(cls, role: str, pattern: str) -> TokenRule:
        """A rule from a role name and a regular expression; ValueError names a bad one."""
        if role not in BUILTIN_ROLES.names:
            check_role_name(role)
        try:
            return cls(role, re.compile(pattern))
        except re.error as err:
            raise ValueError(f"role rule {role} = {pattern!r} is not a regular expression ({err})") from None


def compile_rules(rules: Mapping[str, str | Sequence[str]]) -> tuple[TokenRule, ...]:
    """Rules from ``{role: pattern or [patterns]}``, in the mapping's order."""
    out: list[TokenRule] = []
    for role, patterns in rules.items():
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            if not isinstance(pattern, str):
                raise ValueError(f"role rule {role}: patterns must be strings, got {type(pattern).__name__}")
            out.append(TokenRule.compile(role, pattern))
    return tuple(out)


@dataclass(frozen=True)
class RoleScheme:
    """The run's roles (``table``), its token ``rules``, the span roles rules may re-tag (``rule_scope``) and
    whether the tokenizer adds its own special tokens (False when a chat template writes them itself)."""

    table: RoleTable = BUILTIN_ROLES
    rules: tuple[TokenRule, ...] = ()
    rule_scope: tuple[str, ...] = RULE_SCOPE
    add_special_tokens: bool = True
    _scope_ids: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check that every rule's role is in the table."""
        for rule in self.rules:
            self.table.id(rule.role)
        object.__setattr__(self, "_scope_ids", frozenset(self.table.id(r) for r in self.rule_scope))

    def retag(self, role: int, text: str) -> int:
        """The role id of a token of span role ``role`` and surface ``text`` after the rules."""
        if role in self._scope_ids:
            for rule in self.rules:
                if rule.pattern.search(text):
                    return self.table.id(rule.role)
        return role

    def with_rules(self, rules: Iterable[TokenRule]) -> RoleScheme:
        """This scheme with ``rules`` after its own, their roles added to the table."""
        rules = tuple(rules)
        table = self.table.extend(r.role for r in rules)
        return RoleScheme(table, self.rules + rules, self.rule_scope, self.add_special_tokens)


DEFAULT_SCHEME = RoleScheme()
