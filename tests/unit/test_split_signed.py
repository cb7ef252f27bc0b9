"""formats.gitobjects.split_signed: a commit's or tag's signature and payload as git splits
them to verify (commit.c parse_signed_commit, gpg-interface.c parse_signature), and
formats.openpgp.signed_message, the form several are checked in by one gpg run."""

from __future__ import annotations

from formats.gitobjects import embed_commit_signature, split_signed
from formats.openpgp import encode_packet, signed_message

SIG = "-----BEGIN SSH SIGNATURE-----\nAAAA\nBBBB\n-----END SSH SIGNATURE-----\n"
PAYLOAD = (b"tree " + b"1" * 40 + b"\nparent " + b"2" * 40 + b"\nauthor A <a@x> 1 +0000\n"
           b"committer A <a@x> 1 +0000\n\nmessage\n\n with a blank line\n")


def test_commit_signature_headers() -> None:
    signed = embed_commit_signature(PAYLOAD, SIG)
    assert split_signed("commit", signed) == (PAYLOAD, SIG.encode(), 1)
    # In a SHA-256 repository git reads gpgsig-sha256, and leaves out every signature header.
    both = embed_commit_signature(signed, SIG.replace("AAAA", "CCCC"), "gpgsig-sha256")
    payload, sig, count = split_signed("commit", both, "sha256")
    assert payload == PAYLOAD and count == 2 and sig == SIG.replace("AAAA", "CCCC").encode()
    assert split_signed("commit", PAYLOAD) == (PAYLOAD, None, 0)
    # Continuation lines of another header (mergetag) stay in the payload.
    merge = PAYLOAD.replace(b"\n\nmessage", b"\nmergetag object x\n type commit\n\nmessage")
    assert split_signed("commit", embed_commit_signature(merge, SIG))[0] == merge


def test_tag_signature_is_the_last_block() -> None:
    head = b"object " + b"1" * 40 + b"\ntype commit\ntag v1\ntagger A <a@x> 1 +0000\n\nv1\n"
    pgp = b"-----BEGIN PGP SIGNATURE-----\n\nxx\n-----END PGP SIGNATURE-----\n"
    assert split_signed("tag", head + pgp) == (head, pgp, 1)
    assert split_signed("tag", head + SIG.encode() + pgp) == (head + SIG.encode(), pgp, 2)
    assert split_signed("tag", head) == (head, None, 0)


def test_signed_message() -> None:
    message = signed_message(b"payload", b"\xc2\x01x")
    assert message == b"\xc2\x01x" + encode_packet(11, b"b\x00\x00\x00\x00\x00payload")
