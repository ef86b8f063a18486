"""Jupyter helpers: ``inspect`` and its offline HTML widget."""
