"""Workflows: end-to-end jobs (demo, capture, compare, position sweep) returning data, not files."""
