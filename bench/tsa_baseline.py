"""The baseline TSA of the RFC 3161 bench (bench/tsa.py): the simplest time-stamping server an
operator would script instead of running stampd, `openssl ts -reply` run once per request behind a
tiny HTTP wrapper (Python's http.server, one thread per connection, HTTP/1.1 keep-alive).

`make_tsa(dir, key)` makes a throw-away TSA in `dir`: a fresh key (ECDSA P-256 or RSA-3072), a
self-signed certificate with the critical id-kp-timeStamping extended key usage, and an OpenSSL
TSA configuration (default policy, SHA-256/384/512 imprints, signing digest SHA-256, ESSCertIDv2,
accuracy 1 s, the TSA name in the token). Then, as a process of its own::

    python -m bench.tsa_baseline --dir DIR --port PORT

answers `POST /` and `POST /tsr` (Content-Type application/timestamp-query) with what
`openssl ts -reply -queryfile Q -config DIR/tsa.cnf -out R` wrote (200,
application/timestamp-reply), and `GET /tsa.pem` with the certificate.

Serial numbers: `openssl ts -reply` reads the serial file, adds one and writes it back without a
lock, so concurrent replies sharing one file would issue the same serial twice. The wrapper hands
each request a serial of its own instead (a counter under a lock, written to a per-request serial
file named through `$ENV::TSA_SERIAL` in the configuration): the least a correct script must do,
and it costs one small file write per request.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

POLICY = "1.3.6.1.4.1.4146.2.3"  # any OID will do; openssl needs a default policy

KEY_ARGS = {
    "nistp256": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    "rsa3072": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072"],
}

CONFIG = """\
[ tsa ]
default_tsa = tsa_config1

[ tsa_config1 ]
dir = {dir}
serial = $ENV::TSA_SERIAL
crypto_device = builtin
signer_cert = $dir/tsa.pem
certs = $dir/tsa.pem
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = {policy}
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = no
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


def make_tsa(directory: Path, key: str) -> Path:
    """A throw-away TSA in `directory` (key, self-signed certificate, configuration)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    env = dict(os.environ, OPENSSL_CONF="/dev/null")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, env=env, check=True,
                       capture_output=True, timeout=120)

    openssl("genpkey", *KEY_ARGS[key], "-out", "tsa.key")
    openssl("req", "-x509", "-new", "-key", "tsa.key", "-sha256", "-days", "30",
            "-subj", "/CN=openssl ts baseline TSA/O=stampd bench",
            "-addext", "basicConstraints=critical,CA:FALSE",
            "-addext", "keyUsage=critical,digitalSignature,nonRepudiation",
            "-addext", "extendedKeyUsage=critical,timeStamping",
            "-out", "tsa.pem")
    (directory / "tsa.cnf").write_text(CONFIG.format(dir=directory, policy=POLICY))
    (directory / "work").mkdir(mode=0o700, exist_ok=True)
    return directory


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like stampd
    tsa_dir: Path
    serials = itertools.count(1)
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:  # no line per request
        pass

    def answer(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/tsa.pem":
            self.answer(200, "application/pem-certificate-chain",
                        (self.tsa_dir / "tsa.pem").read_bytes())
        else:
            self.answer(404, "text/plain", b"not found\n")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        query = self.rfile.read(length)
        if self.path not in ("/", "/tsr") or \
                self.headers.get("Content-Type") != "application/timestamp-query":
            self.answer(415, "text/plain", b"application/timestamp-query only\n")
            return
        with self.lock:
            serial = next(self.serials)
        with tempfile.TemporaryDirectory(dir=self.tsa_dir / "work") as tmp:
            q, r, s = (Path(tmp) / n for n in ("q.tsq", "r.tsr", "serial"))
            q.write_bytes(query)
            s.write_text(f"{serial:x}\n" if len(f"{serial:x}") % 2 == 0 else f"0{serial:x}\n")
            p = subprocess.run(
                ["openssl", "ts", "-reply", "-queryfile", str(q), "-config",
                 str(self.tsa_dir / "tsa.cnf"), "-out", str(r)],
                env=dict(os.environ, TSA_SERIAL=str(s)), capture_output=True, timeout=30,
                check=False)
            if p.returncode != 0 or not r.exists():
                self.answer(500, "text/plain", p.stderr[-500:])
                return
            self.answer(200, "application/timestamp-reply", r.read_bytes())


class Wrapper(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        # wrk closes its connections with requests in flight when a run ends.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tsa_baseline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="a TSA made by make_tsa()")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    Handler.tsa_dir = args.dir.resolve()
    server = Wrapper((args.host, args.port), Handler)
    print(f"listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
