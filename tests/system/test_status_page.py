"""The status page in a real browser (Debian's headless Chromium)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

from tests.helpers import TEST_FPR, Server, log_commits, stamp_tag, start_server, wait_for

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is required for this test (.ci/run installs it)"
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_status_page_in_chromium(seeded_dir: Path, server_factory: list[Server],
                                 tmp_path: Path) -> None:
    server = start_server(seeded_dir, workers=1, commit_interval=2,
                          extra_env={"STAMPD_PEERS": "nobody=http://127.0.0.1:9/",
                                     "STAMPD_TSA": "true", "STAMPD_TLOG": "on"})
    server_factory.append(server)
    for i in range(5):
        stamp_tag(server, f"{i + 1:040x}")
    wait_for(lambda: len(log_commits(seeded_dir)) >= 1, what="a log commit")

    dom = chromium(tmp_path / "p1", "--dump-dom", server.url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert "stampd timestamping server" in page
    assert TEST_FPR in page and "stampd Test Key" in page
    assert 'id="total">5<' in page
    assert page.count("<rect ") == 60  # one bar per minute of the last hour
    assert "stampd log commit 1" in page  # recent log commits
    assert "nobody" in page and "http://127.0.0.1:9/" in page  # peers and their state
    assert "git timestamp --server" in page and "v1/stamps" in page  # how to use it
    # The gpg recipe imports the key before it verifies; the chart's axes have units.
    assert f"curl -sS --fail '{server.url}?request=get-public-key-v1' | gpg --import" in page
    # Every curl of the recipes fails on an error answer (--fail) rather than write it into the
    # receipt, proof, token or certificate file, or pipe it into gpg.
    curls = [line for pre in re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S)
             for line in pre.splitlines() if "curl " in line]
    assert len(curls) == 5 and all(" --fail " in line for line in curls), curls
    assert page.index("gpg --import") < page.index("gpg --verify FILE.receipt.asc")
    assert "stamps per minute (peak " in page and ">60 min ago<" in page and ">now<" in page
    assert "http://" not in page.split("<body>")[0].replace(server.url, "")  # no external assets

    shot = tmp_path / "status.png"
    r = chromium(tmp_path / "p2", f"--screenshot={shot}", "--window-size=1000,1400", server.url)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1000, 1400)
    assert len(data) > 20_000  # a rendered page, not a blank image
