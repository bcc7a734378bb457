//! Bearer tokens: the simpler way to protect a node's control API.
//!
//! A token is a shared secret read from a file (mode 0600 recommended; a
//! file others can read is reported by [`Token::load`]). Requests carry it
//! as `Authorization: Bearer TOKEN`; it is compared in constant time so
//! that the time an answer takes says nothing about how much of a guess
//! was right.

use std::path::{Path, PathBuf};

/// Shortest token accepted, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;

/// A bearer token. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Token {
    value: String,
    /// The token file is readable by group or others.
    pub loose_permissions: bool,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the token file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The token is too short, or holds characters a header cannot carry.
    #[error(
        "the token {from} is unusable: {why}; make one with \
         `head -c 32 /dev/urandom | base64 > token && chmod 600 token`"
    )]
    Bad {
        /// Where it came from.
        from: String,
        /// What is wrong with it.
        why: String,
    },
}

impl Token {
    /// Read a token from `path` (surrounding whitespace is ignored).
    pub fn load(path: &Path) -> Result<Token, TokenError> {
        let bytes = std::fs::read(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let from = format!("in {}", path.display());
        let value = String::from_utf8(bytes).map_err(|_| TokenError::Bad {
            from: from.clone(),
            why: "it is not UTF-8 text".into(),
        })?;
        let mut t = Token::new(value.trim(), &from)?;
        t.loose_permissions = readable_by_others(path);
        Ok(t)
    }

    /// A token given directly (e.g. from the environment); `from` names
    /// where it came from in errors.
    pub fn new(value: &str, from: &str) -> Result<Token, TokenError> {
        let bad = |why: String| TokenError::Bad {
            from: from.to_string(),
            why,
        };
        if value.len() < MIN_TOKEN_LEN {
            return Err(bad(format!(
                "it has {} bytes, at least {MIN_TOKEN_LEN} are needed",
                value.len()
            )));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad(
                "it holds spaces or characters outside printable ASCII".into()
            ));
        }
        Ok(Token {
            value: value.to_string(),
            loose_permissions: false,
        })
    }

    /// The value of an `Authorization` header carrying this token.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.value)
    }

    /// Does an `Authorization` header value carry this token? Constant
    /// time in the token's and the guess's contents (both are hashed first,
    /// so not even the length leaks).
    pub fn matches_header(&self, header: &[u8]) -> bool {
        let presented = header.strip_prefix(b"Bearer ").unwrap_or(b"");
        constant_time_eq(self.value.as_bytes(), presented)
    }
}

/// Compare two secrets in time that depends on neither: hash both, then
/// fold the difference of the digests without an early exit.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (blake3::hash(a), blake3::hash(b));
    let diff = ha
        .as_bytes()
        .iter()
        .zip(hb.as_bytes())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether a secret's file can be read (or written) by its group or by
/// others: the caller should warn, as secrets belong in mode 0600 files.
/// False when the file's mode cannot be read, and off Unix.
#[cfg(unix)]
pub fn readable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0)
}

/// Whether a secret's file can be read by others: never known off Unix.
#[cfg(not(unix))]
pub fn readable_by_others(_: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_token_matches_and_others_do_not() {
        let t = Token::new("0123456789abcdef-secret", "test").unwrap();
        assert!(t.matches_header(b"Bearer 0123456789abcdef-secret"));
        assert!(!t.matches_header(b"Bearer 0123456789abcdef-secreT"));
        assert!(!t.matches_header(b"Bearer 0123456789abcdef-secret "));
        assert!(!t.matches_header(b"Bearer 0123456789abcdef"));
        assert!(!t.matches_header(b"0123456789abcdef-secret"));
        assert!(!t.matches_header(b"Basic 0123456789abcdef-secret"));
        assert!(!t.matches_header(b""));
        assert_eq!(format!("{t:?}"), "Token(..)");
    }

    #[test]
    fn short_or_odd_tokens_are_refused_with_a_way_out() {
        let e = Token::new("short", "test").unwrap_err().to_string();
        assert!(e.contains("at least 16"), "{e}");
        assert!(e.contains("/dev/urandom"), "{e}");
        assert!(Token::new("0123456789abcdef ghi", "test").is_err());
    }

    #[test]
    fn a_token_file_is_trimmed_and_its_permissions_reported() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        std::fs::write(&p, "0123456789abcdef-secret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = Token::load(&p).unwrap();
        assert!(!t.loose_permissions);
        assert!(t.matches_header(b"Bearer 0123456789abcdef-secret"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Token::load(&p).unwrap().loose_permissions);
        let missing = Token::load(&d.path().join("nope")).unwrap_err();
        assert!(matches!(missing, TokenError::Read { .. }), "{missing}");
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }
}
