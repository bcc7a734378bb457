//! The credentials and nodes of the authentication tests: a cluster's
//! certificates and tokens made once per run with `roam cert` (and another
//! cluster's, which must open nothing), `roam` clients given exactly the
//! credentials a test names, and nodes started with TLS or token flags.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use super::*;

/// A cluster's credentials, made once per test run with `roam cert`.
pub struct Pki {
    pub dir: PathBuf,
    /// `roam cert`'s output, for the test that checks it.
    pub outputs: Vec<Output>,
}

pub fn roam_cert(args: &[&str]) -> Output {
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("cert").args(args);
    run_bounded(cmd, Duration::from_secs(60))
}

pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let d = dir.to_str().unwrap();
        let evil = dir.join("evil");
        let e = evil.to_str().unwrap();
        let mut outputs = Vec::new();
        // The daemons of these tests are reached on 127.0.0.1, so their
        // certificates name it (--local).
        for args in [
            vec!["ca", "--out", d],
            vec!["node", "node-a", "--ca", d, "--out", d, "--local"],
            vec![
                "node", "node-b", "--ca", d, "--out", d, "--ip", "10.0.0.5", "--dns", "b.local",
                "--local",
            ],
            vec!["client", "alice", "--ca", d, "--out", d],
            // Another cluster: its certificates must open nothing here.
            vec!["ca", "--out", e],
            vec!["client", "mallory", "--ca", e, "--out", e],
            vec!["node", "node-c", "--ca", e, "--out", e, "--local"],
            vec!["gateway", "gw", "--ca", d, "--out", d, "--local"],
            vec!["planner", "plan", "--ca", d, "--out", d, "--local"],
            // Not --local: a certificate names loopback only when asked.
            vec![
                "node", "node-far", "--ca", d, "--out", d, "--ip", "10.0.0.7",
            ],
        ] {
            let out = roam_cert(&args);
            assert!(
                out.status.success(),
                "roam cert {args:?}: {}",
                text(&out.stderr)
            );
            outputs.push(out);
        }
        std::fs::write(dir.join("token"), "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(dir.join("token"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::write(
            dir.join("wrong-token"),
            "fedcba9876543210fedcba9876543210\n",
        )
        .unwrap();
        Pki { dir, outputs }
    })
}

impl Pki {
    pub fn p(&self, f: &str) -> String {
        self.dir.join(f).to_str().unwrap().to_string()
    }

    /// Client flags: the CA, and a client certificate of `who` (in
    /// `dir`/`who`.pem) if given, and a token file if given.
    pub fn client(&self, ca: &str, who: Option<&str>, token: Option<&str>) -> Vec<String> {
        let mut v = vec!["--tls-ca".to_string(), self.p(ca)];
        if let Some(w) = who {
            v.extend([
                "--tls-cert".into(),
                self.p(&format!("{w}.pem")),
                "--tls-key".into(),
                self.p(&format!("{w}-key.pem")),
            ]);
        }
        if let Some(t) = token {
            v.extend(["--token-file".into(), self.p(t)]);
        }
        v
    }

    /// The operator with every credential the test nodes want.
    pub fn alice(&self) -> Vec<String> {
        self.client("ca.pem", Some("alice"), Some("token"))
    }

    pub fn node_flags(&self, name: &str) -> Vec<String> {
        let base = if name == "node-c" { "evil/" } else { "" };
        vec![
            "--name".into(),
            name.into(),
            "--tls-ca".into(),
            self.p(&format!("{base}ca.pem")),
            "--tls-cert".into(),
            self.p(&format!("{base}{name}.pem")),
            "--tls-key".into(),
            self.p(&format!("{base}{name}-key.pem")),
        ]
    }
}

/// A `roam` client command with exactly the credentials given (none from
/// the environment).
pub fn client_cmd(args: &[&str], creds: &[String]) -> Command {
    let mut cmd = roam(Isa::X86_64);
    for v in [
        "ROAM_TLS_CA",
        "ROAM_TLS_CERT",
        "ROAM_TLS_KEY",
        "ROAM_TOKEN",
        "ROAM_TOKEN_FILE",
    ] {
        cmd.env_remove(v);
    }
    cmd.args(args).args(creds);
    cmd
}

pub fn run_client(args: &[&str], creds: &[String]) -> Output {
    run_bounded(client_cmd(args, creds), Duration::from_secs(60))
}

/// A `roam node` process started with `flags`, killed on drop.
pub struct AuthNode {
    /// Control API URL (`https://` with TLS).
    pub url: String,
    /// Migration port, `127.0.0.1:port`.
    pub migrate: String,
    child: Child,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl AuthNode {
    /// Start a node; returns once it printed its addresses.
    pub fn start(flags: &[String]) -> AuthNode {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("node");
        if !flags.iter().any(|f| f == "--listen") {
            cmd.args(["--listen", "127.0.0.1:0", "--migrate-listen", "127.0.0.1:0"]);
        }
        cmd.arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(flags)
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        let mut child = cmd.spawn().unwrap();
        let (url, migrate) = wait_for("the node to listen", SLOW, || {
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "the node exited ({st}) before listening:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let l = std::fs::read_to_string(&log).unwrap_or_default();
            let rest = l.split("roam node listening: control ").nth(1)?;
            let mut w = rest.split_whitespace();
            let url = w.next()?.to_string();
            let migrate = w.nth(1)?.to_string();
            Some((url, migrate))
        });
        AuthNode {
            url,
            migrate,
            child,
            _dir: dir,
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `roam cells --json` with `creds`.
    pub fn cells(&self, creds: &[String]) -> Vec<Value> {
        let out = run_client(&["cells", "--node", &self.url, "--json"], creds);
        assert!(
            out.status.success(),
            "roam cells: {}\n{}",
            text(&out.stderr),
            self.log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn cell(&self, creds: &[String], id: &str) -> Option<Value> {
        self.cells(creds).into_iter().find(|c| c["id"] == id)
    }
}

impl Drop for AuthNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
