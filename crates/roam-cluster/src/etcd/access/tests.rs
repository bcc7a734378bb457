//! Loading the TLS material and the login: every bad file or mismatched
//! flag is refused before any connection, naming the flag.

use super::*;
use roam_auth::cert::{make_ca, make_client, Validity};

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    /// A CA, a client certificate it signed, and a second client
    /// certificate (whose key is not the first's).
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let v = Validity { days: 1 };
        let ca = make_ca("test-ca", v).unwrap();
        let one = make_client(&ca, "one", v).unwrap();
        let two = make_client(&ca, "two", v).unwrap();
        let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        w("ca.pem", &ca.cert);
        w("one.pem", &one.cert);
        w("one-key.pem", &one.key);
        w("two-key.pem", &two.key);
        w("junk", "not a PEM file\n");
        Files { dir }
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        Some(self.dir.path().join(name))
    }

    fn tls(&self, ca: &str, cert: &str, key: &str) -> EtcdAccessFiles {
        let opt = |n: &str| if n.is_empty() { None } else { self.path(n) };
        EtcdAccessFiles {
            ca: opt(ca),
            cert: opt(cert),
            key: opt(key),
            ..EtcdAccessFiles::default()
        }
    }

    fn password(&self, content: &[u8]) -> EtcdAccessFiles {
        let file = self.dir.path().join("password");
        std::fs::write(&file, content).unwrap();
        EtcdAccessFiles {
            user: Some("roam".into()),
            password_file: Some(file),
            ..EtcdAccessFiles::default()
        }
    }
}

/// The error's message with its causes, as the command line prints it.
fn chain(e: &EtcdAccessError) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[test]
fn no_flags_is_a_plain_anonymous_connection() {
    let a = EtcdAccessFiles::default().load().unwrap();
    assert!(!a.tls());
    assert!(!a.client_cert());
    assert_eq!(a.user(), None);
}

#[test]
fn good_tls_files_load() {
    let f = Files::new();
    let a = f.tls("ca.pem", "", "").load().unwrap();
    assert!(a.tls() && !a.client_cert());
    let a = f.tls("ca.pem", "one.pem", "one-key.pem").load().unwrap();
    assert!(a.tls() && a.client_cert());
}

#[test]
fn flags_that_go_together_are_checked() {
    let f = Files::new();
    for (files, flag) in [
        (f.tls("ca.pem", "one.pem", ""), "--etcd-key"),
        (f.tls("ca.pem", "", "one-key.pem"), "--etcd-cert"),
        (f.tls("", "one.pem", "one-key.pem"), "--etcd-ca"),
    ] {
        let e = files.load().unwrap_err().to_string();
        assert!(e.contains(flag), "{e}");
    }
    let mut half = f.password(b"pw");
    half.password_file = None;
    assert!(matches!(half.load(), Err(EtcdAccessError::HalfLogin)));
    let mut half = f.password(b"pw");
    half.user = None;
    assert!(matches!(half.load(), Err(EtcdAccessError::HalfLogin)));
}

#[test]
fn bad_pem_files_name_their_flag() {
    let f = Files::new();
    for (files, flag, what) in [
        (f.tls("missing.pem", "", ""), "--etcd-ca", "missing.pem"),
        (f.tls("junk", "", ""), "--etcd-ca", "junk"),
        (
            f.tls("ca.pem", "missing.pem", "one-key.pem"),
            "--etcd-cert",
            "missing.pem",
        ),
        (
            f.tls("ca.pem", "junk", "one-key.pem"),
            "--etcd-cert",
            "junk",
        ),
        (f.tls("ca.pem", "one.pem", "junk"), "--etcd-key", "junk"),
        (
            f.tls("ca.pem", "one.pem", "missing.pem"),
            "--etcd-key",
            "missing.pem",
        ),
    ] {
        let e = files.load().unwrap_err();
        let text = chain(&e);
        assert!(
            matches!(&e, EtcdAccessError::Pem { flag: f, .. } if *f == flag),
            "{flag}: {text}"
        );
        assert!(text.contains(what), "{text}");
    }
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let f = Files::new();
    let e = f
        .tls("ca.pem", "one.pem", "two-key.pem")
        .load()
        .unwrap_err();
    assert!(matches!(e, EtcdAccessError::Identity { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("--etcd-cert") && text.contains("--etcd-key"),
        "{text}"
    );
}

#[test]
fn the_password_is_the_file_less_one_newline() {
    let f = Files::new();
    for (content, want) in [
        (&b"s3cret"[..], "s3cret"),
        (b"s3cret\n", "s3cret"),
        (b"s3cret\r\n", "s3cret"),
        (b" two words \n\n", " two words \n"),
    ] {
        let a = f.password(content).load().unwrap();
        assert_eq!(a.user(), Some("roam"));
        assert_eq!(a.login.as_ref().unwrap().1, want, "{content:?}");
    }
}

#[test]
fn bad_password_files_are_refused() {
    let f = Files::new();
    let long = vec![b'x'; MAX_PASSWORD_BYTES + 1];
    for (content, why) in [
        (&b""[..], "empty"),
        (b"\n", "empty"),
        (b"\xff\xfe", "UTF-8"),
        (&long[..], "longer"),
    ] {
        let e = f.password(content).load().unwrap_err().to_string();
        assert!(e.contains("--etcd-password-file") && e.contains(why), "{e}");
    }
    // Exactly the limit is fine.
    f.password(&long[1..]).load().unwrap();
    let mut missing = f.password(b"pw");
    missing.password_file = f.path("nowhere");
    let e = missing.load().unwrap_err();
    assert!(matches!(e, EtcdAccessError::ReadPassword { .. }), "{e}");
    assert!(e.to_string().contains("nowhere"), "{e}");
}

#[test]
fn bad_user_names_are_refused() {
    let f = Files::new();
    for user in ["", "a\nb", &"u".repeat(MAX_USER_BYTES + 1)] {
        let mut files = f.password(b"pw");
        files.user = Some(user.to_string());
        let e = files.load().unwrap_err();
        assert!(matches!(e, EtcdAccessError::BadUser(_)), "{e}");
        assert!(e.to_string().contains("--etcd-user"), "{e}");
    }
}

#[cfg(unix)]
#[test]
fn a_password_file_others_can_read_is_reported() {
    use std::os::unix::fs::PermissionsExt;
    let f = Files::new();
    let files = f.password(b"pw");
    let file = files.password_file.clone().unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!files.load().unwrap().password_readable_by_others());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(files.load().unwrap().password_readable_by_others());
}

#[test]
fn debug_shows_no_secret() {
    let f = Files::new();
    let a = f.password(b"hunter2-very-secret").load().unwrap();
    let shown = format!("{a:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("roam"), "{shown}");
}
