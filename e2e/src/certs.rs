//! The control plane's certificates, generated with rcgen (ECDSA P-256): a CA, the API
//! server's serving certificate, the admin client certificate (`O=system:masters`) and the
//! service-account token signing key pair.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The files [`write`] creates.
#[derive(Debug, Clone)]
pub(crate) struct CertFiles {
    pub ca_cert: PathBuf,
    pub apiserver_cert: PathBuf,
    pub apiserver_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_public: PathBuf,
    pub sa_private: PathBuf,
}

/// The CA certificate's file name in the directory.
pub(crate) const CA_CERT: &str = "ca.crt";

/// The `kubernetes` Service's ClusterIP (the first of 10.96.0.0/24), which in-cluster clients
/// connect to.
const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// Generates every certificate and key into `dir`; the API server's certificate is also valid
/// for `address` and the `kubernetes` Service's ClusterIP.
pub(crate) fn write(dir: &Path, address: Ipv4Addr) -> anyhow::Result<CertFiles> {
    let files = CertFiles {
        ca_cert: dir.join(CA_CERT),
        apiserver_cert: dir.join("apiserver.crt"),
        apiserver_key: dir.join("apiserver.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_public: dir.join("sa.pub"),
        sa_private: dir.join("sa.key"),
    };

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sidecar-injector-e2e-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let apiserver_key = KeyPair::generate()?;
    let mut names: Vec<String> = [
        "127.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        KUBERNETES_SERVICE_IP,
    ]
    .map(String::from)
    .to_vec();
    if !address.is_loopback() {
        names.push(address.to_string());
    }
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let apiserver_cert = params.signed_by(&apiserver_key, &issuer)?;

    let admin_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    params.distinguished_name.push(DnType::CommonName, "admin");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = params.signed_by(&admin_key, &issuer)?;

    // kube-apiserver and the controller manager accept an ECDSA key for service-account
    // tokens (ES256) as well as RSA.
    let sa_key = KeyPair::generate()?;

    for (path, contents) in [
        (&files.ca_cert, ca_cert.pem()),
        (&files.apiserver_cert, apiserver_cert.pem()),
        (&files.apiserver_key, apiserver_key.serialize_pem()),
        (&files.admin_cert, admin_cert.pem()),
        (&files.admin_key, admin_key.serialize_pem()),
        (&files.sa_public, sa_key.public_key_pem()),
        (&files.sa_private, sa_key.serialize_pem()),
    ] {
        std::fs::write(path, contents)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(files)
}
