"""The two servers under test: Server starts one in its own session, directory and free port, waits
until it answers, imports the key it publishes, splits its process tree's CPU time by role, stops it
by PID and sweeps up its leftovers, and finds the trouble its log showed before it was told to stop;
Stampd runs `stampd serve` from this virtual environment (optionally with extra SSH keys),
Zeitgitterd runs zeitgitterd 1.2.0 with a fresh key made by `gpg --quick-gen-key`, no upstream
servers, no pushing and no mail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from bench.checks import ServerKey, gpg_env, import_public_key, make_home
from bench.procs import (
    BIN,
    CLK_TCK,
    BenchError,
    ProcInfo,
    free_port,
    http_get,
    process_table,
    progress,
    run,
    sweep,
)
from workers.pool import POOL_NAME
from workers.worker import WORKER_NAME


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
        # The cores the server and all its children may run on (taskset -c); None: any.
        self.cpus: str | None = None

    def pinned(self, argv: list[str]) -> list[str]:
        """`argv` run on the server's cores (taskset execs it: the pid stays the program's)."""
        return argv if self.cpus is None else ["taskset", "-c", self.cpus, *argv]

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        argv = self.pinned(argv)
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

    def processes(self) -> dict[int, tuple[str, ProcInfo]]:
        """This server's live processes, each with its role: its process tree, and whatever
        mentions its directory (agents that daemonized themselves)."""
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
        return {pid: (self.role(table[pid]), table[pid]) for pid in tree if pid in table}

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by this server's processes, by role."""
        out: dict[str, float] = {}
        for role, p in self.processes().values():
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
        self.serve_args: list[str] = []  # more options of `stampd serve`
        # The transparency log: on or off; None: STAMPD_TLOG of this environment, else off.
        self.tlog: bool | None = None
        self.witness = False  # a witness of other logs (STAMPD_WITNESS_FOR in ``env``)
        self.env: dict[str, str] = {}  # more STAMPD_ settings

    @property
    def tlog_on(self) -> bool:
        if self.tlog is not None:
            return self.tlog
        return os.environ.get("STAMPD_TLOG", "off").lower() in ("on", "true", "1", "yes")

    @property
    def all_workers(self) -> int:
        # the log key has workers like an extra key (STAMPD_EXTRA_KEY_WORKERS)
        keys = len(self.extra_keys) + (1 if self.tlog_on else 0) + (1 if self.witness else 0)
        return self.workers + keys * self.extra_workers

    def start(self) -> None:
        rt = self.dir / "rt"
        tmp = self.dir / "tmp"
        rt.mkdir(mode=0o700, exist_ok=True)
        tmp.mkdir(mode=0o700, exist_ok=True)
        env = dict(os.environ)
        env.update(STAMPD_KEY_ALGO=self.key_algo, STAMPD_RUNTIME_DIR=str(rt),
                   STAMPD_LOG_LEVEL="WARNING", TMPDIR=str(tmp), GNUPGHOME=str(self.dir / "g"),
                   STAMPD_EXTRA_KEYS=",".join(self.extra_keys),
                   STAMPD_EXTRA_KEY_WORKERS=str(self.extra_workers),
                   # RFC 3161 off: its key's workers would skew the rows (bench.tsa turns
                   # it on for its own rows); the transparency log's key likewise
                   STAMPD_TSA=os.environ.get("STAMPD_TSA", "false"),
                   STAMPD_TLOG="on" if self.tlog_on else "off")
        env.update(self.env)
        self._spawn([str(BIN / "stampd"), "serve", "--host", "127.0.0.1",
                     "--port", str(self.port), "--data-dir", str(self.data_dir),
                     "--workers", str(self.workers), "--commit-interval", "3600",
                     *self.serve_args], env)

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

    @property
    def coordinating(self) -> bool:
        """Whether ``stampd serve`` runs several HTTP processes, and so is their coordinator
        (the host's dispatcher and journal) rather than one of them."""
        args = self.serve_args
        return "--api-processes" in args and int(args[args.index("--api-processes") + 1]) > 1

    def role(self, p: ProcInfo) -> str:
        if p.comm == WORKER_NAME:  # (forked by the supervisor: its command line)
            return "workers"
        if p.comm == POOL_NAME:
            return "pool"
        if self.proc is not None and p.pid == self.proc.pid and self.coordinating:
            return "coordinator"
        if self.proc is not None and (p.pid == self.proc.pid or (
                p.ppid == self.proc.pid and p.exe not in (b"gpg-agent", b"ssh-agent")
                and b"multiprocessing.resource_tracker" not in p.cmdline)
                or p.comm.startswith("stampd-http-")):
            # the main process, the HTTP manager and the HTTP processes it forks
            # (--api-processes; grandchildren, named stampd-http-N)
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
        # Pinned like the server: the gpg-agent this starts is the one zeitgitterd signs with.
        self.keygen = subprocess.Popen(self.pinned(
            ["gpg", "--homedir", str(self.gnupg_home), "--batch", "--passphrase", "",
             "--quick-gen-key", "Zeitgitter Bench <zeitgitter@localhost>", self.key_algo,
             "sign", "never"]),
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
