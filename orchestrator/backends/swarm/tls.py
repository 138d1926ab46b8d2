"""The credentials of mutual TLS between controllers and node relays: a private CA and two certificates.

``ensure_credentials`` makes them once in a private directory (0700; keys 0600) and reuses them
afterwards: a CA, the relays' server certificate (``DNS:orchestrator-relay``, serverAuth) and
the controllers' client certificate (clientAuth), all ECDSA P-256. The relay's three files
reach the relays as Swarm secrets (``Credentials.relay_files``); ``client_context`` is the
controller's side. A relay verifies that a client's certificate comes from this CA and a
controller that the relay's does, so a store's relays serve only that store's controllers.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import secrets
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ...agent import rendezvous
from ...errors import ConfigError
from ...files import replace_file

logger = logging.getLogger(__name__)

RELAY_NAME = "orchestrator-relay"
"""The name in the relay's certificate, which controllers check (whatever address they dial)."""
CONTROLLER_NAME = "orchestrator-controller"
CA_CERT, CA_KEY = "ca.crt", "ca.key"
RELAY_CERT, RELAY_KEY = "relay.crt", "relay.key"
CONTROLLER_CERT, CONTROLLER_KEY = "controller.crt", "controller.key"

_CA_DAYS = 20 * 365
_LEAF_DAYS = 10 * 365
_RENEW_DAYS = 30  # a certificate this close to its end is made anew
_BACKDATE = datetime.timedelta(days=1)  # nodes whose clocks lag still accept a fresh certificate
_SETTING = "Settings.state_dir (ORCH_STATE_DIR)"


@dataclass(frozen=True)
class Credentials:
    """Where the credentials are, and the relay's files' contents (for Swarm secrets).

    Attributes:
        directory: the private directory that holds them.
        ca_cert, ca_key: the CA's certificate and key (the key never leaves this directory).
        relay_cert, relay_key: the relays' certificate and key.
        controller_cert, controller_key: the controllers' certificate and key.
        ca_pem, relay_cert_pem, relay_key_pem: the PEM contents of ``ca_cert``, ``relay_cert`` and ``relay_key``.
    """

    directory: Path
    ca_cert: Path
    ca_key: Path
    relay_cert: Path
    relay_key: Path
    controller_cert: Path
    controller_key: Path
    ca_pem: bytes
    relay_cert_pem: bytes
    relay_key_pem: bytes

    def relay_files(self) -> dict[str, bytes]:
        """File name -> contents of what a relay needs: its certificate and key, and the CA certificate."""
        return {RELAY_CERT: self.relay_cert_pem, RELAY_KEY: self.relay_key_pem, CA_CERT: self.ca_pem}


def ensure_credentials(directory: Path) -> Credentials:
    """The CA and both certificates in ``directory``, made the first time (and whatever is missing, expiring
    or not signed by the CA there is made again); several processes may call it at once.

    Args:
        directory: a private directory (created 0700 if missing), such as ``<state_dir>/swarm-tls``.

    Returns:
        Their paths and the relay's PEM contents.

    Raises:
        ConfigError: the directory is not private, or its CA certificate exists without its key.
    """
    try:
        directory = rendezvous.ensure_private_dir(Path(directory), _SETTING)
    except rendezvous.RendezvousError as exc:
        raise ConfigError(str(exc)) from None
    with _locked(directory / ".lock"):
        ca_cert, ca_key, made = _ensure_ca(directory)
        now = datetime.datetime.now(datetime.timezone.utc)
        for cert_name, key_name, common_name, usage, names in (
            (RELAY_CERT, RELAY_KEY, RELAY_NAME, ExtendedKeyUsageOID.SERVER_AUTH, [RELAY_NAME]),
            (CONTROLLER_CERT, CONTROLLER_KEY, CONTROLLER_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, [CONTROLLER_NAME]),
        ):
            if made or not _still_good(directory / cert_name, directory / key_name, ca_cert, now):
                key = ec.generate_private_key(ec.SECP256R1())
                cert = _leaf(common_name, names, usage, key, ca_cert, ca_key, now)
                _save(directory / key_name, key, directory / cert_name, cert)
                logger.info("made the %s certificate in %s", common_name, directory)
    return Credentials(
        directory=directory,
        ca_cert=directory / CA_CERT,
        ca_key=directory / CA_KEY,
        relay_cert=directory / RELAY_CERT,
        relay_key=directory / RELAY_KEY,
        controller_cert=directory / CONTROLLER_CERT,
        controller_key=directory / CONTROLLER_KEY,
        ca_pem=(directory / CA_CERT).read_bytes(),
        relay_cert_pem=(directory / RELAY_CERT).read_bytes(),
        relay_key_pem=(directory / RELAY_KEY).read_bytes(),
    )


def client_context(credentials: Credentials) -> ssl.SSLContext:
    """The controller's side of mutual TLS: trust only relays our CA signed (named ``RELAY_NAME``), and present
    the controller's certificate. Wrap sockets with ``server_hostname=RELAY_NAME``.

    Raises:
        ConfigError: the credential files cannot be loaded.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cadata=credentials.ca_pem.decode("ascii"))
        context.load_cert_chain(credentials.controller_cert, credentials.controller_key)
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the relay credentials in {credentials.directory}: {exc}; delete the directory to have "
            "them made anew (then the relays must be deployed again)"
        ) from exc
    return context


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ensure_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The CA there, or a new one; True when it is new (so every certificate must be made again)."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() or key_path.exists():
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"the relay CA in {directory} is incomplete or unreadable ({exc}); delete the directory to have "
                "new credentials made (then the relays must be deployed again)"
            ) from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ConfigError(f"the relay CA key in {directory} does not match its certificate; delete the directory")
        return cert, key, False
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"orchestrator relay CA {secrets.token_hex(4)}")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _save(key_path, key, cert_path, cert)
    logger.info("made a relay CA in %s", directory)
    return cert, key, True


def _leaf(
    common_name: str,
    names: list[str],
    usage: x509.ObjectIdentifier,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
) -> x509.Certificate:
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _still_good(cert_path: Path, key_path: Path, ca_cert: x509.Certificate, now: datetime.datetime) -> bool:
    """The certificate and key there load, match, are signed by the CA and stay valid for a while."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert.verify_directly_issued_by(ca_cert)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    return key.public_key() == cert.public_key() and cert.not_valid_after_utc - now > datetime.timedelta(
        days=_RENEW_DAYS
    )


def _save(key_path: Path, key: ec.EllipticCurvePrivateKey, cert_path: Path, cert: x509.Certificate) -> None:
    """Write a key (0600) and its certificate (0644), each replaced whole and flushed to disk."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    replace_file(key_path, pem, fsync=True, mode=0o600)
    replace_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), fsync=True, mode=0o644)
