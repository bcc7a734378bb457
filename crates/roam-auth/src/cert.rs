//! Making the cluster's certificates (what `roam cert` writes).
//!
//! Three kinds, in the style of etcd's and Kubernetes' set-up:
//! - the **cluster CA**, self-signed, which every node and client trusts;
//! - a **node certificate**: the node name as CN and DNS name, plus
//!   `localhost`, `127.0.0.1`, `::1` and any extra DNS names and addresses,
//!   with both the server-auth and client-auth usages (a node is a server
//!   on its two ports and a client of other nodes);
//! - a **client certificate** for an operator: the name as CN only, client
//!   auth only, so it opens the control API but can never pose as a node
//!   on a migration port.
//!
//! Keys are ECDSA P-256. All three are PEM.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The private key (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The name cannot be a DNS name.
    #[error("`{0}` is not a usable node name: use letters, digits, `-` and `.` (a DNS name)")]
    BadName(String),
    /// The CA files are not a CA certificate and its key.
    #[error("the CA certificate and key cannot be used to sign; give the directory `roam cert ca` wrote")]
    BadCa(#[source] rcgen::Error),
    /// rcgen failed.
    #[error("cannot make the certificate")]
    Make(#[from] rcgen::Error),
}

/// Validity of a certificate.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// Days from now.
    pub days: u32,
}

fn params(cn: &str, v: Validity) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "roam");
    p.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    // A little slack for clocks that disagree.
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(i64::from(v.days));
    let mut serial = [0u8; 16];
    getrandom::fill(&mut serial).expect("the OS random source works");
    serial[0] &= 0x7f;
    p.serial_number = Some(SerialNumber::from_slice(&serial));
    p.use_authority_key_identifier_extension = true;
    Ok(p)
}

/// Is `name` usable as a node name in a certificate (a DNS name)?
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A new cluster CA named `name`.
pub fn make_ca(name: &str, v: Validity) -> Result<Pem, CertError> {
    let key = KeyPair::generate()?;
    let mut p = params(name, v)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.use_authority_key_identifier_extension = false;
    let cert = p.self_signed(&key)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn sign(ca: &Pem, p: CertificateParams) -> Result<Pem, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key).map_err(CertError::BadCa)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(CertError::BadCa)?;
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A node certificate for `name`, signed by `ca`, also valid for the
/// extra DNS names and addresses.
pub fn make_node(
    ca: &Pem,
    name: &str,
    dns: &[String],
    ips: &[IpAddr],
    v: Validity,
) -> Result<Pem, CertError> {
    let mut names: Vec<String> = vec![name.to_string(), "localhost".to_string()];
    for d in dns {
        if !valid_node_name(d) {
            return Err(CertError::BadName(d.clone()));
        }
        if !names.contains(d) {
            names.push(d.clone());
        }
    }
    if !valid_node_name(name) {
        return Err(CertError::BadName(name.to_string()));
    }
    let mut addrs: Vec<IpAddr> = vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
    for ip in ips {
        if !addrs.contains(ip) {
            addrs.push(*ip);
        }
    }
    let mut p = params(name, v)?;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    for n in names {
        let ia5 = n
            .as_str()
            .try_into()
            .map_err(|_| CertError::BadName(n.clone()))?;
        p.subject_alt_names.push(SanType::DnsName(ia5));
    }
    p.subject_alt_names
        .extend(addrs.into_iter().map(SanType::IpAddress));
    sign(ca, p)
}

/// An operator's client certificate for `name`, signed by `ca`.
pub fn make_client(ca: &Pem, name: &str, v: Validity) -> Result<Pem, CertError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(CertError::BadName(name.to_string()));
    }
    let mut p = params(name, v)?;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    sign(ca, p)
}

#[cfg(test)]
mod tests;
