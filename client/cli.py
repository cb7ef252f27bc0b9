"""The client's commands of the ``stampd`` command line (`stampd.cli`): stamp, verify, audit,
hook. They need no server installed; each is imported only when it runs. A command raises
`client.errors.CommandError`, mapped here once to one line and its exit status."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from client.errors import CommandError

NAMES = ("verify", "audit", "stamp", "hook")


def _lazy(module: str, name: str) -> Any:
    """A command implemented in ``module``, imported only when it runs."""

    def run(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), name)(args))

    return run


def add_commands(sub: Any) -> None:
    """The client's commands on the ``stampd`` command line's subparsers ``sub``; each sets
    ``func``, which returns the exit status."""
    verify = sub.add_parser(
        "verify", help="check a digest receipt, a manifest (SHA256SUMS.asc), an RFC 3161 "
        "time-stamp token, or a git tag/commit stamp in a repository",
        description="Exit status: 0 valid, 1 invalid (bad signature, wrong key, wrong time, "
        "digest mismatch, a manifest's files missing or changed (--dir), a token not from the "
        "--chain TSA) or could not be checked (server key neither given, pinned nor obtainable: "
        "one line says which option to give; gpg missing, a token "
        "checked without --chain, unsupported), 2 malformed (not a "
        "receipt, token or stamp of a known format, or an unusable argument), 3 a valid RFC "
        "3161 token whose imprint is not in the --log yet (or the log has no commit yet). "
        "A transparency-log proof (--proof, <target>.tlog-proof, a git note, --fetch-proof) "
        "that fails is invalid (1); one that cannot be checked for want of a log key is "
        "'cannot check' (1); no proof at all is not checked (0). "
        "With --signers: a commit's or tag's own signature is checked at the time its stamp "
        "proves: 0 valid; 1 invalid (the key not valid at that time, a bad signature; with "
        "--range also an unsigned commit); 2 malformed; 3 no stamp covers it.")
    verify.add_argument("target", nargs="?", default=None,
                        help="a receipt or manifest file ('-' for stdin), an RFC 3161 response "
                        "(.tsr) or token, or a git tag/commit")
    what = verify.add_mutually_exclusive_group()
    what.add_argument("--file", "--data", dest="file", type=Path,
                      help="check that the receipt's digest (the token's imprint) is this "
                      "file's")
    what.add_argument("--digest", help="check that the receipt or token is for this hex digest")
    verify.add_argument("--key", type=Path,
                        help="public key file of the server (offline); default: the key "
                        "`stampd stamp` or `stampd hook install` pinned in --repo (offline), "
                        "else fetched from the server URL in the receipt or manifest")
    verify.add_argument("--repo", type=Path, default=Path("."),
                        help="git repository holding a tag/commit target, and the pinned keys "
                        "(default: .)")
    verify.add_argument("--chain", type=Path,
                        help="RFC 3161 token: the certificates to trust (PEM: the TSA's "
                        "GET /tsa.pem, or its CA's certificate)")
    verify.add_argument("--dir", type=Path, default=None,
                        help="manifest (SHA256SUMS.asc): also hash the files it names, "
                        "relative to DIR, and report missing and changed ones")
    verify.add_argument("--log",
                        help="RFC 3161 token: a clone of the server's log (path or http(s) "
                        "URL, as for `stampd audit`): name the log commit publishing the "
                        "imprint")
    verify.add_argument("--proof", type=Path, default=None, metavar="FILE",
                        help="the stamp's transparency-log proof (default: <target>.tlog-proof "
                        "beside a receipt or manifest; a git stamp's note in "
                        "refs/notes/stampd-tlog)")
    verify.add_argument("--log-key", default=None, metavar="VKEY_OR_FILE",
                        help="the log's verifier key (GET /tlog/vkey), or a file holding it "
                        "(default: the one pinned by `stampd stamp` or `stampd hook install`, "
                        "else fetched from the server the receipt or manifest names)")
    verify.add_argument("--policy", type=Path, default=None, metavar="FILE",
                        help="a transparency-log policy (c2sp tlog-policy: log and witness keys "
                        "and a quorum, as GET /tlog/policy gives it): the proof's checkpoint must "
                        "be signed by its log and cosigned by its quorum of witnesses; prints "
                        "when the quorum had seen it")
    verify.add_argument("--state", type=Path, default=None, metavar="FILE",
                        help="the checkpoints kept by stampd audit, compared with the proof's "
                        "(two that cannot both hold, a fork, are invalid; default: stampd "
                        "audit's state file); with --fetch-proof or --upgrade-proof the "
                        "server's tree too")
    verify.add_argument("--upgrade-proof", action="store_true",
                        help="with a stored proof: fetch the stamp's proof again and store it in "
                        "its place when it is valid and carries more witness cosignatures (of "
                        "--policy's witnesses when given)")
    verify.add_argument("--fetch-proof", action="store_true",
                        help="when no proof is stored: fetch it from the server (the receipt's "
                        "or manifest's; for a git stamp stampd.server or timestamp.server), "
                        "check it and store it beside the target or as the stamp's note")
    verify.add_argument("--signers", type=Path, action="append", default=None,
                        metavar="ALLOWED_SIGNERS|KEYRING",
                        help="check the commit's or tag's own signature, not a stamp: against "
                        "an ssh-keygen allowed-signers file or an OpenPGP key file (give both "
                        "for a history signed both ways), at the time its earliest stamp "
                        "proves rather than the date its signer wrote (docs/signatures.md)")
    verify.add_argument("--range", default=None, metavar="A..B",
                        help="with --signers: every commit of the range (as git rev-list takes "
                        "it), one line each")
    verify.set_defaults(func=_lazy("client.verify.command", "cmd_verify"))

    audit = sub.add_parser(
        "audit", help="verify a log repository (a clone or its URL) and its peer stamps, and "
        "the server's transparency log",
        description="Exit status: 0 all checks passed, 1 a check failed (the transparency "
        "log's included), 2 the audit could not "
        "run (the target is not a readable log repository, cannot be cloned or has no main "
        "branch; gpg missing; the state file is unreadable), 3 nothing to check yet (the log "
        "has no commit yet: a new "
        "server commits its log every STAMPD_COMMIT_INTERVAL seconds, 3600 by default; its "
        "transparency log is checked meanwhile, and a failure there is 1 or 4), 4 "
        "a check failed that shows two histories of the transparency log (a fork: a checkpoint "
        "of the git log, of an earlier audit or of a witness that is not a prefix of today's "
        "tree; both checkpoints are printed). "
        "A server without a transparency log (404 on /tlog/vkey) is no failure.")
    audit.add_argument("target", help="path of a log clone, its http(s) URL (.../log.git), "
                       "or the server's URL (as stampd stamp --server takes it)")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.add_argument("--peer-keys", type=Path,
                       help="directory of <peer>.asc keys, overriding peers/<peer>.asc in the log")
    audit.add_argument("--server", metavar="URL",
                       help="the server whose transparency log (URL/tlog/) is checked (default: "
                       "the target's URL less 'log.git'; for a clone, its audited remote's)")
    audit.add_argument("--state", metavar="FILE",
                       help="where the checkpoints seen are kept (default: "
                       "$XDG_STATE_HOME/stampd/tlog-checkpoints.json, "
                       "~/.local/state/stampd/tlog-checkpoints.json)")
    audit.add_argument("--no-tlog", action="store_true",
                       help="do not check the transparency log")
    audit.set_defaults(func=_lazy("client.audit.command", "cmd_audit"))

    stampp = sub.add_parser(
        "stamp", help="stamp files (one signed manifest, SHA256SUMS.asc), or obtain a tag or "
        "branch stamp of a commit, from a stampd (or Zeitgitter) server; the answer is checked "
        "before anything is stored",
        usage="stampd stamp FILE|DIR... [-o FILE] [--algorithm sha256|sha512] [options]\n"
        "       stampd stamp (--tag NAME | --branch NAME) [COMMIT] [options]\n"
        "       stampd stamp --object TAG-OR-COMMIT [options]",
        description="Files: hashed here (directories recursively), sent as one manifest "
        "(POST /v1/manifests), and the signed answer written to SHA256SUMS.asc once its "
        "signature, header and lines are checked. Git: OpenPGP or SSH stamps (--format ssh), "
        "SHA-1 or SHA-256 repositories. "
        "Exit status: 0 stored; 1 not stamped (server unreachable or answered an error, its "
        "key changed from the pinned one, git or gpg failed); 2 an unusable argument or "
        "repository (no server, a bad name, an unknown commit, an existing tag, a commit the "
        "branch stamps already, an unreadable file or one whose name a manifest cannot hold); "
        "3 the server's answer was refused (not the object or the lines asked for, a time off "
        "by 30 s or more, a signature that does not verify with the trusted key): "
        "nothing was stored. A transparency-log proof not obtained (no log, not ready in "
        "--proof-wait, refused) is one line on stderr, not a failure.")
    which = stampp.add_mutually_exclusive_group()
    which.add_argument("--tag", metavar="NAME", help="make the stamp the tag refs/tags/NAME")
    which.add_argument("--branch", metavar="NAME",
                       help="add the stamp to the timestamp branch NAME (a merge chain: its "
                       "parents are the branch's previous stamp and COMMIT)")
    which.add_argument("--object", metavar="REV",
                       help="a receipt of the git object's own bytes (a signed tag, which no "
                       "commit stamp covers): SHA-256 of <type> <size>\\0<body>, kept as a "
                       "note in refs/notes/stampd-receipts for stampd verify --signers")
    stampp.add_argument("paths", nargs="*", metavar="FILE|DIR | COMMIT",
                        help="the files and directories to stamp; with --tag/--branch the "
                        "commit to stamp (default: HEAD)")
    stampp.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                        help="files: where to write the signed manifest (default: "
                        "SHA256SUMS.asc, SHA512SUMS.asc with --algorithm sha512)")
    stampp.add_argument("--algorithm", choices=("sha256", "sha512"), default=None,
                        help="files: the digest algorithm (default: sha256)")
    stampp.add_argument("--server", default=None,
                        help="server URL (default: $STAMPD_SERVER, else git config "
                        "timestamp.server)")
    stampp.add_argument("--format", choices=("openpgp", "ssh"), default=None,
                        help="the stamp's signature (default: openpgp; ssh with --key "
                        "SHA256:...)")
    stampp.add_argument("--key", default=None, metavar="FILE|SHA256:...",
                        help="the key to trust instead of the pinned one (trust on first use): "
                        "an armored OpenPGP public key file; with --format ssh a .pub or "
                        "allowed-signers file, or the fingerprint of one of the server's SSH "
                        "keys")
    stampp.add_argument("--repo", type=Path, default=Path("."),
                        help="the git repository (default: .); for files, where keys are "
                        "pinned and timestamp.server is read")
    stampp.add_argument("--quorum-wait", type=int, default=0, metavar="SECONDS",
                        help="after the proof: wait up to SECONDS (at most 120) for the log's "
                        "witnesses to cosign its checkpoint, per --policy or the server's "
                        "GET /tlog/policy, and keep the cosigned proof (default: 0, no wait)")
    stampp.add_argument("--policy", type=Path, default=None, metavar="FILE",
                        help="the transparency-log policy (c2sp tlog-policy) --quorum-wait "
                        "waits for (default: the server's)")
    stampp.add_argument("--proof-wait", type=int, default=5, metavar="SECONDS",
                        help="wait up to SECONDS (at most 60) for the stamp's transparency-log "
                        "proof and store it (<output>.tlog-proof; a git stamp's note in "
                        "refs/notes/stampd-tlog); 0: do not fetch it (default: 5)")
    stampp.set_defaults(func=_lazy("client.stamp.command", "cmd_stamp"))

    hook = sub.add_parser("hook", help="the post-commit hook that stamps every commit")
    hooksub = hook.add_subparsers(dest="hook_command", required=True)
    install = hooksub.add_parser(
        "install", help="install the post-commit hook",
        description="Exit status: 0 installed, 1 not installed (not a git repository, a foreign "
        "hook without --force, the server key could not be fetched or has changed), 2 an "
        "unusable --server URL or --branch name.")
    install.add_argument("--server", default="http://127.0.0.1:8080",
                         help="stampd (or any Zeitgitter) server URL")
    install.add_argument("--branch", default=None,
                         help="timestamp branch (default: the name `git timestamp` derives "
                         "from the server URL, e.g. localhost-8080-timestamps)")
    install.add_argument("--repo", type=Path, default=Path("."))
    install.add_argument("--force", action="store_true",
                         help="install over an existing post-commit hook that is not ours: it "
                         "is kept as post-commit.user and runs before stampd's; or trust a "
                         "changed server key")
    install.add_argument("--format", choices=("openpgp", "ssh"), default="openpgp",
                         help="the stamps' signatures: OpenPGP (checked with gpg) or SSH "
                         "(checked with ssh-keygen; the server must have an SSH key)")
    install.add_argument("--key", default=None,
                         help="with --format ssh: the server's SSH key to use, SHA256:... "
                         "(default: its first SSH key)")
    install.add_argument("--proof-wait", type=int, default=3, metavar="SECONDS",
                         help="after each stamp the hook waits up to SECONDS (at most 60) "
                         "for its transparency-log proof and keeps it as a note in "
                         "refs/notes/stampd-tlog; 0: never (default: 3)")
    install.add_argument("--git-verify", action="store_true",
                         help="also point the repository's gpg.ssh.program and gpg.program at "
                         "stampd's wrappers, so that plain git verify-commit, verify-tag and "
                         "log --show-signature check a signature at the time its stamp proves "
                         "(docs/signatures.md)")
    install.set_defaults(func=_lazy("client.hook", "cmd_install"))
    uninstall = hooksub.add_parser(
        "uninstall", help="remove stampd's post-commit hook",
        description="A hook kept as post-commit.user is put back. Exit status: 0 removed (or "
        "no hook to remove), 1 the hook is not stampd's, or the repository is unusable.")
    uninstall.add_argument("--repo", type=Path, default=Path("."))
    uninstall.set_defaults(func=_lazy("client.hook", "cmd_uninstall"))


def exit_status(exc: Exception) -> tuple[int, str] | None:
    """(exit code, one-line message) of a `CommandError`; None for anything else."""
    if isinstance(exc, CommandError):
        return exc.exit_code, " ".join(str(exc).split())
    return None
