"""RFC 3161 time-stamping with a key held by an agent: the TSA certificate, tokens.

The TSA key is one more served key (``openpgp:nistp256`` by default, ``ssh:ecdsa-p256`` the
fast choice, see `keystore.keyset`); its directory of the key store also holds its
certificate chain, ``tsa-chain.pem`` (`keystore.keyset.TSA_CHAIN_FILE`): the PEM
certificates, the TSA's own first. Every DER structure is built by the pure `formats.tsp`
(the chain read by `formats.tsp.certificates.parse_chain`); this module adds the one
private-key operation, made through the key's agent, and the chain file.

* `TsaKey` is the key as the TSA uses it, whatever agent holds it: its DER
  ``SubjectPublicKeyInfo``, its signature algorithm and a function that signs bytes. Two small
  adapters make one: `openpgp_agent_key` for gpg-agent (``SIGKEY``/``SETHASH``/``PKSIGN`` over
  the hash, exactly like an OpenPGP signature: gpg-agent does the PKCS#1 v1.5 encoding of an
  RSA signature with the hash's OID, which is sha256WithRSAEncryption) and `ssh_agent_key` for
  ssh-agent (``SSH2_AGENTC_SIGN_REQUEST`` over the bytes themselves: for an ECDSA key the agent
  hashes them with the curve's hash, which is ecdsa-with-SHA256/SHA384). `open_key` starts an
  agent for one (the CLI's ``stampd tsa`` commands).
* `ensure_certificate` makes a self-signed TSA certificate when the key has no chain yet
  (the supervisor's start-up check, `workers.worker.check_key`), and refuses a chain made
  for another key.
* `build_token` turns a `TimestampJob` into a token; `csr` makes a PKCS#10 request for an
  outside CA, and `check_import`/`write_chain` take that CA's answer in.

Errors are `TsaError` (a `ValueError`, so that a worker refuses a job it cannot stamp), with a
one-line ``message`` that names the file concerned.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from asn1crypto import keys as asn1_keys
from asn1crypto import x509

from formats import openpgp, sexp, sshsig
from formats.jobs import TimestampJob
from formats.tsp.algorithms import ecdsa_signature, signature_hash
from formats.tsp.certificates import (
    certificate,
    certification_request,
    certification_request_info,
    ec_public_key_info,
    parse_chain,
    pem,
    subject_of,
    tbs_certificate,
)
from formats.tsp.errors import TspError
from formats.tsp.token import UnsignedToken, prepare_token
from formats.tsp.tstinfo import TokenFields
from keystore.keyset import TSA_CHAIN_FILE, SshKeyStore
from keystore.store import KeyStore
from workers.agents.gpg import AssuanConnection, GpgAgent, GpgAgentError
from workers.agents.ssh import SshAgent, SshAgentConnection, SshAgentError
from workers.errors import TsaError

__all__ = [
    "TSA_KEY_TYPES",
    "TsaError",
    "TsaKey",
    "build_token",
    "build_tokens",
    "check_chain",
    "check_import",
    "csr",
    "ensure_certificate",
    "open_key",
    "openpgp_agent_key",
    "openpgp_key",
    "read_chain",
    "secret_key_file",
    "signature_algorithm_for",
    "ssh_agent_key",
    "ssh_signature_algorithm_for",
    "write_chain",
]

TSA_KEY_TYPES = "ECDSA on NIST P-256 or P-384, or RSA of at least 2048 bits"
"""The key types a TSA key may have (what RFC 3161 clients verify), for error messages."""

ORGANIZATION = "stampd"
"""The O of a TSA certificate's subject (and of a certificate request)."""

SignFn = Callable[[int, bytes], Sequence[int]]
"""Sign a digest made with an OpenPGP hash algorithm: gpg-agent's signature values."""

SshSignFn = Callable[[bytes, bytes, int], bytes]
"""Sign bytes with the SSH key of a public key blob, with agent flags: ssh-agent's signature
blob (`SshAgentConnection.sign`)."""

SignManyFn = Callable[[int, Sequence[bytes]], Sequence[Sequence[int]]]
"""`SignFn` for several digests in one agent round trip (`AssuanConnection.sign_many`)."""

SshSignManyFn = Callable[[bytes, Sequence[bytes], int], Sequence[bytes]]
"""`SshSignFn` for several messages in one round trip (`SshAgentConnection.sign_many`)."""

_HASH_IDS = {name: algo for algo, name in openpgp.HASH_NAMES.items()}
_EC_ALGORITHMS = {"nistp256": "sha256_ecdsa", "nistp384": "sha384_ecdsa"}
_MIN_RSA_BITS = 2048
# SSH key type -> (the curve of its SubjectPublicKeyInfo, its signature algorithm): ssh-agent
# hashes what it signs with SHA-256 for nistp256 and SHA-384 for nistp384 (RFC 5656 6.2.1).
_SSH_EC_KEYS = {
    "ecdsa-sha2-nistp256": ("secp256r1", "sha256_ecdsa"),
    "ecdsa-sha2-nistp384": ("secp384r1", "sha384_ecdsa"),
}
_KEY_SETTINGS = ("openpgp:nistp256, openpgp:nistp384, openpgp:rsa3072, openpgp:rsa4096, "
                 "ssh:ecdsa-p256, ssh:ecdsa-p384")


def signature_algorithm_for(key: openpgp.KeyInfo) -> str:
    """The signature algorithm (as `formats.tsp.algorithms` names it) of a TSA key: ECDSA P-256
    ``sha256_ecdsa``, P-384 ``sha384_ecdsa``, RSA of 2048 bits or more ``sha256_rsa``;
    `TsaError` for any other key (ed25519, other curves, DSA, short RSA)."""
    curve = (key.curve or "").lower()
    if key.pubkey_algo == openpgp.PK_ECDSA and curve in _EC_ALGORITHMS:
        return _EC_ALGORITHMS[curve]
    if key.pubkey_algo == openpgp.PK_RSA and key.bits >= _MIN_RSA_BITS:
        return "sha256_rsa"
    if key.pubkey_algo == openpgp.PK_RSA:
        kind = f"RSA of {key.bits} bits"
    else:
        kind = f"a {key.curve or 'DSA'} key"
    raise TsaError(f"key {key.fingerprint} cannot be a TSA key: it is {kind}; a TSA key is "
                   f"{TSA_KEY_TYPES} ({_KEY_SETTINGS})")


def ssh_signature_algorithm_for(key: sshsig.SshPublicKey) -> str:
    """The signature algorithm of an SSH TSA key: ECDSA P-256 ``sha256_ecdsa``, P-384
    ``sha384_ecdsa``; `TsaError` for any other key (Ed25519 and P-521, which RFC 3161 clients
    seldom verify; RSA, for which there are the OpenPGP RSA keys)."""
    if key.key_type in _SSH_EC_KEYS:
        return _SSH_EC_KEYS[key.key_type][1]
    raise TsaError(f"SSH key {key.fingerprint} cannot be a TSA key: it is {key.key_type}; an "
                   f"SSH TSA key is ECDSA on NIST P-256 or P-384 ({_KEY_SETTINGS})")


@dataclass(frozen=True)
class TsaKey:
    """A key as the TSA signs with it, whatever agent holds it: ``name`` says which key in
    messages (its fingerprint), ``public_key_info`` is its DER ``SubjectPublicKeyInfo``,
    ``algorithm`` its signature algorithm (as `formats.tsp.algorithms` names it), ``sign`` signs
    bytes: the signature as X.509 and CMS carry it (`signature`), and ``sign_many``, when the
    agent can, signs several in one round trip (`signatures`). `openpgp_agent_key` and
    `ssh_agent_key` make one."""

    name: str
    public_key_info: bytes
    algorithm: str
    sign: Callable[[bytes], bytes]
    sign_many: Callable[[Sequence[bytes]], list[bytes]] | None = None

    def signature(self, data: bytes) -> bytes:
        """The signature over ``data``: a DER ``ECDSA-Sig-Value``, or the RSA ``s`` as
        big-endian bytes of the modulus' length."""
        return self.sign(data)

    def signatures(self, datas: Sequence[bytes]) -> list[bytes]:
        """`signature` of each of ``datas``, in one agent round trip where the agent allows."""
        if self.sign_many is None or len(datas) == 1:
            return [self.sign(data) for data in datas]
        return self.sign_many(datas)


def openpgp_key(key: openpgp.KeyInfo, public_key_info: bytes, sign: SignFn,
                sign_many: SignManyFn | None = None) -> TsaKey:
    """The OpenPGP key ``key`` whose ``SubjectPublicKeyInfo`` is ``public_key_info``, signing
    through ``sign`` (gpg-agent's ``PKSIGN`` over a digest; ``sign_many`` for several);
    `TsaError` when it cannot be a TSA key."""
    algorithm = signature_algorithm_for(key)
    hash_name = signature_hash(algorithm)
    hash_id = _HASH_IDS[hash_name]

    def encoded(values: Sequence[int]) -> bytes:
        if key.pubkey_algo == openpgp.PK_ECDSA:
            if len(values) != 2:
                raise GpgAgentError(
                    f"an ECDSA signature has 2 values, the agent gave {len(values)}")
            return ecdsa_signature(values[0], values[1])
        if len(values) != 1:
            raise GpgAgentError(f"an RSA signature has 1 value, the agent gave {len(values)}")
        size = (key.bits + 7) // 8
        if values[0].bit_length() > 8 * size:
            raise GpgAgentError("the agent's RSA signature is longer than the modulus")
        return values[0].to_bytes(size, "big")

    def signature(data: bytes) -> bytes:
        return encoded(list(sign(hash_id, hashlib.new(hash_name, data).digest())))

    def signatures(datas: Sequence[bytes]) -> list[bytes]:
        assert sign_many is not None
        values = sign_many(hash_id, [hashlib.new(hash_name, data).digest() for data in datas])
        return [encoded(list(v)) for v in values]

    return TsaKey(key.fingerprint, public_key_info, algorithm, signature,
                  None if sign_many is None else signatures)


def openpgp_agent_key(key: openpgp.KeyInfo, conn: AssuanConnection) -> TsaKey:
    """The OpenPGP key ``conn``'s gpg-agent holds (its public part read with ``READKEY``)."""
    signature_algorithm_for(key)
    try:
        info = sexp.public_key(conn.read_key(key.keygrip))
    except sexp.SexpError as exc:
        raise TsaError(f"the agent's public key of {key.fingerprint} is unusable: {exc}"
                       ) from None
    return openpgp_key(key, info, lambda algo, digest: conn.sign(key.keygrip, algo, digest),
                       lambda algo, digests: conn.sign_many(key.keygrip, algo, digests))


def ssh_key(key: sshsig.SshPublicKey, sign: SshSignFn,
            sign_many: SshSignManyFn | None = None) -> TsaKey:
    """The SSH key ``key`` (ECDSA P-256 or P-384), signing through ``sign`` (``sign_many`` for
    several): ssh-agent signs the bytes themselves (it hashes them), and its ``(r, s)`` become
    a DER ``ECDSA-Sig-Value``. `TsaError` when it cannot be a TSA key."""
    algorithm = ssh_signature_algorithm_for(key)
    info = ec_public_key_info(_SSH_EC_KEYS[key.key_type][0], sshsig.ecdsa_point(key))

    def encoded(blob: bytes) -> bytes:
        try:
            r, s = sshsig.ecdsa_signature_values(key, blob)
        except sshsig.SshSigError as exc:
            raise SshAgentError(f"ssh-agent returned an unusable signature: {exc}") from exc
        return ecdsa_signature(r, s)

    def signature(data: bytes) -> bytes:
        return encoded(sign(key.blob, data, 0))

    def signatures(datas: Sequence[bytes]) -> list[bytes]:
        assert sign_many is not None
        return [encoded(blob) for blob in sign_many(key.blob, datas, 0)]

    return TsaKey(key.fingerprint, info, algorithm, signature,
                  None if sign_many is None else signatures)


def ssh_agent_key(key: sshsig.SshPublicKey, conn: SshAgentConnection) -> TsaKey:
    """The SSH key ``key`` that ``conn``'s ssh-agent holds."""
    return ssh_key(key, conn.sign, conn.sign_many)


def secret_key_file(key_dir: Path, key_format: str) -> Path:
    """The secret key file of the TSA key in ``key_dir``, an ``openpgp`` or ``ssh`` key."""
    if key_format == "ssh":
        return SshKeyStore(key_dir).private_key_file
    return KeyStore(key_dir).secret_key_file


@contextlib.contextmanager
def open_key(key_dir: Path, key_format: str, home: Path,
             passphrase: str | None = None) -> Iterator[TsaKey]:
    """The TSA key of the key store ``key_dir`` (``key_format`` ``openpgp`` or ``ssh``), held
    by an agent started in ``home`` (a private, short-pathed directory) for as long as the
    block runs. For the CLI (``stampd tsa csr``, ``import-cert``); the workers use the agent
    they already run."""
    if key_format == "ssh":
        ssh_agent = SshAgent(home)
        ssh_agent.start()
        try:
            ssh_public = ssh_agent.add_key(secret_key_file(key_dir, key_format))
            with ssh_agent.connect() as ssh_conn:
                yield ssh_agent_key(ssh_public, ssh_conn)
        finally:
            ssh_agent.stop()
        return
    agent = GpgAgent(home, passphrase=passphrase)
    agent.start()
    try:
        key = agent.import_secret_key(secret_key_file(key_dir, key_format))
        with agent.connect() as conn:
            yield openpgp_agent_key(key, conn)
    finally:
        agent.stop()


# -- the chain file ----------------------------------------------------------------------------


def read_chain(key_dir: Path) -> list[bytes] | None:
    """The certificates (DER) of ``key_dir``'s chain file; None when there is none."""
    path = key_dir / TSA_CHAIN_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TsaError(f"cannot read the TSA certificate chain {path}: {exc}") from None
    try:
        return parse_chain(data)
    except TspError as exc:
        raise TsaError(f"{path}: {exc}") from None


def write_chain(key_dir: Path, chain: Sequence[bytes]) -> Path:
    """Replace ``key_dir``'s chain file with ``chain`` (PEM, mode 0644, atomically)."""
    path = key_dir / TSA_CHAIN_FILE
    tmp = key_dir / f".{TSA_CHAIN_FILE}.{os.getpid()}.tmp"
    text = "".join(pem(der, "CERTIFICATE") for der in chain)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise TsaError(f"cannot write the TSA certificate chain {path}: {exc}") from None
    return path


def _parsed(data: bytes) -> list[bytes]:
    """`formats.tsp.certificates.parse_chain`, its error a `TsaError`."""
    try:
        return parse_chain(data)
    except TspError as exc:
        raise TsaError(str(exc)) from None


def check_chain(key_dir: Path, chain: Sequence[bytes], key: TsaKey) -> None:
    """`TsaError` naming ``key_dir``'s chain file unless ``chain`` (read from it) starts with a
    certificate of ``key``."""
    if not _same_key(chain[0], key.public_key_info):
        raise TsaError(
            f"the TSA certificate chain {key_dir / TSA_CHAIN_FILE} is for another key than "
            f"{key.name} (its first certificate holds another public key); remove "
            "it to have a self-signed certificate made, or import one for this key (stampd tsa "
            "import-cert)")


def _same_key(cert_der: bytes, public_key_info: bytes) -> bool:
    cert_key = x509.Certificate.load(cert_der)["tbs_certificate"]["subject_public_key_info"]
    return bool(cert_key.native == asn1_keys.PublicKeyInfo.load(public_key_info).native)


# -- certificates ------------------------------------------------------------------------------


def _subject(common_name: str) -> dict[str, str]:
    if not common_name.strip():
        raise TsaError("the TSA's name (its certificate's common name) is empty")
    return {"common_name": common_name, "organization_name": ORGANIZATION}


def ensure_certificate(key_dir: Path, key: TsaKey, subject: str, days: int,
                       clock: Callable[[], float] = time.time) -> bool:
    """Make ``key_dir``'s chain file a self-signed TSA certificate of ``key`` if there is none
    (True), or check that the chain there is ``key``'s (False).

    The certificate: v3, a random positive 71-bit serial, CN ``subject`` and O ``stampd``
    (subject and issuer), valid from an hour before now for ``days`` days, basicConstraints cA
    false, keyUsage digitalSignature and nonRepudiation (critical), extendedKeyUsage
    timeStamping (critical), subject and authority key identifiers. `TsaError` when the chain
    there cannot be read or is for another key."""
    chain = read_chain(key_dir)
    if chain is not None:
        check_chain(key_dir, chain, key)
        return False
    if days < 1:
        raise TsaError("a TSA certificate is valid for at least one day")
    now = datetime.fromtimestamp(int(clock()), UTC)
    algorithm = key.algorithm
    tbs = tbs_certificate(
        key.public_key_info,
        _subject(subject),
        serial=secrets.randbits(70) | 1 << 70,
        not_before=now - timedelta(hours=1),
        not_after=now + timedelta(days=days),
        signature_algorithm=algorithm,
    )
    write_chain(key_dir, [certificate(tbs, algorithm, key.signature(tbs))])
    return True


def csr(key: TsaKey, subject: str) -> bytes:
    """A PKCS#10 certificate request (DER) for ``key`` as a TSA, CN ``subject``, O ``stampd``,
    signed through the agent; it asks for the extensions of `ensure_certificate`."""
    info = certification_request_info(key.public_key_info, _subject(subject))
    return certification_request(info, key.algorithm, key.signature(info))


def check_import(public_key_info: bytes, chain_pem: bytes,
                 clock: Callable[[], float] = time.time) -> list[bytes]:
    """The certificates (DER) of ``chain_pem`` if it is a TSA chain for the key whose DER
    ``SubjectPublicKeyInfo`` is ``public_key_info``: the first certificate holds that key, is
    valid now and has extendedKeyUsage timeStamping alone and critical (RFC 3161 §2.3); each
    further certificate names the issuer of the one before. Signatures are not verified (an
    RFC 3161 client does that against its trust anchors). `TsaError` saying what is wrong."""
    chain = _parsed(chain_pem)
    first = x509.Certificate.load(chain[0])
    if not _same_key(chain[0], public_key_info):
        raise TsaError("the first certificate is not for this key (it holds another public key)")
    extension = next((e for e in first["tbs_certificate"]["extensions"]
                      if e["extn_id"].native == "extended_key_usage"), None)
    if extension is None or extension["extn_value"].native != ["time_stamping"]:
        raise TsaError("the first certificate is not a TSA certificate: its extended key usage "
                       "must be timeStamping alone")
    if not extension["critical"].native:
        raise TsaError("the first certificate's extended key usage timeStamping is not critical")
    now = datetime.fromtimestamp(int(clock()), UTC)
    validity = first["tbs_certificate"]["validity"]
    if not validity["not_before"].native <= now < validity["not_after"].native:
        raise TsaError("the first certificate is not valid now")
    for index in range(1, len(chain)):
        issued = x509.Certificate.load(chain[index - 1])
        issuer = x509.Certificate.load(chain[index])
        if issued.issuer != issuer.subject:
            raise TsaError(f"certificate {index + 1} of the chain is not the issuer of "
                           f"certificate {index}")
    return chain


# -- tokens ------------------------------------------------------------------------------------


def build_token(job: TimestampJob, key: TsaKey, chain: Sequence[bytes]) -> bytes:
    """The time-stamp token (a DER CMS ``ContentInfo``) of ``job``, signed by ``key`` whose
    certificate is ``chain[0]``: the TSTInfo names the TSA by that certificate's subject, the
    certificates are embedded when the client asked (``cert_req``)."""
    token = build_tokens([job], key, chain)[0]
    if isinstance(token, Exception):
        raise token
    return token


def build_tokens(jobs: Sequence[TimestampJob], key: TsaKey, chain: Sequence[bytes]
                 ) -> list[bytes | ValueError]:
    """`build_token` of each of ``jobs``, signed in one agent round trip (`TsaKey.signatures`);
    a job that cannot make a token gets its error (a `ValueError`) in its place, the others
    their tokens. The agent's errors propagate."""
    if not chain:
        raise TsaError("this key has no TSA certificate")
    name = subject_of(chain[0])
    out: list[bytes | ValueError | None] = [None] * len(jobs)
    unsigned: list[tuple[int, UnsignedToken]] = []
    for i, job in enumerate(jobs):
        try:
            fields = TokenFields(
                policy=job.policy,
                hash_algorithm=job.hash_algorithm,
                digest=bytes.fromhex(job.digest),
                serial=job.serial,
                gen_time=datetime.fromtimestamp(job.time, UTC),
                accuracy_seconds=job.accuracy,
                nonce=job.nonce_value,
                tsa_name=name,
            )
            unsigned.append((i, prepare_token(fields, key.algorithm, chain,
                                              include_certificates=job.cert_req)))
        except ValueError as e:
            out[i] = e
    signatures = key.signatures([u.signed_bytes for _, u in unsigned])
    for (i, u), signature in zip(unsigned, signatures, strict=True):
        out[i] = u.finish(signature)
    return [o if o is not None else TsaError("not built") for o in out]
