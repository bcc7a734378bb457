//! `roam cert`: make the cluster CA, node certificates and operators'
//! client certificates, in the style of etcd's and Kubernetes' set-up.
//!
//! Why it refuses so much: these files are credentials. A key written
//! through a symlink someone planted, or over another node's key, or
//! readable by others, would undo what the certificates are for. So every
//! file is created new (`O_CREAT|O_EXCL|O_NOFOLLOW`), keys with mode 0600,
//! and nothing is replaced without `--force`.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use roam_node::roam_auth::cert::{self, Pem, Validity};

/// `roam cert`.
#[derive(Args, Debug)]
pub struct CertArgs {
    #[command(subcommand)]
    pub what: CertCommand,
}

/// What to make.
#[derive(Subcommand, Debug)]
pub enum CertCommand {
    /// Make a cluster CA: DIR/ca.pem and DIR/ca-key.pem.
    Ca(CaArgs),
    /// Make a node certificate signed by the CA: DIR/NAME.pem, DIR/NAME-key.pem.
    Node(NodeCertArgs),
    /// Make an operator's client certificate: DIR/NAME.pem, DIR/NAME-key.pem.
    Client(ClientCertArgs),
}

/// `roam cert ca`.
#[derive(Args, Debug)]
pub struct CaArgs {
    /// Directory to write into (created, mode 0700, if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// The CA's common name.
    #[arg(long, default_value = "roam cluster CA")]
    pub name: String,
    /// Validity, days.
    #[arg(long, default_value_t = 3650)]
    pub days: u32,
    /// Replace existing files.
    #[arg(long)]
    pub force: bool,
}

/// `roam cert node`.
#[derive(Args, Debug)]
pub struct NodeCertArgs {
    /// The node's name (`roam node --name`); a DNS name.
    pub name: String,
    /// Directory holding ca.pem and ca-key.pem.
    #[arg(long)]
    pub ca: PathBuf,
    /// Directory to write into (created, mode 0700, if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// An address clients reach the node at (repeatable; 127.0.0.1 and ::1
    /// are always included).
    #[arg(long = "ip", value_name = "ADDR")]
    pub ips: Vec<IpAddr>,
    /// A DNS name clients reach the node by (repeatable; NAME and
    /// localhost are always included).
    #[arg(long = "dns", value_name = "NAME")]
    pub dns: Vec<String>,
    /// Validity, days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Replace existing files.
    #[arg(long)]
    pub force: bool,
}

/// `roam cert client`.
#[derive(Args, Debug)]
pub struct ClientCertArgs {
    /// The operator's name (letters, digits, `-`, `.`).
    pub name: String,
    /// Directory holding ca.pem and ca-key.pem.
    #[arg(long)]
    pub ca: PathBuf,
    /// Directory to write into (created, mode 0700, if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Validity, days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Replace existing files.
    #[arg(long)]
    pub force: bool,
}

/// `roam cert ...`.
pub fn main(a: CertArgs) -> Result<i32> {
    match a.what {
        CertCommand::Ca(a) => ca(a),
        CertCommand::Node(a) => node(a),
        CertCommand::Client(a) => client(a),
    }
}

fn ca(a: CaArgs) -> Result<i32> {
    let pem = cert::make_ca(&a.name, Validity { days: a.days })?;
    let (c, k) = (a.out.join("ca.pem"), a.out.join("ca-key.pem"));
    write_pair(&a.out, &c, &k, &pem, a.force)?;
    let out = a.out.display();
    println!(
        "wrote {} (the cluster CA certificate: every node and operator needs it)",
        c.display()
    );
    println!(
        "wrote {} (the CA's private key, mode 0600: it can sign any node; keep it off the nodes)",
        k.display()
    );
    println!("next, one per node and one per operator:");
    println!("  roam cert node NAME --ca {out} --out {out} [--ip ADDR] [--dns NAME]");
    println!("  roam cert client NAME --ca {out} --out {out}");
    Ok(0)
}

fn node(a: NodeCertArgs) -> Result<i32> {
    if !cert::valid_node_name(&a.name) {
        bail!(
            "`{}` cannot be a node name in a certificate: use letters, digits, `-` and `.` \
             (a DNS name), and start the node with the same --name",
            a.name
        );
    }
    let ca = read_ca(&a.ca)?;
    let pem = cert::make_node(&ca, &a.name, &a.dns, &a.ips, Validity { days: a.days })?;
    let (c, k) = (
        a.out.join(format!("{}.pem", a.name)),
        a.out.join(format!("{}-key.pem", a.name)),
    );
    write_pair(&a.out, &c, &k, &pem, a.force)?;
    let mut dns = vec![a.name.clone(), "localhost".into()];
    dns.extend(a.dns.iter().cloned());
    let mut ips = vec!["127.0.0.1".to_string(), "::1".into()];
    ips.extend(a.ips.iter().map(ToString::to_string));
    println!(
        "wrote {} (node certificate for {}: DNS {}; IP {}; server and client auth; {} days)",
        c.display(),
        a.name,
        dns.join(", "),
        ips.join(", "),
        a.days
    );
    println!("wrote {} (its private key, mode 0600)", k.display());
    println!("next: copy the CA certificate and these two files to the node, and start it with");
    println!(
        "  roam node --name {} --tls-ca {} --tls-cert {} --tls-key {} --listen ADDR:PORT",
        a.name,
        a.ca.join("ca.pem").display(),
        c.display(),
        k.display()
    );
    Ok(0)
}

fn client(a: ClientCertArgs) -> Result<i32> {
    if !cert::valid_node_name(&a.name) {
        bail!(
            "`{}` cannot be a client name: use letters, digits, `-` and `.`",
            a.name
        );
    }
    let ca = read_ca(&a.ca)?;
    let pem = cert::make_client(&ca, &a.name, Validity { days: a.days })?;
    let (c, k) = (
        a.out.join(format!("{}.pem", a.name)),
        a.out.join(format!("{}-key.pem", a.name)),
    );
    write_pair(&a.out, &c, &k, &pem, a.force)?;
    println!(
        "wrote {} (client certificate for {}: client auth only; {} days)",
        c.display(),
        a.name,
        a.days
    );
    println!("wrote {} (its private key, mode 0600)", k.display());
    println!("next: use them with every command that talks to a node, e.g.");
    println!(
        "  export ROAM_TLS_CA={} ROAM_TLS_CERT={} ROAM_TLS_KEY={}",
        a.ca.join("ca.pem").display(),
        c.display(),
        k.display()
    );
    println!("  roam cells --node https://NODE:7700");
    Ok(0)
}

fn read_ca(dir: &Path) -> Result<Pem> {
    let read = |f: &str| {
        let p = dir.join(f);
        std::fs::read_to_string(&p).with_context(|| {
            format!(
                "cannot read {}: give --ca the directory `roam cert ca --out` wrote",
                p.display()
            )
        })
    };
    Ok(Pem {
        cert: read("ca.pem")?,
        key: read("ca-key.pem")?,
    })
}

/// Write a certificate (0644) and its key (0600), both new files; refuse
/// before writing either if one exists and `force` is off.
fn write_pair(dir: &Path, cert: &Path, key: &Path, pem: &Pem, force: bool) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    for p in [cert, key] {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => bail!("{} is a directory", p.display()),
            Ok(_) if !force => bail!(
                "{} exists; nothing was written (give --force to replace it)",
                p.display()
            ),
            Ok(_) => {
                std::fs::remove_file(p).with_context(|| format!("cannot remove {}", p.display()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot check {}", p.display())),
        }
    }
    write_new(key, pem.key.as_bytes(), 0o600)?;
    write_new(cert, pem.cert.as_bytes(), 0o644)
}

/// Create `path` (never an existing file, never through a symlink).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nofollow)
        .open(path)
        .with_context(|| {
            format!(
                "cannot create {} (it must not exist, not even as a symlink)",
                path.display()
            )
        })?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}
