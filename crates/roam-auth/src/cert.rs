//! Making the cluster's certificates (what `roam cert` writes).
//!
//! In the style of etcd's and Kubernetes' set-up: one **cluster CA**,
//! self-signed, which every party trusts, and one certificate per party,
//! each carrying exactly one role (`crate::role`, a `roam:role:...` URI):
//! - **node**: the node name as CN and DNS name, plus any extra DNS names
//!   and addresses; server and client auth (a node serves two ports and
//!   calls other nodes, gateways and the planner);
//! - **gateway**: like a node's (server and client auth): it serves nodes
//!   on its control port and, with `roam gateway --planner`, asks the
//!   planner who may serve a service; every other port refuses its role;
//! - **planner**: like a node's (it serves its API and calls nodes);
//! - **client** (an operator): the name as CN only, client auth only, so it
//!   opens control APIs but can never serve or pose as a node.
//!
//! `localhost` and the loopback addresses are never added unless asked for
//! ([`Reach::local`]): a certificate that names `127.0.0.1` vouches for
//! whatever answers on that port of any machine it is copied to.
//!
//! Keys are ECDSA P-256. Everything is PEM.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::role::Role;

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

/// Where a server certificate may be reached: extra DNS names and
/// addresses besides its name.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    /// Extra DNS names.
    pub dns: Vec<String>,
    /// Addresses.
    pub ips: Vec<IpAddr>,
    /// Also `localhost`, `127.0.0.1` and `::1` (`roam cert --local`): for a
    /// daemon reached on the same machine. Off by default, so that a
    /// certificate does not vouch for whatever answers on a loopback port.
    pub local: bool,
}

fn check_client_name(name: &str) -> Result<(), CertError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(CertError::BadName(name.to_string()));
    }
    Ok(())
}

/// A certificate for a server role (node, gateway, planner): `name` as CN
/// and DNS name, the extra names of `reach`, the role URI and `ekus`.
fn make_server(
    ca: &Pem,
    role: Role,
    name: &str,
    reach: &Reach,
    ekus: Vec<ExtendedKeyUsagePurpose>,
    v: Validity,
) -> Result<Pem, CertError> {
    if !valid_node_name(name) {
        return Err(CertError::BadName(name.to_string()));
    }
    let mut names: Vec<String> = vec![name.to_string()];
    let mut addrs: Vec<IpAddr> = Vec::new();
    if reach.local {
        names.push("localhost".into());
        addrs.extend([
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ]);
    }
    for d in &reach.dns {
        if !valid_node_name(d) {
            return Err(CertError::BadName(d.clone()));
        }
        if !names.contains(d) {
            names.push(d.clone());
        }
    }
    for ip in &reach.ips {
        if !addrs.contains(ip) {
            addrs.push(*ip);
        }
    }
    let mut p = params(name, v)?;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = ekus;
    for n in names {
        let ia5 = n
            .as_str()
            .try_into()
            .map_err(|_| CertError::BadName(n.clone()))?;
        p.subject_alt_names.push(SanType::DnsName(ia5));
    }
    p.subject_alt_names
        .extend(addrs.into_iter().map(SanType::IpAddress));
    p.subject_alt_names.push(role_san(role)?);
    sign(ca, p)
}

fn role_san(role: Role) -> Result<SanType, CertError> {
    Ok(SanType::URI(role.uri().as_str().try_into()?))
}

/// A node certificate for `name`, signed by `ca`, also valid for the
/// extra DNS names and addresses (and nothing else: `localhost` and the
/// loopback addresses only through [`make_node_reach`] with `local`).
/// Role `node`; server and client auth.
pub fn make_node(
    ca: &Pem,
    name: &str,
    dns: &[String],
    ips: &[IpAddr],
    v: Validity,
) -> Result<Pem, CertError> {
    let reach = Reach {
        dns: dns.to_vec(),
        ips: ips.to_vec(),
        local: false,
    };
    make_node_reach(ca, name, &reach, v)
}

/// A node certificate for `name`, reachable as `reach` says.
pub fn make_node_reach(ca: &Pem, name: &str, reach: &Reach, v: Validity) -> Result<Pem, CertError> {
    make_server(
        ca,
        Role::Node,
        name,
        reach,
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        v,
    )
}

/// A gateway certificate for `name`: role `gateway`, server auth (its
/// control port) and client auth (its one question to the planner: who may
/// serve a service). The client usage opens nothing else: a node's control
/// API and migration port, a gateway's control port and every other
/// planner route refuse the `gateway` role.
pub fn make_gateway(ca: &Pem, name: &str, reach: &Reach, v: Validity) -> Result<Pem, CertError> {
    make_server(
        ca,
        Role::Gateway,
        name,
        reach,
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        v,
    )
}

/// The planner's certificate for `name`: role `planner`, server auth (its
/// API) and client auth (its calls to nodes).
pub fn make_planner(ca: &Pem, name: &str, reach: &Reach, v: Validity) -> Result<Pem, CertError> {
    make_server(
        ca,
        Role::Planner,
        name,
        reach,
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        v,
    )
}

/// An operator's client certificate for `name`, signed by `ca`: role
/// `client`, client auth only, no DNS name.
pub fn make_client(ca: &Pem, name: &str, v: Validity) -> Result<Pem, CertError> {
    check_client_name(name)?;
    let mut p = params(name, v)?;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.subject_alt_names.push(role_san(Role::Client)?);
    sign(ca, p)
}

#[cfg(test)]
mod tests;
