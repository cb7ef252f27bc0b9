"""GnuPG's status lines tallied once for the workers and the client (formats/gpgstatus.py)."""

from __future__ import annotations

from formats.gpgstatus import SignatureTally, ValidSig, status_time

FPR = "A" * 40
PRIMARY = "b" * 40
ONE = f"""gpg: Signature made ...
[GNUPG:] NEWSIG
[GNUPG:] KEY_CONSIDERED {PRIMARY.upper()} 0
[GNUPG:] GOODSIG 0123456789ABCDEF stampd <stampd@localhost>
[GNUPG:] VALIDSIG {FPR.lower()} 2026-11-26 1795400000 0 4 0 22 8 00 {PRIMARY}
"""


def tally(text: str) -> SignatureTally:
    t = SignatureTally()
    t.add_lines(text)
    return t


def test_one_good_signature() -> None:
    t = tally(ONE)
    assert (t.newsig, t.goodsig, t.validsig, t.errors) == (1, 1, 1, [])
    assert t.valid_sigs == [ValidSig(FPR, 1795400000, "00", PRIMARY.upper())]
    assert t.records[0] == ("NEWSIG",) and t.records[-1][0] == "VALIDSIG"


def test_two_signatures_in_one_block_are_counted() -> None:
    t = tally(ONE + ONE)
    assert (t.newsig, len(t.valid_sigs)) == (2, 2)


def test_iso_times_a_missing_primary_and_a_short_line() -> None:
    t = tally(f"[GNUPG:] VALIDSIG {FPR} 2026-11-26 20261126T120000 0 4 0 22 8 01\n"
              "[GNUPG:] VALIDSIG FFFF 2026-11-26\n")
    assert t.validsig == 2  # the short line is counted, not taken as a signature
    assert t.valid_sigs == [ValidSig(FPR, status_time("20261126T120000") or 0, "01", FPR)]
    assert status_time("20261126T120000") == 1795694400
    assert status_time("yesterday") is None


def test_failed_keywords_in_order() -> None:
    t = tally("[GNUPG:] NEWSIG\n[GNUPG:] BADSIG 0123 x\n[GNUPG:] NODATA 1\nnot a status line\n")
    assert t.errors == ["BADSIG", "NODATA"] and t.valid_sigs == [] and t.newsig == 1
