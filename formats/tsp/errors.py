"""The error of the RFC 3161 formats: bad input to a builder, or a token that cannot be read."""

from __future__ import annotations

__all__ = ["TspError"]


class TspError(ValueError):
    """Bad input to a builder, or a token that cannot be read."""
