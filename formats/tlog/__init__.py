"""Transparency-log formats (see docs/transparency-formats.md)."""
