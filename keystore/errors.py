"""The one base of every error the key store raises (`KeysError`).

The kinds live where they are raised (`keystore.store.KeyStoreError`,
`keystore.keyset.KeyUnusable`, `keystore.gnupg.GpgError`); a caller above the key store (the
command line) catches `KeysError` or one of its kinds. Each has ``message``, what it says.
"""

from __future__ import annotations

__all__ = ["KeysError"]


class KeysError(Exception):
    """Base of the key store's errors. ``message``: what it says."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
