"""Interactive, offline HTML views of attention maps (for report.html and the notebook)."""

from anchorlens.views.page import attention_view_html, view_fragment

__all__ = ["attention_view_html", "view_fragment"]
