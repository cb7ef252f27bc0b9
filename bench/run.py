"""Side-by-side benchmark: stampd against zeitgitterd 1.2.0 on this machine, driven by wrk.

Run from the repository root::

    python -m bench.run            # or: make bench

Everything runs on 127.0.0.1 in a fresh temporary directory (``/tmp/bn*``): each server gets its
own fresh key of the key type under test, zeitgitterd runs with no upstream timestamping
servers, no pushing and no mail. wrk drives both servers with ``bench/stamp.lua`` (distinct
commit ids, every response checked for status and shape, a sample of response bodies written to
disk); the sampled bodies are checked like the real ``git timestamp`` client checks them and
their signatures verified with ``gpg --verify`` against the key the server publishes.

Then, stampd only (zeitgitterd has no SSH and serves one key): one stampd holding an ed25519
OpenPGP key and SSH keys (ed25519, ecdsa-p256), each with its own workers; tag stamps asking for
each SSH key, and both the OpenPGP and the SSH ed25519 key at once (two wrk processes). Sampled
SSH signatures are verified with ``ssh-keygen -Y verify -n git`` against the allowed-signers
line the server publishes for the key asked for.

The table goes to stdout, progress lines to stderr. Exit status: 0 when every response was
right, 1 when any response was wrong (or a sampled signature did not verify), 2 when the bench
itself could not run. Missed performance targets are reported, not turned into a failure
(unless ``--strict``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.parse
from dataclasses import asdict, dataclass, field
from http.client import HTTPConnection
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LUA = HERE / "stamp.lua"
BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Chosen from a sweep on the 2-core bench machine (see bench/README.md): agents slightly above
# the number of cores and parallel signatures slightly above the number of agents, as the
# zeitgitterd sample configuration recommends, was among the best for ed25519 and rsa4096.
ZG_AGENTS = 3
ZG_PARALLEL = 4

CONCURRENCY = (1, 16, 64)
# (key type, modes, concurrencies); rsa4096 is bounded to keep the run under 5 minutes.
PLAN: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = (
    ("ed25519", ("tag", "branch"), CONCURRENCY),
    ("rsa4096", ("tag",), CONCURRENCY),
    ("rsa4096", ("branch",), (16,)),
)
SCALING_CONNS = 16
# stampd only (zeitgitterd has no SSH and serves one key): one stampd with an ed25519 OpenPGP
# primary key and these extra SSH keys, each key with --workers workers of its own.
SSH_KEYS = ("ssh:ed25519", "ssh:ecdsa-p256")
SSH_PLAN: tuple[tuple[str, str, tuple[int, ...]], ...] = (  # (/v1/keys id, mode, concurrencies)
    ("ssh-ed25519", "tag", (1, 16)),
    ("ssh-ecdsa-p256", "tag", (16,)),
)
# Two keys at once: two wrk processes at the same time, TWO_KEYS_CONNS connections each, one
# asking for the primary OpenPGP key and one for the SSH ed25519 key (/v1/keys id, row name).
TWO_KEYS = (("primary", "pgp-ed25519"), ("ssh-ed25519", "ssh-ed25519"))
TWO_KEYS_CONNS = 8
TWO_KEYS_ROW = "2 keys"
MAX_OBJECT = 8000
CLOCK_SKEW = 30

T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The bench itself could not run (exit status 2)."""


# --------------------------------------------------------------------------------------------
# Processes


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    cmdline: bytes
    ticks: int  # utime + stime + cutime + cstime (reaped children count for their parent)

    @property
    def exe(self) -> bytes:
        return os.path.basename(self.cmdline.split(b"\0", 1)[0])


def process_table(marker: bytes | None = None) -> dict[int, ProcInfo]:
    """Every live process; with `marker`, only those whose cmdline or environ contains it."""
    table: dict[int, ProcInfo] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        try:
            rest = stat[stat.rindex(b")") + 2:].split()
        except ValueError:
            continue
        if rest[0] == b"Z":  # zombie: already dead, nothing to stop or count
            continue
        cmdline = _read(f"/proc/{name}/cmdline")
        if marker is not None and marker not in cmdline and marker not in _read(
                f"/proc/{name}/environ"):
            continue
        ticks = sum(int(x) for x in rest[11:15])
        table[int(name)] = ProcInfo(int(name), int(rest[1]), cmdline, ticks)
    return table


def cpu_busy() -> float:
    """Seconds of CPU time the whole machine has spent busy (all cores), from /proc/stat."""
    f = [int(x) for x in _read("/proc/stat").split(b"\n", 1)[0].split()[1:9]]
    return (sum(f) - f[3] - f[4]) / CLK_TCK  # minus idle and iowait


def kill_pids(pids: list[int], what: str, grace: float = 3.0) -> None:
    """SIGTERM each pid, wait up to `grace` seconds, SIGKILL the survivors."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        progress(f"{what}: pid {pid} ignored SIGTERM, sending SIGKILL")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def sweep(marker: Path, what: str) -> None:
    """Stop every process left over that mentions `marker` (a directory of this bench) in its
    command line or environment: gpg-agents, workers whose parent died."""
    m = (str(marker).rstrip("/") + "/").encode()
    for _ in range(3):
        pids = sorted(process_table(m))
        if not pids:
            return
        table = process_table()
        names = ", ".join(f"{pid} ({table[pid].exe.decode(errors='replace')})"
                          if pid in table else str(pid) for pid in pids)
        progress(f"{what}: stopping leftover processes {names}")
        kill_pids(pids, what)


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
        input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        p = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, env=env,
                           check=False, stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{argv[0]} took longer than {timeout}s: {argv}") from e
    if check and p.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed ({p.returncode}): "
                         f"{p.stderr.decode(errors='replace')[-800:]}")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Keys and verification


@dataclass
class ServerKey:
    fingerprint: str  # 40 hex (OpenPGP) or SHA256:... (SSH)
    uid: str  # the user id the server writes into stamps made with this key
    home: Path  # a GNUPGHOME holding only the server's public key, for gpg --verify
    format: str = "openpgp"  # or "ssh"
    signers: Path | None = None  # SSH: an allowed-signers file holding only this key's line
    principal: str = ""  # SSH: the principal of that line (its first word)

    @property
    def armor(self) -> str:
        return "SSH" if self.format == "ssh" else "PGP"


@dataclass
class Target:
    """What the requests of a cell ask for (an extra form field choosing the key) and the key
    every answer must be signed by."""

    key: ServerKey
    field: str = ""  # URL-encoded, e.g. "key=SHA256%3A..."; empty: the server's default key


def gpg_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GNUPGHOME"] = str(home)
    return env


def make_home(path: Path) -> Path:
    path.mkdir(parents=True)
    os.chmod(path, 0o700)
    return path


def import_public_key(armored: bytes, home: Path) -> ServerKey:
    make_home(home)
    run(["gpg", "--homedir", str(home), "--batch", "--import"], input=armored, timeout=30,
        env=gpg_env(home))
    out = run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-keys"],
              timeout=30, env=gpg_env(home)).stdout.decode()
    fpr = uid = None
    for line in out.splitlines():
        f = line.split(":")
        if f[0] == "fpr" and fpr is None:
            fpr = f[9]
        elif f[0] == "uid" and uid is None:
            uid = f[9].replace("\\x3a", ":")
    if not fpr or not uid:
        raise BenchError(f"cannot read the published key:\n{out}")
    return ServerKey(fpr, uid, home)


def split_object(text: str, mode: str, prefix: str, uid: str,
                 armor: str = "PGP") -> tuple[str, str, int]:
    """Check a stamp like `git timestamp` does; return (signed payload, armored signature,
    object time). Raises ValueError with the reason. `armor` is PGP (an empty line after the
    BEGIN line: no armor headers) or SSH (git's SSH signatures: base64 right after it)."""
    if len(text) > MAX_OBJECT:
        raise ValueError(f"object longer than {MAX_OBJECT} characters")
    if any(not (" " <= c <= "~" or c == "\n") for c in text):
        raise ValueError("object contains characters other than printable ASCII and newline")
    begin = f"-----BEGIN {armor} SIGNATURE-----"
    if text.count("-----BEGIN ") != 1 or text.count(begin) != 1:
        raise ValueError(f"not exactly one {armor} signature block")
    tail = f"-----END {armor} SIGNATURE-----"
    # Where the signature starts: PGP has an empty line after BEGIN (and no armor headers),
    # SSH (as git writes it) the base64 right after it.
    b64 = "[A-Za-z0-9+/]"
    tag_start = rf"\n{begin}\n\n{b64}" if armor == "PGP" else rf"\n{begin}\n{b64}"
    commit_start = (rf"gpgsig {begin}\n \n {b64}" if armor == "PGP"
                    else rf"gpgsig {begin}\n {b64}")
    uid_re = re.escape(uid)
    ours = rf"{prefix}[0-9a-f]{{{40 - len(prefix)}}}"
    if mode == "tag":
        m = re.match(rf"object {ours}\ntype commit\ntag [_a-zA-Z][-._a-zA-Z0-9]*\n"
                     rf"tagger {uid_re} (\d+) \+0000\n\n", text)
        if not m:
            raise ValueError("tag header is not object/type/tag/tagger <uid> <time> +0000")
        at = text.rfind(f"\n{begin}\n")
        if at < 0 or not re.match(tag_start, text[at:]):
            raise ValueError("armor headers present or signature not at a line start")
        payload, sig = text[:at + 1], text[at + 1:]
        if not sig.endswith(tail + "\n"):
            raise ValueError("object does not end with the signature")
        return payload, sig, int(m.group(1))
    m = re.match(rf"tree [0-9a-f]{{40}}\n(?:parent [0-9a-f]{{40}}\n)?parent {ours}\n"
                 rf"author {uid_re} (\d+) \+0000\ncommitter {uid_re} (\d+) \+0000\n"
                 + commit_start, text)
    if not m:
        raise ValueError("commit header is not tree/parent/author/committer/gpgsig")
    if m.group(1) != m.group(2):
        raise ValueError("author and committer time differ")
    header, sep, message = text.partition("\n\n")
    if not sep:
        raise ValueError("commit has no message")
    kept: list[str] = []
    sig_lines: list[str] = []
    in_sig = False
    for line in header.split("\n"):
        if line.startswith("gpgsig "):
            if sig_lines:
                raise ValueError("more than one gpgsig header")
            in_sig = True
            sig_lines.append(line[len("gpgsig "):])
        elif in_sig and line.startswith(" "):
            sig_lines.append(line[1:])
        else:
            in_sig = False
            kept.append(line)
    if sig_lines[-1] != tail:
        raise ValueError("gpgsig does not end with the armor tail")
    return "\n".join(kept) + "\n\n" + message, "\n".join(sig_lines) + "\n", int(m.group(1))


def verify_sample(path: Path, mode: str, prefix: str, key: ServerKey) -> str | None:
    """None when the sampled response at `path` is a valid stamp, else the reason."""
    try:
        text = path.read_bytes().decode("ascii")
        payload, sig, t_obj = split_object(text, mode, prefix, key.uid, key.armor)
    except (UnicodeDecodeError, ValueError) as e:
        return f"{path.name}: {e}"
    t_recv = path.stat().st_mtime
    if abs(t_obj - t_recv) > CLOCK_SKEW:
        return f"{path.name}: object time {t_obj} is {t_obj - t_recv:+.0f}s from receipt"
    pfile, sfile = path.with_suffix(".payload"), path.with_suffix(".sig")
    pfile.write_text(payload)
    sfile.write_text(sig)
    if key.format == "ssh":
        return verify_ssh(path.name, payload, sfile, key)
    p = run(["gpg", "--homedir", str(key.home), "--batch", "--status-fd", "1",
             "--trust-model", "always", "--verify", str(sfile), str(pfile)],
            timeout=30, env=gpg_env(key.home), check=False)
    valid = [ln.split() for ln in p.stdout.decode(errors="replace").splitlines()
             if ln.startswith("[GNUPG:] VALIDSIG ")]
    if p.returncode != 0 or len(valid) != 1:
        return f"{path.name}: gpg --verify failed: {p.stderr.decode(errors='replace')[-300:]}"
    v = valid[0]
    # VALIDSIG <fpr> <date> <sig-time> <expire> <version> <reserved> <pk-algo> <hash-algo>
    #          <sig-class> <primary-fpr>
    if v[11].upper() != key.fingerprint.upper():
        return f"{path.name}: signed by {v[11]}, the server publishes {key.fingerprint}"
    if v[10] != "00":
        return f"{path.name}: signature class {v[10]}, not a binary document signature"
    if v[9] not in ("8", "9", "10"):
        return f"{path.name}: hash algorithm {v[9]} is weaker than SHA-256"
    if abs(int(v[4]) - t_recv) > CLOCK_SKEW:
        return f"{path.name}: signature time {v[4]} is {int(v[4]) - t_recv:+.0f}s from receipt"
    return None


def verify_ssh(name: str, payload: str, sfile: Path, key: ServerKey) -> str | None:
    """`ssh-keygen -Y verify -n git` (what `git verify-tag` runs with gpg.format=ssh) against
    an allowed-signers file holding only the key this cell asked for. An SSH signature carries
    no time: the object time, checked by the caller, is the stamp."""
    assert key.signers is not None
    p = run(["ssh-keygen", "-Y", "verify", "-n", "git", "-f", str(key.signers),
             "-I", key.principal, "-s", str(sfile)], input=payload.encode(), timeout=30,
            check=False)
    out = (p.stdout + p.stderr).decode(errors="replace")
    if p.returncode != 0:
        return f"{name}: ssh-keygen -Y verify failed ({p.returncode}): {out.strip()[-300:]}"
    m = re.search(r'^Good "git" signature for (\S+) with \S+ key (SHA256:\S+)$', out, re.M)
    if not m:
        return f"{name}: ssh-keygen -Y verify said: {out.strip()[-300:]}"
    if m.group(1) != key.principal or m.group(2) != key.fingerprint:
        return f"{name}: signed for {m.group(1)} by {m.group(2)}, asked for {key.fingerprint}"
    return None


# --------------------------------------------------------------------------------------------
# One gpg-agent's raw signing rate (the ceiling a worker can reach)


class Assuan:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.f = self.sock.makefile("rb")
        self._answer()

    def _answer(self) -> None:
        while True:
            line = self.f.readline()
            if not line:
                raise ConnectionError("gpg-agent closed the connection")
            if line.startswith(b"OK"):
                return
            if line.startswith((b"ERR", b"INQUIRE")):
                raise BenchError(f"gpg-agent: {line.decode(errors='replace').strip()}")

    def command(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")
        self._answer()

    def close(self) -> None:
        self.f.close()
        self.sock.close()


@dataclass
class AgentRates:
    one: float  # signatures/s from one agent
    two: float  # from two agents at once
    background: tuple[float, float]  # cores used by other processes meanwhile


def agent_rates(secret_key: Path, root: Path, seconds: float) -> AgentRates:
    """Signatures per second from one gpg-agent, then from two agents at once, each driven
    over one Assuan connection with SIGKEY/SETHASH/PKSIGN (no HTTP, no OpenPGP packet)."""
    socks: list[tuple[str, str]] = []
    for i in range(2):
        home = make_home(root / f"a{i}")
        env = gpg_env(home)
        run(["gpg", "--homedir", str(home), "--batch", "--import", str(secret_key)],
            timeout=60, env=env)
        out = run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--with-keygrip",
                   "--list-secret-keys"], timeout=30, env=env).stdout.decode()
        grip = next(ln.split(":")[9] for ln in out.splitlines() if ln.startswith("grp:"))
        run(["gpg-connect-agent", "--homedir", str(home), "/bye"], timeout=30, env=env)
        path = run(["gpgconf", "--homedir", str(home), "--list-dirs", "agent-socket"],
                   timeout=30, env=env).stdout.decode().strip()
        socks.append((path, grip))

    def drive(path: str, grip: str, until: float, counts: list[int]) -> None:
        a = Assuan(path)
        try:
            n = 0
            while time.monotonic() < until:
                digest = hashlib.sha256(os.urandom(16)).hexdigest()
                a.command(f"SIGKEY {grip}")
                a.command(f"SETHASH --hash=sha256 {digest}")
                a.command("PKSIGN")
                n += 1
            counts.append(n)
        finally:
            a.close()

    marker = (str(root) + "/").encode()

    def used() -> float:  # CPU of the agents and of this process (the Assuan clients)
        me = resource.getrusage(resource.RUSAGE_SELF)
        agents = sum(p.ticks for p in process_table(marker).values()) / CLK_TCK
        return agents + me.ru_utime + me.ru_stime

    rates: list[float] = []
    background: list[float] = []
    for n_agents in (1, 2):
        counts: list[int] = []
        used0, busy0 = used(), cpu_busy()
        start = time.monotonic()
        threads = [threading.Thread(target=drive, args=(*socks[i], start + seconds, counts))
                   for i in range(n_agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        elapsed = time.monotonic() - start
        if len(counts) != n_agents:
            raise BenchError("an agent-rate thread failed")
        rates.append(sum(counts) / elapsed)
        background.append(max(0.0, cpu_busy() - busy0 - (used() - used0)) / elapsed)
    return AgentRates(rates[0], rates[1], (background[0], background[1]))


# --------------------------------------------------------------------------------------------
# Servers


class Server:
    label = "server"
    children_grace = 0.0  # seconds the server's children get to exit on their own

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.dir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "server.log"
        self.log_size_at_stop: int | None = None  # where the log stood when we sent SIGTERM
        self.key: ServerKey | None = None

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def start(self) -> None:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n"
                                 f"{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if self._ready():
                    return
            time.sleep(0.1)
        raise BenchError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")

    def fetch_key(self, home: Path) -> ServerKey:
        """Import the key the server publishes into `home` (outside the server's directory,
        so its leftovers are not the server's)."""
        status, body = http_get(self.port, "/?request=get-public-key-v1")
        if status != 200:
            raise BenchError(f"{self.name}: get-public-key-v1 answered {status}")
        self.key = import_public_key(body, home)
        return self.key

    def log_tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.log_size_at_stop = self.log.stat().st_size if self.log.exists() else 0
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    progress(f"{self.name}: pid {self.proc.pid} ignored SIGTERM, SIGKILL")
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            # Give the server's own children a moment to finish their orderly shutdown.
            marker = (str(self.dir) + "/").encode()
            deadline = time.monotonic() + self.children_grace
            while process_table(marker) and time.monotonic() < deadline:
                time.sleep(0.1)
        sweep(self.dir, self.name)

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by this server's processes, by role."""
        if self.proc is None:
            return {}
        marker = (str(self.dir) + "/").encode()
        table = process_table()
        tree = {self.proc.pid}
        grew = True
        while grew:
            grew = False
            for p in table.values():
                if p.pid not in tree and (p.ppid in tree or marker in p.cmdline):
                    tree.add(p.pid)
                    grew = True
        out: dict[str, float] = {}
        for pid in tree:
            p = table.get(pid)
            if p is None:
                continue
            role = self.role(p)
            out[role] = out.get(role, 0.0) + p.ticks / CLK_TCK
        return out

    def role(self, p: ProcInfo) -> str:
        if p.exe in (b"gpg-agent", b"ssh-agent"):
            return "agents"
        return "server" if self.proc is not None and p.pid == self.proc.pid else "other"

    def problems(self) -> list[str]:
        """Log lines that look like trouble, written before the server was told to stop."""
        if not self.log.exists():
            return []
        data = self.log.read_bytes()[:self.log_size_at_stop]
        pat = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|Exception")
        return [ln for ln in data.decode(errors="replace").splitlines() if pat.search(ln)]


class Stampd(Server):
    label = "stampd"
    children_grace = 5.0  # the supervisor stops its workers and their agents itself

    def __init__(self, name: str, workdir: Path, data_dir: Path, key_algo: str,
                 workers: int, extra_keys: tuple[str, ...] = (), extra_workers: int = 1) -> None:
        super().__init__(name, workdir)
        self.data_dir = data_dir
        self.key_algo = key_algo
        self.workers = workers  # for the primary OpenPGP key
        self.extra_keys = extra_keys  # e.g. ("ssh:ed25519", "ssh:ecdsa-p256")
        self.extra_workers = extra_workers  # for each extra key
        self.keys: dict[str, ServerKey] = {}  # by /v1/keys id, after fetch_keys()

    @property
    def all_workers(self) -> int:
        return self.workers + len(self.extra_keys) * self.extra_workers

    def start(self) -> None:
        rt = self.dir / "rt"
        tmp = self.dir / "tmp"
        rt.mkdir(mode=0o700, exist_ok=True)
        tmp.mkdir(mode=0o700, exist_ok=True)
        env = dict(os.environ)
        env.update(STAMPD_KEY_ALGO=self.key_algo, STAMPD_RUNTIME_DIR=str(rt),
                   STAMPD_LOG_LEVEL="WARNING", TMPDIR=str(tmp), GNUPGHOME=str(self.dir / "g"),
                   STAMPD_EXTRA_KEYS=",".join(self.extra_keys),
                   STAMPD_EXTRA_KEY_WORKERS=str(self.extra_workers))
        self._spawn([str(BIN / "stampd"), "serve", "--host", "127.0.0.1",
                     "--port", str(self.port), "--data-dir", str(self.data_dir),
                     "--workers", str(self.workers), "--commit-interval", "3600"], env)

    def _ready(self) -> bool:
        status, body = http_get(self.port, "/readyz", timeout=2)
        # Every worker connected: the primary key's and each extra key's.
        return status == 200 and len(json.loads(body).get("workers", [])) == self.all_workers

    def fetch_keys(self, home: Path) -> dict[str, ServerKey]:
        """Every key from GET /v1/keys, by id: the primary imported into a GNUPGHOME like
        fetch_key(), each SSH key with an allowed-signers file holding only its own line of
        GET /v1/keys/allowed_signers (so a signature by another key of the server fails)."""
        primary = self.fetch_key(home / "primary")
        status, body = http_get(self.port, "/v1/keys")
        if status != 200:
            raise BenchError(f"{self.name}: GET /v1/keys answered {status}")
        keys = json.loads(body)["keys"]
        status, signers = http_get(self.port, "/v1/keys/allowed_signers")
        if status != 200:
            raise BenchError(f"{self.name}: GET /v1/keys/allowed_signers answered {status}")
        self.keys = {}
        for k in keys:
            if k["primary"]:
                if k["fingerprint"].upper() != primary.fingerprint.upper():
                    raise BenchError(f"{self.name}: /v1/keys says the primary key is "
                                     f"{k['fingerprint']}, get-public-key-v1 {primary.fingerprint}")
                self.keys[k["id"]] = primary
            elif k["format"] == "ssh":
                blob = k["public_key"].split()[1]
                line = next((ln for ln in signers.decode().splitlines()
                             if blob in ln.split()), None)
                if line is None:
                    raise BenchError(f"{self.name}: key {k['id']} is not in "
                                     "/v1/keys/allowed_signers")
                d = make_home(home / k["id"])
                (d / "allowed_signers").write_text(line + "\n")
                self.keys[k["id"]] = ServerKey(k["fingerprint"], primary.uid, d, "ssh",
                                               d / "allowed_signers", line.split()[0])
        return self.keys

    def role(self, p: ProcInfo) -> str:
        if b"workers.worker" in p.cmdline:
            return "workers"
        if b"workers.pool" in p.cmdline:
            return "pool"
        if self.proc is not None and p.pid == self.proc.pid:
            return "http"
        return super().role(p)


class Zeitgitterd(Server):
    label = "zeitgitterd"

    def __init__(self, name: str, workdir: Path, key_algo: str, agents: int,
                 parallel: int) -> None:
        super().__init__(name, workdir)
        self.key_algo = key_algo
        self.agents = agents
        self.parallel = parallel
        self.gnupg_home = workdir / "gh"
        self.keygen: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = gpg_env(self.gnupg_home)
        env["HOME"] = str(self.dir)  # no ~/zeitgitter.conf, no ~/.gitconfig from the user
        for k in list(env):
            if k.startswith("ZEITGITTER_"):
                del env[k]
        return env

    def start_keygen(self) -> None:
        """zeitgitterd itself only creates ed25519 keys; make a fresh key of the type under
        test for it the way an operator would."""
        make_home(self.gnupg_home)
        self.keygen = subprocess.Popen(
            ["gpg", "--homedir", str(self.gnupg_home), "--batch", "--passphrase", "",
             "--quick-gen-key", "Zeitgitter Bench <zeitgitter@localhost>", self.key_algo,
             "sign", "never"],
            env=self.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)

    def start(self) -> None:
        assert self.keygen is not None
        try:
            _, err = self.keygen.communicate(timeout=120)
        except subprocess.TimeoutExpired as e:
            self.keygen.kill()
            raise BenchError("gpg key generation for zeitgitterd took over 120 s") from e
        if self.keygen.returncode != 0:
            raise BenchError(f"gpg --quick-gen-key failed: {err.decode(errors='replace')}")
        out = run(["gpg", "--homedir", str(self.gnupg_home), "--batch", "--with-colons",
                   "--list-secret-keys"], timeout=30, env=self.env()).stdout.decode()
        fpr = next(ln.split(":")[9] for ln in out.splitlines() if ln.startswith("fpr:"))
        # Commit once a day, half a day from now: never during the bench.
        offset = int(time.time() + 43200) % 86400 or 1
        self._spawn([
            str(BIN / "zeitgitterd"),
            "--own-url", self.url, "--owner", "bench", "--contact", "bench",
            "--country", "nowhere", "--keyid", fpr,
            "--gnupg-home", str(self.gnupg_home), "--repository", str(self.dir / "repo"),
            "--listen-address", "127.0.0.1", "--listen-port", str(self.port),
            "--upstream-timestamp=", "--push-repository=",
            "--commit-interval", "1d", "--commit-offset", f"{offset}s",
            "--debug-level", "WARN",
            "--number-of-gpg-agents", str(self.agents),
            "--max-parallel-signatures", str(self.parallel),
        ], self.env())

    def _ready(self) -> bool:
        status, _ = http_get(self.port, "/?request=get-public-key-v1", timeout=2)
        return status == 200

    def role(self, p: ProcInfo) -> str:
        return "gpg" if p.exe in (b"gpg", b"gpg2") else super().role(p)

    def problems(self) -> list[str]:
        # zeitgitterd logs every request and prints a traceback for each connection wrk
        # closes at the end of a run (ConnectionResetError, BrokenPipeError); those say
        # nothing about the stamps. Keep the final line of any other traceback.
        if not self.log.exists():
            return []
        data = self.log.read_bytes()[:self.log_size_at_stop].decode(errors="replace")
        benign = ("ConnectionResetError", "BrokenPipeError")
        return [ln for ln in data.splitlines()
                if re.match(r"^[A-Za-z_.]+(Error|Exception)\b", ln)
                and not ln.startswith(benign)]


# --------------------------------------------------------------------------------------------
# Profile (--profile): py-spy on the stampd HTTP process and one worker under load


def summarize_profile(raw: Path, top: int = 18) -> list[str]:
    """Self and inclusive shares of the functions in a py-spy raw (collapsed) profile."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            incl_n[f] = incl_n.get(f, 0) + n
    if not total:
        return ["  (no samples)"]
    generic = re.compile(r"^(<module>|main|run|cmd_serve|asyncio_run|Server\.run|Runner\.run|"
                         r"Thread\.|_WorkItem\.run|_worker|thread_run|Loop|run_until|"
                         r"run_forever|Handle__run|task_step|uv_)")
    out = [f"  {total} samples holding the GIL; self time (where the CPU is spent):"]
    for f, n in sorted(self_n.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"    {100 * n / total:5.1f}%  {f}")
    out.append("  inclusive (time in the function and what it calls):")
    shown = 0
    for f, n in sorted(incl_n.items(), key=lambda kv: -kv[1]):
        if generic.match(f):
            continue
        out.append(f"    {100 * n / total:5.1f}%  {f}")
        shown += 1
        if shown == top:
            break
    return out


def py_spy() -> str | None:
    exe = BIN / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


# --------------------------------------------------------------------------------------------
# Measurements


@dataclass
class Cell:
    key: str
    mode: str
    conns: int
    server: str
    requests: int = 0
    seconds: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    bad: int = 0
    socket_errors: int = 0
    first_bad: str = ""
    samples: int = 0
    sample_failures: list[str] = field(default_factory=list)
    wrk_cpu: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    machine_cpu: float = 0.0  # CPU seconds the whole machine was busy during the cell
    skipped: str = ""
    # Several wrk processes at once (two keys served at once): one cell per process; this
    # cell then holds their sums (requests, wrong answers, CPU) and the longest duration.
    parts: list[Cell] = field(default_factory=list)

    @property
    def rate(self) -> float:
        if self.parts:
            return sum(p.rate for p in self.parts)
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def background(self) -> float:
        """Cores used by everything else on the machine during the cell (other jobs, the idle
        peer server): CPU the server under test could not have."""
        if not self.seconds:
            return 0.0
        return max(0.0, self.machine_cpu - sum(self.cpu.values()) - self.wrk_cpu) / self.seconds

    @property
    def wrong(self) -> int:
        return self.bad + self.socket_errors + len(self.sample_failures) + (
            0 if self.requests or self.skipped else 1)


class Bench:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.cells: list[Cell] = []
        self.agent: dict[str, AgentRates] = {}
        self.servers: list[Server] = []
        self.seq = 0
        self.nonce = os.urandom(5).hex()
        self.deadline = T0 + args.budget
        self.missed = 0
        self.profile: list[str] = []
        self.idle_load = 0.0

    # -- bookkeeping

    def cell_time(self) -> float:
        return self.args.warmup + self.args.duration + 3.0

    def have_time(self, cells: int = 1, extra: float = 0.0) -> bool:
        return time.monotonic() + cells * self.cell_time() + extra < self.deadline

    def prefix(self) -> str:
        self.seq += 1
        return f"{self.nonce}{self.seq:012x}"  # 22 hex digits

    def wrk(self, server: Server, mode: str, conns: int, seconds: int,
            prefix: str, sample_dir: Path | None,
            target: Target | None = None) -> tuple[dict[str, object], float]:
        results, cpu = self.wrk_many(server, mode, seconds, [(conns, prefix, sample_dir, target)])
        return results[0], cpu

    def wrk_many(self, server: Server, mode: str, seconds: int,
                 runs: list[tuple[int, str, Path | None, Target | None]]
                 ) -> tuple[list[dict[str, object]], float]:
        """Run one wrk per (connections, prefix, sample directory, target) at the same time;
        return each one's BENCH-RESULT and the CPU seconds all of them used."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        procs: list[subprocess.Popen[bytes]] = []
        outs: list[tuple[int, str, str]] = []
        try:
            for conns, prefix, sample_dir, target in runs:
                threads = 1 if conns <= 16 else 2
                argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s",
                        "-s", str(LUA), server.url, "--", mode, prefix,
                        "-" if sample_dir is None else str(sample_dir) + "/"]
                if target is not None:
                    argv += [target.key.armor, target.field]
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            deadline = time.monotonic() + seconds + 30
            for p in procs:
                try:
                    out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as e:
                    raise BenchError(f"wrk took longer than {seconds + 30}s") from e
                outs.append((p.returncode, out.decode(errors="replace"),
                             err.decode(errors="replace")))
        finally:
            for p in procs:
                if p.poll() is None:
                    kill_pids([p.pid], "wrk")
                    p.wait(timeout=10)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        results = []
        for rc, out, err in outs:
            line = next((ln for ln in out.splitlines() if ln.startswith("BENCH-RESULT ")), None)
            if rc != 0 or line is None:
                raise BenchError(f"wrk failed ({rc}): {out[-500:]}{err[-500:]}")
            results.append(json.loads(line.split(" ", 1)[1]))
        return results, cpu

    def measure(self, server: Server, key: str, mode: str, conns: int, label: str,
                target: Target | None = None) -> Cell:
        cell = Cell(key, mode, conns, label)
        self.cells.append(cell)
        assert server.key is not None
        return self.run_cell(server, cell, [(cell, target or Target(server.key))])

    def measure_together(self, server: Server, key: str, mode: str, label: str,
                         parts: list[tuple[str, int, Target]]) -> Cell:
        """One cell of several wrk processes at once, each asking for its own key (name,
        connections, target); the rows of the table show the total and each part."""
        cell = Cell(key, mode, sum(conns for _, conns, _ in parts), label)
        cell.parts = [Cell(name, mode, conns, label) for name, conns, _ in parts]
        self.cells.append(cell)
        return self.run_cell(server, cell, [(c, t) for c, (_, _, t) in zip(cell.parts, parts,
                                                                            strict=True)])

    def run_cell(self, server: Server, cell: Cell, parts: list[tuple[Cell, Target]]) -> Cell:
        key, mode, conns, label = cell.key, cell.mode, cell.conns, cell.server
        what = f"{label:<12} {key:<14} {mode:<6} c={conns:<3}"
        if not self.have_time():
            cell.skipped = "time budget"
            for p, _ in parts:
                p.skipped = cell.skipped
            progress(f"skip {what}: out of time budget")
            return cell
        progress(f"{what} warm-up + {self.args.duration}s"
                 + (f" ({' + '.join(f'{p.key} c={p.conns}' for p, _ in parts)} at once)"
                    if cell.parts else ""))
        if self.args.warmup > 0:
            warm, _ = self.wrk_many(server, mode, self.args.warmup,
                                    [(p.conns, self.prefix(), None, t) for p, t in parts])
            for (p, _), res in zip(parts, warm, strict=True):
                self.count(p, res)
        runs: list[tuple[int, str, Path | None, Target | None]] = []
        for p, t in parts:
            name = f"{len(self.cells):03d}-{label}-{key}-{mode}-{conns}"
            if cell.parts:
                name += f"-{p.key}"
            sample_dir = self.root / "samples" / name.replace(" ", "")
            sample_dir.mkdir(parents=True)
            runs.append((p.conns, self.prefix(), sample_dir, t))
        cpu0, busy0 = server.cpu(), cpu_busy()
        results, wrk_cpu = self.wrk_many(server, mode, self.args.duration, runs)
        cpu1, busy1 = server.cpu(), cpu_busy()
        cell.machine_cpu = busy1 - busy0
        cell.wrk_cpu = wrk_cpu
        cell.cpu = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
        for (p, target), res, (_, prefix, sample_dir, _) in zip(parts, results, runs,
                                                                strict=True):
            self.count(p, res)
            p.requests = int(res["requests"])  # type: ignore[call-overload]
            p.seconds = int(res["duration_us"]) / 1e6  # type: ignore[call-overload]
            p.p50_ms = int(res["p50_us"]) / 1000  # type: ignore[call-overload]
            p.p99_ms = int(res["p99_us"]) / 1000  # type: ignore[call-overload]
            assert sample_dir is not None
            for path in sorted(sample_dir.glob("*.obj")):
                p.samples += 1
                reason = verify_sample(path, mode, prefix, target.key)
                if reason:
                    p.sample_failures.append(reason)
            if p.samples == 0 and p.requests:
                p.sample_failures.append("no response body was sampled")
            if cell.parts:
                self.report_cell(p, f"  {p.key:<12} c={p.conns:<3}")
        if cell.parts:
            ps = cell.parts
            cell.requests = sum(p.requests for p in ps)
            cell.seconds = max(p.seconds for p in ps)
            cell.bad = sum(p.bad for p in ps)
            cell.socket_errors = sum(p.socket_errors for p in ps)
            cell.samples = sum(p.samples for p in ps)
            cell.sample_failures = [f"{p.key}: {r}" for p in ps for r in p.sample_failures]
            cell.first_bad = next((f"{p.key}: {p.first_bad}" for p in ps if p.first_bad), "")
        self.report_cell(cell, what)
        return cell

    @staticmethod
    def report_cell(cell: Cell, what: str) -> None:
        status = "ok" if not cell.wrong else f"{cell.wrong} WRONG ({cell.first_bad})"
        lat = ("in all (latencies per key above)" if cell.parts else
               f"p50 {cell.p50_ms:7.1f} ms  p99 {cell.p99_ms:7.1f} ms ")
        progress(f"{what} {cell.rate:8.1f}/s {lat} {cell.samples} signatures verified, {status}")
        if not cell.parts:
            for reason in cell.sample_failures:
                progress(f"  sample: {reason}")

    @staticmethod
    def count(cell: Cell, res: dict[str, object]) -> None:
        cell.bad += int(res["bad"])  # type: ignore[call-overload]
        cell.socket_errors += sum(int(res[k]) for k in  # type: ignore[call-overload]
                                  ("connect", "read", "write", "timeout"))
        if not cell.first_bad and res.get("first_bad"):
            cell.first_bad = str(res["first_bad"])
        elif not cell.first_bad and cell.socket_errors:
            cell.first_bad = "socket errors: " + ", ".join(
                f"{k} {res[k]}" for k in ("connect", "read", "write", "timeout") if res[k])

    # -- phases

    def start(self, server: Server, timeout: float = 180.0) -> None:
        self.servers.append(server)
        server.start()

    def phase(self, key: str, plan: list[tuple[str, tuple[int, ...]]]) -> None:
        progress(f"== {key}: starting zeitgitterd and stampd with fresh {key} keys")
        base = self.root / key[:2]
        base.mkdir()
        zg = Zeitgitterd(f"zg-{key}", make_home(base / "z"), key, self.args.zg_agents,
                         self.args.zg_parallel)
        data = base / "s" / "d"
        st = Stampd(f"stampd-{key}", make_home(base / "s"), data, key, self.args.workers)
        zg.start_keygen()  # both keys are generated at the same time
        self.start(st)
        self.start(zg)
        st.wait_ready(180)
        zg.wait_ready(60)
        st.fetch_key(base / "vs")
        zg.fetch_key(base / "vz")
        progress(f"stampd: {self.args.workers} workers, key {st.key.fingerprint}; "  # type: ignore[union-attr]
                 f"zeitgitterd: {zg.agents} gpg-agents, {zg.parallel} parallel signatures")

        if self.have_time(extra=2 * self.args.agent_seconds):
            progress(f"one gpg-agent's raw {key} signing rate (Assuan PKSIGN, no HTTP)")
            self.agent[key] = agent_rates(data / "keys" / "secret-key.asc", base / "ag",
                                          self.args.agent_seconds)
            sweep(base / "ag", "agent-rate")
            a = self.agent[key]
            progress(f"gpg-agent {key}: 1 agent {a.one:.1f}/s, 2 agents {a.two:.1f}/s "
                     f"(other load {a.background[0]:.1f} / {a.background[1]:.1f} cores)")

        for mode, conns_list in plan:
            for conns in conns_list:
                # zeitgitterd first, then stampd, cell by cell: background load drifts alike.
                self.measure(zg, key, mode, conns, "zeitgitterd")
                self.measure(st, key, mode, conns, "stampd")
        zg.stop()
        if self.args.profile and key == self.args.keys[0]:
            self.run_profile(st, key)

        # Scaling: the same stampd (same data, same key) with N workers, then with 1 worker.
        if self.args.workers != 1 and self.have_time(2, extra=10):
            self.measure(st, key, "tag", SCALING_CONNS, f"stampd-w{self.args.workers}")
            st.stop()
            one = Stampd(f"stampd-{key}-w1", make_home(base / "s1"), data, key, 1)
            self.start(one)
            one.wait_ready(120)
            one.fetch_key(base / "vs1")
            self.measure(one, key, "tag", SCALING_CONNS, "stampd-w1")
            one.stop()
        st.stop()

    def run_profile(self, st: Stampd, key: str) -> None:
        """py-spy (sampling, non-blocking, GIL holders only) on the HTTP process and on one
        worker while wrk drives tag stamps at c=16; not part of the table."""
        exe = py_spy()
        if exe is None:
            progress("--profile: py-spy is not installed (pip install py-spy); skipped")
            return
        if not self.have_time():
            progress("--profile: out of time budget; skipped")
            return
        assert st.proc is not None
        table = process_table()
        workers = sorted(p.pid for p in table.values() if b"workers.worker" in p.cmdline
                         and str(st.dir).encode() in _read(f"/proc/{p.pid}/environ"))
        targets = [("http", st.proc.pid)] + ([("worker", workers[0])] if workers else [])
        secs = self.args.duration
        progress(f"profiling stampd {key} tag c={SCALING_CONNS} for {secs}s with py-spy "
                 f"({', '.join(f'{n} pid {p}' for n, p in targets)})")
        spies = []
        for name, pid in targets:
            out = self.root / f"profile-{name}.txt"
            spies.append((name, out, subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--duration", str(secs), "--rate", "250",
                 "--nonblocking", "--gil", "--format", "raw", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        try:
            res, _ = self.wrk(st, "tag", SCALING_CONNS, secs + 1, self.prefix(), None)
        finally:
            for _, _, spy in spies:
                try:
                    spy.wait(timeout=secs + 30)
                except subprocess.TimeoutExpired:
                    kill_pids([spy.pid], "py-spy")
                    spy.wait(timeout=10)
        rate = int(res["requests"]) / (int(res["duration_us"]) / 1e6)  # type: ignore[call-overload]
        self.profile.append(f"profile: stampd {key} tag c={SCALING_CONNS}, {rate:.0f} stamps/s "
                            f"while sampled (py-spy --nonblocking --gil, 250 Hz)")
        for name, out, spy in spies:
            self.profile.append(f"{name} process:")
            if out.exists():
                self.profile += summarize_profile(out)
            else:
                err = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
                self.profile.append(f"  py-spy failed: {err.strip()[-300:]}")

    def execute(self) -> None:
        busy0, t0 = cpu_busy(), time.monotonic()
        time.sleep(1.0)
        self.idle_load = (cpu_busy() - busy0) / (time.monotonic() - t0)
        progress(f"before starting, other processes keep {self.idle_load:.2f} of "
                 f"{os.cpu_count()} cores busy")
        keys = [k for k in dict.fromkeys(k for k, _, _ in PLAN) if k in self.args.keys]
        for key in keys:
            plan = [(m, cs) for k, modes, cs in PLAN if k == key for m in modes]
            self.phase(key, plan)
        if "ssh" in self.args.keys:
            self.ssh_phase()

    def ssh_phase(self) -> None:
        """SSH keys and two keys at once, stampd only: one server holding an ed25519 OpenPGP
        primary key and the SSH keys of SSH_KEYS, --workers workers for each key."""
        w = self.args.workers
        if not self.have_time(extra=10):
            progress("skip ssh: out of time budget")
            return
        progress(f"== ssh: starting stampd with a fresh ed25519 OpenPGP key and "
                 f"{', '.join(SSH_KEYS)}, {w} workers for each key")
        base = self.root / "ssh"
        base.mkdir()
        st = Stampd("stampd-ssh", make_home(base / "s"), base / "s" / "d", "ed25519", w,
                    SSH_KEYS, w)
        self.start(st)
        st.wait_ready(180)
        keys = st.fetch_keys(base / "v")
        progress("stampd: " + ", ".join(f"{kid} {k.fingerprint}" for kid, k in keys.items())
                 + f"; {st.all_workers} workers")

        def target(kid: str) -> Target:
            k = keys.get(kid)
            if k is None:
                raise BenchError(f"stampd-ssh publishes no key {kid} in /v1/keys")
            # Ask for the key by fingerprint (URL-encoded: SSH fingerprints hold + and /).
            return Target(k, "key=" + urllib.parse.quote(k.fingerprint, safe=""))

        for kid, mode, conns_list in SSH_PLAN:
            for conns in conns_list:
                self.measure(st, kid, mode, conns, "stampd", target(kid))
        self.measure_together(st, TWO_KEYS_ROW, "tag", "stampd",
                              [(name, TWO_KEYS_CONNS, target(kid)) for kid, name in TWO_KEYS])
        st.stop()

    def stop_all(self) -> None:
        for s in reversed(self.servers):
            try:
                s.stop()
            except Exception as e:  # keep stopping the others
                progress(f"{s.name}: stop failed: {e!r}")
        sweep(self.root, "bench")

    # -- report

    def find(self, key: str, mode: str, conns: int, server: str) -> Cell | None:
        return next((c for c in self.cells if (c.key, c.mode, c.conns, c.server)
                     == (key, mode, conns, server) and not c.skipped and c.requests), None)

    def report(self) -> list[str]:
        w = self.args.workers
        lines = [
            f"stampd ({w} workers) vs zeitgitterd 1.2.0 ({self.args.zg_agents} gpg-agents, "
            f"{self.args.zg_parallel} parallel signatures); wrk {self.args.duration}s per cell "
            f"after {self.args.warmup}s warm-up; {os.cpu_count()} CPUs; "
            f"load average at end {os.getloadavg()[0]:.2f}",
            f"other processes kept {self.idle_load:.2f} cores busy before the start; the "
            "'other load' columns say how many cores they took during each cell",
            "",
            f"{'key':<14} {'mode':<6} {'c':>3} | {'zeitgitterd':^26} | {'stampd':^26} | "
            f"{'ratio':>6} | wrong | other load",
            f"{'':<14} {'':<6} {'':>3} | {'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | "
            f"{'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | {'st/zg':>6} | zg/st | zg/st cores",
            "-" * 106,
        ]
        na = f"{'-':>9} {'-':>7} {'-':>8}"  # zeitgitterd has no SSH keys and serves one key

        def fmt(c: Cell | None) -> str:
            if c is None:
                return f"{'skipped':>9} {'':>7} {'':>8}"
            if c.parts:  # several wrk processes at once: percentiles are per part
                return f"{c.rate:9.1f} {'-':>7} {'-':>8}"
            return f"{c.rate:9.1f} {c.p50_ms:7.1f} {c.p99_ms:8.1f}"

        def wrong(c: Cell | None) -> str:
            return "-" if c is None else str(c.wrong)

        def bg(c: Cell | None) -> str:
            return "-" if c is None else f"{c.background:.1f}"

        for key, modes, conns_list in PLAN:
            if key not in self.args.keys:
                continue
            for mode in modes:
                for conns in conns_list:
                    z = self.find(key, mode, conns, "zeitgitterd")
                    s = self.find(key, mode, conns, "stampd")
                    ratio = f"{s.rate / z.rate:6.1f}" if z and s and z.rate else f"{'-':>6}"
                    lines.append(f"{key:<14} {mode:<6} {conns:>3} | {fmt(z)} | {fmt(s)} | "
                                 f"{ratio} | {wrong(z):>2}/{wrong(s):<2} | {bg(z)}/{bg(s)}")
        if "ssh" in self.args.keys:
            w = self.args.workers
            lines.append(f"stampd only: SSH keys and two keys at once (one stampd, ed25519 "
                         f"OpenPGP primary + {' + '.join(SSH_KEYS)}, {w} workers per key)")
            for key, mode, conns_list in SSH_PLAN:
                for conns in conns_list:
                    s = self.find(key, mode, conns, "stampd")
                    lines.append(f"{key:<14} {mode:<6} {conns:>3} | {na} | {fmt(s)} | "
                                 f"{'-':>6} | {'-':>2}/{wrong(s):<2} | -/{bg(s)}")
            both = self.find(TWO_KEYS_ROW, "tag", len(TWO_KEYS) * TWO_KEYS_CONNS, "stampd")
            lines.append(f"{TWO_KEYS_ROW:<14} {'tag':<6} {len(TWO_KEYS) * TWO_KEYS_CONNS:>3} | "
                         f"{na} | {fmt(both)} | {'-':>6} | {'-':>2}/{wrong(both):<2} | "
                         f"-/{bg(both)}")
            for part in (both.parts if both else []):
                share = part.rate / both.rate if both and both.rate else 0.0
                lines.append(f"{'  ' + part.key:<14} {'tag':<6} {part.conns:>3} | {na} | "
                             f"{fmt(part)} | {share:6.0%} | {'-':>2}/{wrong(part):<2} |")
        scaled = [k for k in dict.fromkeys(k for k, _, _ in PLAN) if k in self.args.keys]
        if scaled:
            lines += ["", f"scaling: stampd, tag stamps, c={SCALING_CONNS}, same data directory "
                      "and key, measured back to back",
                      f"{'key':<8} {'workers':>7} | {'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | "
                      f"{'vs 1 worker':>11} | {'1 gpg-agent raw':>15} | {'vs N x agent':>12} | "
                      "other load",
                      "-" * 100]
        for key in scaled:
            one = self.find(key, "tag", SCALING_CONNS, "stampd-w1")
            many = self.find(key, "tag", SCALING_CONNS, f"stampd-w{w}")
            agent = self.agent.get(key)
            for n, c in ((1, one), (w, many)):
                vs1 = f"{c.rate / one.rate:10.2f}x" if c and one and one.rate else f"{'-':>11}"
                ag = f"{agent.one:13.1f}/s" if agent else f"{'-':>15}"
                vsag = (f"{c.rate / (n * agent.one):11.2f}x" if c and agent and agent.one
                        else f"{'-':>12}")
                lines.append(f"{key:<8} {n:>7} | {fmt(c)} | {vs1} | {ag} | {vsag} | {bg(c)}")
            if agent:
                lines.append(f"{key:<8} raw gpg-agent rate: 1 agent {agent.one:.1f}/s, 2 agents "
                             f"at once {agent.two:.1f}/s (the ceiling for 2 workers); other "
                             f"load {agent.background[0]:.1f} / {agent.background[1]:.1f} cores")

        lines += ["", "CPU per stamp at c=16 (ms; from /proc, all processes of each server; "
                  "wrk's own share last)"]
        for c in self.cells:
            if c.conns == 16 and c.requests and not c.skipped and c.cpu:
                parts = ", ".join(f"{k} {1000 * v / c.requests:.2f}"
                                  for k, v in sorted(c.cpu.items()) if v > 0)
                total = 1000 * sum(c.cpu.values()) / c.requests
                lines.append(f"  {c.server:<12} {c.key:<14} {c.mode:<6} total {total:6.2f}: "
                             f"{parts}; wrk {1000 * c.wrk_cpu / c.requests:.2f}")
        measured = [c for c in self.cells if c.seconds and c.cpu]
        wrk_share = max((c.wrk_cpu / c.seconds for c in measured), default=0)
        lines.append(f"  wrk used at most {100 * wrk_share:.0f}% of one core in any cell")
        if measured:
            # Whatever else ran on the machine (other jobs, the idle peer server) steals
            # cores from the server under test: say how much, so noisy runs are visible.
            other = [c.background for c in measured]
            lines.append(f"  other processes on the machine used {sum(other) / len(other):.2f} "
                         f"cores on average during the cells (max {max(other):.2f}) of "
                         f"{os.cpu_count()}")
        lines += ["", "targets:", *self.targets()]
        if self.profile:
            lines += ["", *self.profile]
        return lines

    def targets(self) -> list[str]:
        out = []

        def verdict(ok: bool) -> str:
            return "MET " if ok else "MISS"

        self.missed = 0

        def add(ok: bool | None, text: str) -> None:
            if ok is None:
                out.append(f"  n/a  {text}")
                return
            self.missed += 0 if ok else 1
            out.append(f"  {verdict(ok)} {text}")

        z = self.find("ed25519", "tag", 16, "zeitgitterd")
        s = self.find("ed25519", "tag", 16, "stampd")
        if z and s:
            r = s.rate / z.rate
            add(r >= 10 and s.p99_ms <= 25, f"ed25519 tag c=16: {r:.1f}x zeitgitterd (>= 10x), "
                f"p99 {s.p99_ms:.1f} ms (<= 25 ms)")
        else:
            add(None, "ed25519 tag c=16 not measured")
        for mode in ("tag", "branch"):
            s1 = self.find("ed25519", mode, 1, "stampd")
            if s1:
                add(s1.p50_ms <= 3, f"ed25519 {mode} c=1 (one keep-alive client): "
                    f"p50 {s1.p50_ms:.2f} ms (<= 3 ms)")
        w = self.args.workers
        rsa = self.find("rsa4096", "tag", 16, "stampd")
        agent = self.agent.get("rsa4096")
        one = self.find("rsa4096", "tag", 16, "stampd-w1")
        many = self.find("rsa4096", "tag", 16, f"stampd-w{w}")
        if rsa and agent:
            need = 0.9 * w * agent.one
            add(rsa.rate >= need, f"rsa4096 tag c=16: {rsa.rate:.1f}/s >= 0.9 x {w} workers x "
                f"{agent.one:.1f}/s (one gpg-agent, raw) = {need:.1f}/s")
        if rsa and one:
            need = 0.9 * w * one.rate
            add(rsa.rate >= need, f"rsa4096 tag c=16: {rsa.rate:.1f}/s >= 0.9 x {w} workers x "
                f"{one.rate:.1f}/s (stampd with 1 worker) = {need:.1f}/s")
        if one and many:
            add(many.rate >= 1.8 * one.rate, f"rsa4096 scaling: {w} workers "
                f"{many.rate / one.rate:.2f}x 1 worker (>= 1.8x)")
        out += self.ssh_info()
        e1 = self.find("ed25519", "tag", 16, "stampd-w1")
        en = self.find("ed25519", "tag", 16, f"stampd-w{w}")
        if e1 and en:
            out.append(f"  info ed25519 scaling: {w} workers {en.rate / e1.rate:.2f}x 1 worker "
                       "(the agent is not the bottleneck here)")
        return out

    def ssh_info(self) -> list[str]:
        """SSH keys and two keys at once: no targets (issue 6 sets none), the numbers next to
        the OpenPGP ed25519 stamps of the same run."""
        out = []
        pgp = self.find("ed25519", "tag", 16, "stampd")

        def vs(c: Cell) -> str:
            if not pgp or not pgp.rate:
                return ""
            return f" = {c.rate / pgp.rate:.2f}x OpenPGP ed25519 tag c=16 ({pgp.rate:.1f}/s)"

        for key in dict.fromkeys(k for k, _, _ in SSH_PLAN):
            c = self.find(key, "tag", 16, "stampd")
            if c:
                out.append(f"  info {key} tag c=16: {c.rate:.1f}/s, p99 {c.p99_ms:.1f} ms"
                           f"{vs(c)}")
        c1 = self.find("ssh-ed25519", "tag", 1, "stampd")
        if c1:
            out.append(f"  info ssh-ed25519 tag c=1 (one keep-alive client): p50 "
                       f"{c1.p50_ms:.2f} ms, p99 {c1.p99_ms:.2f} ms")
        both = self.find(TWO_KEYS_ROW, "tag", len(TWO_KEYS) * TWO_KEYS_CONNS, "stampd")
        if both and both.parts:
            split = " + ".join(f"{p.key} {p.rate:.1f}/s (p99 {p.p99_ms:.1f} ms)"
                               for p in both.parts)
            out.append(f"  info two keys at once: {both.rate:.1f}/s = {split}{vs(both)}")
        return out


# --------------------------------------------------------------------------------------------


def ensure_tools() -> None:
    if shutil.which("wrk") is None:
        if os.geteuid() != 0:
            raise BenchError("wrk is missing: apt-get install -y wrk")
        progress("installing wrk (apt-get install -y wrk)")
        run(["apt-get", "install", "-y", "wrk"], timeout=240,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    for tool in ("gpg", "gpg-agent", "gpg-connect-agent", "gpgconf", "git", "ssh-keygen",
                 "ssh-agent"):
        if shutil.which(tool) is None:
            raise BenchError(f"{tool} is missing")
    for exe in ("stampd", "zeitgitterd"):
        if not (BIN / exe).exists():
            raise BenchError(f"{BIN / exe} is missing: pip install -e '.[test,bench]'")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=5, help="seconds per cell (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up seconds per cell (1)")
    ap.add_argument("--workers", type=int, default=2, help="stampd workers (default 2)")
    ap.add_argument("--zg-agents", type=int, default=ZG_AGENTS,
                    help=f"zeitgitterd --number-of-gpg-agents (default {ZG_AGENTS})")
    ap.add_argument("--zg-parallel", type=int, default=ZG_PARALLEL,
                    help=f"zeitgitterd --max-parallel-signatures (default {ZG_PARALLEL})")
    ap.add_argument("--keys", default="ed25519,rsa4096,ssh",
                    help="key types to run, comma-separated (default ed25519,rsa4096,ssh; "
                         "ssh: the stampd-only rows for SSH keys and two keys at once)")
    ap.add_argument("--agent-seconds", type=float, default=2.0,
                    help="seconds for each raw gpg-agent rate measurement (default 2)")
    ap.add_argument("--budget", type=float, default=280.0,
                    help="seconds the whole run may take; cells that would not fit are "
                         "skipped (default 280)")
    ap.add_argument("--json", type=Path, help="also write every cell as JSON to this file")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (kept anyway when something was wrong)")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    ap.add_argument("--profile", action="store_true",
                    help="also profile stampd's HTTP process and one worker with py-spy under "
                         "a c=16 tag load (needs py-spy; adds one cell)")
    args = ap.parse_args(argv)
    args.keys = [k.strip() for k in args.keys.split(",") if k.strip()]
    return args


def _interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="bn", dir="/tmp"))
    os.chmod(root, 0o700)
    bench = Bench(args, root)
    status = 0
    progress(f"bench directory {root}")
    try:
        ensure_tools()
        bench.execute()
    except BenchError as e:
        progress(f"bench failed: {e}")
        status = 2
    except KeyboardInterrupt:
        progress("interrupted")
        status = 130
    finally:
        progress("stopping everything")
        bench.stop_all()

    if bench.cells:
        print("\n".join(bench.report()))
    wrong = sum(c.wrong for c in bench.cells)
    problems = [(s.name, s.problems()) for s in bench.servers]
    for name, lines in problems:
        if lines:
            progress(f"{name}: {len(lines)} warning/error lines in {s_log(bench, name)}, "
                     f"first: {lines[0][:200]}")
    if args.json:
        args.json.write_text(json.dumps({
            "cells": [dict(asdict(c), rate=c.rate, wrong=c.wrong,
                           parts=[dict(asdict(p), rate=p.rate, wrong=p.wrong) for p in c.parts])
                      for c in bench.cells],
            "agent_rates": {k: vars(v) for k, v in bench.agent.items()},
            "server_problems": dict(problems)}, indent=1))
    if wrong:
        print(f"\nFAIL: {wrong} wrong responses or signatures (details above, on stderr)")
        for c in bench.cells:
            if c.wrong:
                print(f"  {c.server} {c.key} {c.mode} c={c.conns}: bad {c.bad}, socket errors "
                      f"{c.socket_errors}, sample failures {len(c.sample_failures)}; "
                      f"{c.first_bad or (c.sample_failures[:1] or [''])[0]}")
        status = status or 1
    if args.strict and getattr(bench, "missed", 0):
        status = status or 3
    if status or args.keep:
        progress(f"logs and samples kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return status


def s_log(bench: Bench, name: str) -> str:
    return next((str(s.log) for s in bench.servers if s.name == name), "?")


if __name__ == "__main__":
    sys.exit(main())
