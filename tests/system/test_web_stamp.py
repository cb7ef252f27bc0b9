"""The stamp page (``GET /stamp``, docs/web.md "The stamp page") in a real Chromium against a
real server: what it downloads passes the stock tools (gpg --verify, sha256sum -c) and
``stampd verify`` (the log's proof included); a manifest made on the page is byte for byte
the body ``stampd stamp`` sends for the same files; cancel stops the hashing and sends
nothing; the server's refusals are shown plainly; screenshots at 320 and 1280 px, light and
dark, go to a folder named in the output; no horizontal overflow at 320 px; axe-core finds
no serious or critical violation."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.checksums import collect, hash_files
from stampd import cli
from tests.browser import axe_violations, browser  # noqa: F401  (a fixture)
from tests.helpers import TEST_FPR, Server, keyring, require_tools, seed_data_dir, start_server

# The per-client hourly budget of manifest bytes: far above what these tests send, except the
# one that must be refused (a manifest of ~87 KB).
BUDGET = 65_536


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_tools("gpg", "sha256sum", "sha512sum")
    s = start_server(seed_data_dir(tmp_path_factory.mktemp("webstamp") / "data"), workers=1,
                     extra_env={"STAMPD_TLOG": "true",
                                "STAMPD_MANIFEST_BYTES_PER_CLIENT_HOUR": str(BUDGET)})
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def gnupg(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GNUPGHOME holding the server's key, as fetched from the server."""
    key = tmp_path_factory.mktemp("key") / "server-key.asc"
    key.write_bytes(fetch(server.url + "?request=get-public-key-v1"))
    return keyring(key, tmp_path_factory.mktemp("gnupg"))


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        data: bytes = r.read()
        return data


class Tab:
    """A page of its own context, recording its errors and the requests it sends."""

    def __init__(self, browser: Any, server: Server, **context: Any) -> None:  # noqa: F811
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.posts: list[tuple[str, str]] = []
        # Chromium logs each answer >= 400 as a console error: those are the server's, and
        # the tests check how the page shows them.
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type == "error" and "Failed to load resource" not in m.text
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.posts.append((r.url, r.post_data or ""))
                     if r.method == "POST" else None)
        self.page.goto(server.url + "stamp")
        self.page.wait_for_selector("body[data-ready='1']", timeout=15_000)

    def stamp(self, paths: list[Path] | Path, *, folder: bool = False, sha512: bool = False,
              timeout_s: float = 120) -> str:
        """Choose ``paths`` (a directory: with the folder input), wait until the page is done
        (receipt and proof, or a refusal); the result region's text."""
        self.page.evaluate("() => { delete document.body.dataset.state; }")
        self.page.set_checked("#stamp-sha512", sha512)
        selector = "[data-testid=stamp-folder]" if folder else "[data-testid=stamp-files]"
        chosen = [paths] if isinstance(paths, Path) else paths
        self.page.set_input_files(selector, [str(p) for p in chosen])
        self.page.wait_for_selector("body[data-state='done']", timeout=timeout_s * 1000)
        text: str = self.page.inner_text("[data-testid=stamp-result]")
        return text

    def download(self, name: str, into: Path) -> Path:
        with self.page.expect_download(timeout=10_000) as info:
            self.page.get_by_role("link", name=f"Download {name}", exact=True).click()
        assert info.value.suggested_filename == name
        path = into / name
        info.value.save_as(path)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Tab]:  # noqa: F811
    t = Tab(browser, server)
    yield t
    t.close()
    assert t.errors == []


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def gpg_verify(home: Path, path: Path) -> str:
    r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                        "--verify", str(path)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert f"VALIDSIG {TEST_FPR}" in r.stdout
    return r.stdout


def test_a_50_mb_file_gets_a_receipt_that_gpg_and_stampd_verify_accept(
        tab: Tab, server: Server, gnupg: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "release 1.0.tar.gz"
    with open(big, "wb") as f:
        for _ in range(50):
            f.write(os.urandom(1 << 20))
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    shown = tab.stamp(big)
    assert "Stamped" in shown and digest in shown and TEST_FPR in shown, shown
    # The file itself never went to the server: one POST, the digest alone.
    assert [(url.removeprefix(server.url), body) for url, body in tab.posts] == \
        [("v1/stamps", f"sha256={digest}")]
    receipt = tab.download("release 1.0.tar.gz.receipt.asc", tmp_path)
    proof = tab.download("release 1.0.tar.gz.receipt.asc.tlog-proof", tmp_path)
    key = tab.download("server-key.asc", tmp_path)
    assert f"digest: {digest}\n" in receipt.read_text()
    assert proof.read_text().startswith("c2sp.org/tlog-proof@v1\n")
    gpg_verify(gnupg, receipt)
    # stampd verify, offline: the key downloaded from the page, the log key from the server;
    # the proof beside the receipt is found and checked too.
    vkey = fetch(server.url + "tlog/vkey").decode().strip()
    code, out, err = run_cli(capsys, "verify", str(receipt), "--file", str(big), "--key",
                             str(key), "--log-key", vkey)
    assert code == 0, err
    assert f"valid receipt: sha256 {digest}" in out and "matches:" in out
    assert "log:           in the log at index" in out, out
    # The commands the page shows name these files.
    assert "gpg --verify 'release 1.0.tar.gz.receipt.asc'" in shown


def make_release(root: Path) -> Path:
    """A folder with names that sort differently by bytes than by UTF-16, a space, a
    backslash (an escaped manifest line), a subfolder."""
    top = root / "rel"
    (top / "sub").mkdir(parents=True)
    for name, data in [("B.txt", b"B"), ("a b.txt", b"space"), ("é.txt", b"e-acute"),
                       ("\U0001d11e.txt", b"clef"), ("\uff21.txt", b"fullwidth A"),
                       ("back\\slash", b"backslash"), ("sub/z.bin", os.urandom(3000)),
                       ("empty", b"")]:
        (top / name).write_bytes(data)
    return top


def test_a_folder_makes_the_manifest_stampd_stamp_sends(
        tab: Tab, server: Server, gnupg: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    top = make_release(tmp_path)
    shown = tab.stamp(top, folder=True)
    assert "Stamped" in shown and "8 files" in shown, shown
    manifest = tab.download("SHA256SUMS.asc", tmp_path)
    tab.download("SHA256SUMS.asc.tlog-proof", tmp_path)
    key = tab.download("server-key.asc", tmp_path)
    # Byte for byte the body `stampd stamp rel` sends from the folder that holds rel/.
    monkeypatch.chdir(tmp_path)
    files, _ = collect([Path("rel")])
    body = "".join(line + "\n" for line in hash_files(files, "sha256"))
    (url, sent), = tab.posts
    assert url == server.url + "v1/manifests" and sent == body
    text = manifest.read_text()
    assert "\n# lines: 8\n" + body + "-----BEGIN PGP SIGNATURE-----\n" in text
    assert "\n\\" in body  # the backslash's line is escaped, as coreutils does
    gpg_verify(gnupg, manifest)
    check = subprocess.run(["sha256sum", "-c", str(manifest)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK\n") == 8
    vkey = fetch(server.url + "tlog/vkey").decode().strip()
    code, out, err = run_cli(capsys, "verify", "SHA256SUMS.asc", "--dir", ".", "--key",
                             str(key), "--log-key", vkey)
    assert code == 0 and "log:           in the log at index" in out, err + out


def test_several_files_with_sha512(tab: Tab, gnupg: Path, tmp_path: Path) -> None:
    names = ["one.txt", "two.txt", "three.txt"]
    for name in names:
        (tmp_path / name).write_text(name)
    shown = tab.stamp([tmp_path / n for n in names], sha512=True)
    assert "3 files" in shown and "sha512" in shown, shown
    manifest = tab.download("SHA512SUMS.asc", tmp_path)
    text = manifest.read_text()
    assert "# algorithm: sha512\n" in text
    for name in sorted(names):
        assert f"{hashlib.sha512(name.encode()).hexdigest()} *{name}\n" in text
    gpg_verify(gnupg, manifest)
    check = subprocess.run(["sha512sum", "-c", str(manifest)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and check.stdout.count(": OK\n") == 3, check.stdout


def test_a_dropped_file_is_stamped_with_sha512(tab: Tab, server: Server) -> None:
    """A drop (the files of a DataTransfer; a synthetic drop has no entries to walk), one
    file with SHA-512: a digest stamp, ``sha512=<hex>``."""
    tab.page.set_checked("#stamp-sha512", True)
    tab.page.evaluate("""() => {
        const data = new DataTransfer();
        data.items.add(new File(["dropped\\n"], "dropped.txt"));
        document.getElementById("drop").dispatchEvent(
            new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true }));
    }""")
    tab.page.wait_for_selector("body[data-state='done']", timeout=60_000)
    shown = tab.page.inner_text("[data-testid=stamp-result]")
    digest = hashlib.sha512(b"dropped\n").hexdigest()
    assert digest in shown and "dropped.txt.receipt.asc" in shown, shown
    assert tab.posts == [(server.url + "v1/stamps", f"sha512={digest}")]


def live_workers(tab: Tab, want: int) -> int:
    """The page's live hashing and reading workers once there are ``want`` of them, or after
    10 s: the Web Locks each holds while it lives (web/src/hash-worker.js), which the browser
    releases when the worker ends. (Playwright's ``page.workers`` missed a worker's end in
    about one run in five: it listed a terminated worker for good, while no lock was held.)"""
    count = -1
    for _ in range(100):
        held = tab.page.evaluate("async () => (await navigator.locks.query()).held"
                                 ".map((lock) => lock.name)")
        count = sum(1 for name in held if name.startswith("stampd-hash-worker-"))
        if count == want:
            break
        tab.page.wait_for_timeout(100)
    return count


def test_cancel_stops_the_hashing_and_sends_nothing(tab: Tab, server: Server,
                                                    tmp_path: Path) -> None:
    huge = tmp_path / "huge.img"
    with open(huge, "wb") as f:
        f.truncate(8 << 30)  # sparse: long to hash, nothing on disk
    tab.page.set_input_files("[data-testid=stamp-files]", str(huge))
    tab.page.wait_for_function(
        "() => document.getElementById('stamp-progress').value > 0", timeout=30_000)
    assert live_workers(tab, 2) == 2  # the hashing worker and its reading worker
    tab.page.get_by_role("button", name="Cancel").click()
    assert tab.page.get_attribute("body", "data-state") == "cancelled"
    assert "Cancelled: nothing was sent to the server." in tab.page.inner_text("#stamp-status")
    assert live_workers(tab, 0) == 0  # terminated, with its reader: no digest can come
    # The page stamps the next file; the only request it ever sent is that one.
    small = tmp_path / "small.txt"
    small.write_text("after cancel")
    shown = tab.stamp(small)
    digest = hashlib.sha256(b"after cancel").hexdigest()
    assert digest in shown
    assert tab.posts == [(server.url + "v1/stamps", f"sha256={digest}")]


def test_refusals_are_shown_plainly(tab: Tab, server: Server, tmp_path: Path) -> None:
    # Over the per-client hourly budget: 429 with Retry-After, shown with its detail and
    # a button to try again (the digests kept).
    top = tmp_path / "many"
    top.mkdir()
    for i in range(300):
        (top / f"{i:03d}-{'x' * 200}").write_text(str(i))
    shown = tab.stamp(top, folder=True)
    assert "Not stamped" in shown and "the server answered 429" in shown, shown
    assert "Try again in " in shown
    assert tab.page.get_by_role("button", name="Try again").is_visible()
    # Names a manifest cannot hold are refused on the page, before anything is sent.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ok.txt").write_text("ok")
    (bad / "trailing space ").write_text("no")
    shown = tab.stamp(bad, folder=True)
    assert "cannot be put in a manifest" in shown and '"bad/trailing space "' in shown, shown
    assert len(tab.posts) == 1


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``stamp-page-screenshots0`` in pytest's base temporary
    folder (``/tmp/pytest-of-$USER/pytest-current/``, under ``popen-gw*/`` with xdist)."""
    return tmp_path_factory.mktemp("stamp-page-screenshots")


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [320, 1280])
def test_screenshots_width_and_accessibility(browser: Any, server: Server,  # noqa: F811
                                             tmp_path: Path, shots: Path, width: int,
                                             scheme: str, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    with capsys.disabled():
        print(f"\nscreenshots of the stamp page: {shots}/stamp-{width}-{scheme}-*.png")
    # bypass_csp: axe-core is injected as an inline script, which the page's CSP refuses (the
    # other tests run the page under its CSP).
    t = Tab(browser, server, viewport={"width": width, "height": 900}, color_scheme=scheme,
            bypass_csp=True)
    try:
        t.page.screenshot(path=shots / f"stamp-{width}-{scheme}-empty.png", full_page=True)
        long_name = tmp_path / ("a-rather-long-file-name-without-any-spaces-" * 2 + ".tar.gz")
        long_name.write_text("screenshot")
        shown = t.stamp(long_name)
        assert "Stamped" in shown
        t.page.screenshot(path=shots / f"stamp-{width}-{scheme}-stamped.png", full_page=True)
        scroll = t.page.evaluate("() => document.scrollingElement.scrollWidth")
        assert scroll <= width, f"{scroll} px wide at {width}"
        violations = axe_violations(t.page)
        assert violations == [], [(v["id"], v["help"], [n["target"] for n in v["nodes"]])
                                  for v in violations]
        assert t.errors == []
    finally:
        t.close()
