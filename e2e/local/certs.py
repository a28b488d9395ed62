"""The certificates of a local cluster, made with `cryptography`.

One CA signs the API server's serving certificate and a client certificate per identity
(the admin in `system:masters`, the controller manager, the scheduler); a separate key
pair signs service-account tokens. Keys are ECDSA P-256: generating them is instant,
which keeps a cold `up` short, and every component accepts them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from e2e.local.paths import StateLayout

VALIDITY = dt.timedelta(days=365)
# Clocks of the components and of this process may differ by a little.
BACKDATE = dt.timedelta(hours=1)


@dataclass(frozen=True)
class Identity:
    """What a certificate says: a client's user and groups, a server's names."""

    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = False


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


# The client identities of the cluster, by file name.
CLIENTS: dict[str, Identity] = {
    "admin": Identity("kubernetes-admin", organizations=("system:masters",)),
    "kube-controller-manager": Identity("system:kube-controller-manager"),
    "kube-scheduler": Identity("system:kube-scheduler"),
}

APISERVER = Identity(
    "kube-apiserver",
    dns_names=(
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ),
    ip_addresses=("127.0.0.1",),
    server=True,
)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(identity: Identity) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in identity.organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.common_name))
    return x509.Name(attributes)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What a CA and a leaf certificate share; a CA may sign certificates, a leaf may not."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def new_ca(common_name: str, now: dt.datetime) -> Issued:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key, now, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: Issued, identity: Identity, now: dt.datetime) -> Issued:
    """A leaf certificate for `identity`, signed by `ca`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the CA key must be an ECDSA key")
    key = _new_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if identity.server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(_name(identity), ca_cert.subject, key, now, ca=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    sans = _sans(identity.dns_names, identity.ip_addresses)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _sans(dns_names: Sequence[str], ips: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names.extend(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips)
    return names


def new_signing_key() -> Issued:
    """The service-account token key pair: `cert_pem` holds the public key."""
    key = _new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return Issued(public, _key_pem(key))


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)


def _save(layout: StateLayout, name: str, issued: Issued) -> None:
    _write(layout.cert(name), issued.cert_pem, private=False)
    _write(layout.key(name), issued.key_pem, private=True)


def ensure_pki(layout: StateLayout, now: dt.datetime) -> None:
    """Write every certificate and key that the state directory lacks.

    Existing files are kept, so a second `up` neither invalidates the kubeconfigs handed
    out nor the tokens signed by the service-account key.
    """
    if layout.cert("ca").exists() and layout.key("ca").exists():
        ca = Issued(layout.cert("ca").read_bytes(), layout.key("ca").read_bytes())
    else:
        ca = new_ca("modelpool-local-ca", now)
        _save(layout, "ca", ca)
    wanted: dict[str, Identity] = {"apiserver": APISERVER, **CLIENTS}
    for name, identity in wanted.items():
        if not (layout.cert(name).exists() and layout.key(name).exists()):
            _save(layout, name, issue(ca, identity, now))
    if not (layout.sa_public_key.exists() and layout.sa_private_key.exists()):
        signing = new_signing_key()
        _write(layout.sa_public_key, signing.cert_pem, private=False)
        _write(layout.sa_private_key, signing.key_pem, private=True)
