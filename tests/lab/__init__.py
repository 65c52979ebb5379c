"""Drill lab tests (root only)."""
