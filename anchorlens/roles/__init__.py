"""Token roles: kinds, templates, tokenization with roles, and attention layouts."""

from __future__ import annotations

from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import GUIDANCE_ROLES, INPUT_ROLES, NUM_ROLES, ROLE_NAMES, Role, parse_role
from anchorlens.roles.layout import Layout, LayoutProvider, SequenceRoles, StaticLayout
from anchorlens.roles.templates import (
    RAW_TEMPLATE,
    Field,
    Literal,
    Rendered,
    Segment,
    Span,
    Template,
    TemplateError,
    TemplateSyntaxError,
    lookup,
)
from anchorlens.roles.tokenize import encode, token_role

__all__ = [
    "GUIDANCE_ROLES",
    "INPUT_ROLES",
    "NUM_ROLES",
    "RAW_TEMPLATE",
    "ROLE_NAMES",
    "Encoded",
    "Field",
    "Layout",
    "LayoutProvider",
    "Literal",
    "Rendered",
    "Role",
    "Segment",
    "SequenceRoles",
    "Span",
    "StaticLayout",
    "Template",
    "TemplateError",
    "TemplateSyntaxError",
    "encode",
    "lookup",
    "parse_role",
    "token_role",
]
