"""What ``stampd verify`` reports when a target does not verify: one error type per outcome,
each with its exit status (`client.errors.CommandError` maps it to one line).

Exit status: 0 valid, 1 invalid (or could not be checked, or unsupported), 2 malformed, 3 a
valid token whose imprint is not in the ``--log`` (yet), or (``--signers``) a commit or tag that
no stamp covers.
"""

from __future__ import annotations

from client.errors import CommandError


class VerifyError(CommandError):
    """A target did not verify: ``stampd verify: <kind>: <message>``, exit status 1 (2 for
    `Malformed`)."""

    exit_code = 1
    kind: str | None = "invalid"


class Invalid(VerifyError):
    """Well-formed, but not valid: bad signature, wrong key, wrong time, digest mismatch."""


class CannotCheck(VerifyError):
    """The check could not be made (key not obtainable, gpg missing): not shown valid."""

    kind = "cannot check"


class Unsupported(CannotCheck):
    """Well-formed, but signed in a way stampd verify cannot check (an X.509 signature, an
    OpenPGP message): not shown valid, exit status 1."""

    kind = "unsupported"


class Malformed(VerifyError):
    """Not a receipt or stamp of a known format, or an unusable argument."""

    exit_code = 2
    kind = "malformed"


class Usage(VerifyError):
    """The target cannot be checked with the arguments given (a git stamp without ``--key``):
    exit status 2, the message alone says what to give."""

    exit_code = 2
    kind = None


class NotLogged(VerifyError):
    """The token is valid, but its imprint is in no commit of the ``--log`` (yet): exit 3.

    Not a failure of the token: a log commit publishes what was stamped during its period, so
    a token younger than the log's last commit is expected to be missing; ask again later."""

    exit_code = 3
    kind = "not in the log yet"


class NotStamped(VerifyError):
    """``--signers``: a signed commit or tag that verifies, but no stamp proves when it existed
    (none in the repository or its notes, none the server has with ``--fetch-proof``): exit 3.

    Its signature can then be checked only against the date its signer wrote, which is what
    the stamp is for; stamp it (the hook does so for every commit) and verify again."""

    exit_code = 3
    kind = "not stamped"
