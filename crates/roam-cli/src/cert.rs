//! `roam cert`: make the cluster CA and one certificate per party, in the
//! style of etcd's and Kubernetes' set-up. Each certificate carries one
//! role (`roam cert node|gateway|planner|client`), and each port admits
//! only the roles it serves (`docs/trust.md`); a subcommand per role reads
//! better than a `--role` flag, and cannot be forgotten.
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
use roam_node::roam_auth::cert::{self, Pem, Reach, Validity};
use roam_node::roam_auth::Role;

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
    Node(ServerCertArgs),
    /// Make the gateway's certificate (serves nodes; asks only the planner
    /// who may serve a service).
    Gateway(ServerCertArgs),
    /// Make the planner's certificate (serves its API; calls nodes).
    Planner(ServerCertArgs),
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

/// `roam cert node|gateway|planner`.
#[derive(Args, Debug)]
pub struct ServerCertArgs {
    /// The name: for a node, its `roam node --name`; a DNS name.
    pub name: String,
    /// Directory holding ca.pem and ca-key.pem.
    #[arg(long)]
    pub ca: PathBuf,
    /// Directory to write into (created, mode 0700, if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// An address others reach it at (repeatable).
    #[arg(long = "ip", value_name = "ADDR")]
    pub ips: Vec<IpAddr>,
    /// A DNS name others reach it by (repeatable; NAME is always
    /// included).
    #[arg(long = "dns", value_name = "NAME")]
    pub dns: Vec<String>,
    /// Also name localhost, 127.0.0.1 and ::1: only for a daemon reached on
    /// its own machine (a test rig, a one-machine cluster).
    #[arg(long)]
    pub local: bool,
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
        CertCommand::Node(a) => server(Role::Node, a),
        CertCommand::Gateway(a) => server(Role::Gateway, a),
        CertCommand::Planner(a) => server(Role::Planner, a),
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
    println!("next, one per node, gateway, planner and operator:");
    println!("  roam cert node NAME --ca {out} --out {out} [--ip ADDR] [--dns NAME]");
    println!("  roam cert gateway NAME --ca {out} --out {out} --ip ADDR");
    println!("  roam cert planner NAME --ca {out} --out {out} --ip ADDR");
    println!("  roam cert client NAME --ca {out} --out {out}");
    Ok(0)
}

fn server(role: Role, a: ServerCertArgs) -> Result<i32> {
    if !cert::valid_node_name(&a.name) {
        bail!(
            "`{}` cannot be a {role} name in a certificate: use letters, digits, `-` and `.` \
             (a DNS name){}",
            a.name,
            if role == Role::Node {
                ", and start the node with the same --name"
            } else {
                ""
            }
        );
    }
    let ca = read_ca(&a.ca)?;
    let reach = Reach {
        dns: a.dns.clone(),
        ips: a.ips.clone(),
        local: a.local,
    };
    let v = Validity { days: a.days };
    let pem = match role {
        Role::Node => cert::make_node_reach(&ca, &a.name, &reach, v)?,
        Role::Gateway => cert::make_gateway(&ca, &a.name, &reach, v)?,
        Role::Planner => cert::make_planner(&ca, &a.name, &reach, v)?,
        Role::Client => unreachable!("client certificates are made by `client`"),
    };
    let (c, k) = (
        a.out.join(format!("{}.pem", a.name)),
        a.out.join(format!("{}-key.pem", a.name)),
    );
    write_pair(&a.out, &c, &k, &pem, a.force)?;
    let mut dns = vec![a.name.clone()];
    let mut ips = Vec::new();
    if a.local {
        dns.push("localhost".into());
        ips.extend(["127.0.0.1".to_string(), "::1".into()]);
    }
    dns.extend(a.dns.iter().cloned());
    ips.extend(a.ips.iter().map(ToString::to_string));
    let usage = match role {
        Role::Gateway => "server and client auth (client: only the planner's GET /v1/services)",
        _ => "server and client auth",
    };
    println!(
        "wrote {} ({role} certificate for {}: DNS {}; IP {}; {usage}; {} days)",
        c.display(),
        a.name,
        dns.join(", "),
        if ips.is_empty() {
            "none".to_string()
        } else {
            ips.join(", ")
        },
        a.days
    );
    println!("wrote {} (its private key, mode 0600)", k.display());
    if ips.is_empty() && a.dns.is_empty() {
        println!(
            "note: others can reach it only by the name {}; add --ip ADDR or --dns NAME for \
             the addresses they use (--local for this machine's loopback)",
            a.name
        );
    }
    let (ca_pem, cert, key) = (a.ca.join("ca.pem"), c.display(), k.display());
    let ca_pem = ca_pem.display();
    let start = match role {
        Role::Node => format!(
            "roam node --name {} --tls-ca {ca_pem} --tls-cert {cert} --tls-key {key} \
             --listen ADDR:PORT",
            a.name
        ),
        Role::Gateway => format!(
            "roam gateway --tls-ca {ca_pem} --tls-cert {cert} --tls-key {key} \
             --control ADDR:PORT --service NAME --listen ADDR:PORT --planner URL"
        ),
        _ => format!(
            "roam planner --tls-ca {ca_pem} --tls-cert {cert} --tls-key {key} --listen ADDR:PORT"
        ),
    };
    println!("next: copy the CA certificate and these two files to its machine, and start it with");
    println!("  {start}");
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
        "wrote {} (client certificate for {}: role client, client auth only; {} days)",
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
