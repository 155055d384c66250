"""The deployment's private CA: `up` makes one (or loads the operator's) and issues the
controller's certificate, one per worker replica and the routers' (the `router` role), so each
party proves who it is.

Each worker actor is handed only its own key. The CA key is the operator's file (a Kubernetes
Secret), or one `up` made and keeps, owner-only, in the deployment's state directory
(`deployment_dir`), so that a later `up` can re-adopt the workers it certified.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from intentserve.common.tls import CONTROLLER, ROUTER, TlsIdentity, server_name

CERT_LIFETIME = datetime.timedelta(days=30)
CLOCK_SKEW = datetime.timedelta(minutes=5)
_PEM = serialization.Encoding.PEM


class PkiError(ValueError):
    """The operator's CA files cannot be used; the message names the file."""


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class DeploymentCa:
    def __init__(self, deployment: str, cert: x509.Certificate, key) -> None:
        self.deployment = deployment
        self._cert = cert
        self._key = key

    @classmethod
    def create(cls, deployment: str, now: datetime.datetime | None = None) -> DeploymentCa:
        """A fresh CA for one run of `up`."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        key = _key()
        name = _name(f"intentserve {deployment} CA")
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + CERT_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(deployment, cert, key)

    @classmethod
    def load(
        cls,
        deployment: str,
        cert_file: Path,
        key_file: Path,
        fields: tuple[str, str] = ("spec.security.caCertFile", "spec.security.caKeyFile"),
    ) -> DeploymentCa:
        """The operator's CA (e.g. mounted from a Kubernetes Secret), or one `up` kept; an
        error names the file by its `fields` (the manifest's, by default)."""
        cert_field, key_field = fields
        try:
            cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
        except (OSError, ValueError) as error:
            raise PkiError(f"{cert_field} {cert_file}: {error}") from None
        try:
            key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as error:
            raise PkiError(f"{key_field} {key_file}: {error}") from None
        if key.public_key().public_numbers() != cert.public_key().public_numbers():
            raise PkiError(f"{key_field} {key_file}: not the key of {cert_file}")
        return cls(deployment, cert, key)

    @property
    def valid_until(self) -> datetime.datetime:
        return self._cert.not_valid_after_utc

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(_PEM)

    def issue(
        self,
        holder: str,
        *,
        hosts: tuple[str, ...] = (),
        now: datetime.datetime | None = None,
        lifetime: datetime.timedelta = CERT_LIFETIME,
    ) -> TlsIdentity:
        """A certificate for `holder` (`controller` or a worker id), for both ends of TLS: its
        server name, plus `hosts` (addresses clients such as grpcurl may dial)."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        key = _key()
        names: list[x509.GeneralName] = [x509.DNSName(server_name(self.deployment, holder))]
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(holder))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return TlsIdentity(self.cert_pem, cert.public_bytes(_PEM), _key_pem(key))

    def controller_identity(self, hosts: tuple[str, ...]) -> TlsIdentity:
        return self.issue(CONTROLLER, hosts=("localhost", "127.0.0.1", *hosts))

    def router_identity(self, hosts: tuple[str, ...] = ()) -> TlsIdentity:
        """A router's certificate: it watches the controller's worker table, and workers take
        its streams (a role: every router may hold the same one)."""
        return self.issue(ROUTER, hosts=("localhost", "127.0.0.1", *hosts))

    def write(self, folder: Path) -> tuple[Path, Path]:
        """The CA's certificate and key as files (owner-only), for tests and for operators who
        want to keep one CA across runs."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        cert_file, key_file = folder / "ca.crt", folder / "ca.key"
        cert_file.write_bytes(self.cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(_key_pem(self._key))
        return cert_file, key_file
