"""Checks of a peer's answer to a branch stamp request (server.gitlog.peers), without servers.

Cross-stamping between live servers is tested in tests/system/test_peers.py.
"""

from __future__ import annotations

import pytest

from server.errors import PeerError
from server.gitlog.peers import check_branch_stamp


def test_check_branch_stamp_rejects() -> None:
    tree, commit, uid, now = "a" * 40, "b" * 40, "P <p@x>", 1700000000
    good = (f"tree {tree}\nparent {commit}\nauthor {uid} {now} +0000\n"
            f"committer {uid} {now} +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n"
            " AAAA\n =abcd\n -----END PGP SIGNATURE-----\n\nmsg\n")
    checked = check_branch_stamp(good, tree=tree, commit=commit, parent=None, uid=uid, now=now)
    assert checked.payload == (f"tree {tree}\nparent {commit}\nauthor {uid} {now} +0000\n"
                               f"committer {uid} {now} +0000\n\nmsg\n").encode()
    assert checked.signature == ("-----BEGIN PGP SIGNATURE-----\n\nAAAA\n=abcd\n"
                                 "-----END PGP SIGNATURE-----\n")
    bad = [
        good.replace(f"tree {tree}", f"tree {'c' * 40}"),
        good.replace(uid, "Q <q@x>"),
        good.replace(f"{now} +0000\ncommitter", f"{now - 60} +0000\ncommitter"),
        good.replace("+0000\ngpgsig", "+0100\ngpgsig"),
        good.replace("msg\n", "msg\n-----BEGIN PGP SIGNATURE-----\n"),
        good.replace("msg", "m\u00e9g"),
        good + "x" * 8000,
    ]
    for text in bad:
        with pytest.raises(PeerError):
            check_branch_stamp(text, tree=tree, commit=commit, parent=None, uid=uid, now=now)
    with pytest.raises(PeerError):
        check_branch_stamp(good, tree=tree, commit=commit, parent="d" * 40, uid=uid, now=now)


def test_peer_requests_share_one_verifying_tls_context() -> None:
    """Made once (reading the CA bundle costs ~45 ms of CPU) and still checking certificates
    and host names, as httpx's default does."""
    import ssl

    from server.gitlog import peers

    context = peers._tls()
    assert context is peers._tls()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0
