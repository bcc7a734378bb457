//! A real headless Chromium for the dashboard's tests, driven two ways:
//! as a command (`--dump-dom`, which prints the page's DOM after its
//! scripts ran), and over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: commands on fd 3, answers on fd 4, each a
//! JSON message ended by a NUL byte), to type in the page, click its
//! buttons and take screenshots as a person would.
//!
//! Why a pipe and not the usual WebSocket: it needs no client library and
//! no port; the browser is this process's child and talks to it alone.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;

/// The browser's command.
pub const CHROMIUM: &str = "chromium";
/// The flags every run takes: headless, no GPU, no sandbox (tests may run
/// as root or in a container without user namespaces).
const FLAGS: [&str; 6] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
];
/// How long one protocol command may take.
const CALL: Duration = Duration::from_secs(60);

/// Whether Chromium can be run; if not, fail under CI (naming it) or
/// print why the test is skipped and return false.
pub fn have_chromium() -> bool {
    if roam_testkit::have(CHROMIUM) {
        return true;
    }
    roam_testkit::missing(&roam_testkit::CHROMIUM, "`chromium --version` did not run");
    false
}

/// `chromium --dump-dom URL`: the page's DOM once its scripts had
/// `budget_ms` of virtual time (network waits do not count).
pub fn dump_dom(url: &str, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(CHROMIUM);
    cmd.args(FLAGS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url);
    let out = run_bounded(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "chromium --dump-dom {url}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A Chromium driven over the DevTools protocol, with one page open;
/// killed on drop.
pub struct Browser {
    child: Child,
    to: File,
    from: mpsc::Receiver<Value>,
    next: u64,
    session: String,
    _profile: tempfile::TempDir,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are open and owned by no one else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Start Chromium and open `url` in a page of `width` × `height`.
    pub fn open(url: &str, width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (cmd_r, cmd_w) = pipe();
        let (ans_r, ans_w) = pipe();
        let (r, w) = (cmd_r.as_raw_fd(), ans_w.as_raw_fd());
        let mut cmd = Command::new(CHROMIUM);
        cmd.args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--remote-debugging-pipe")
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(profile.path().join("chromium.log")).unwrap());
        // SAFETY: only async-signal-safe calls between fork and exec: move
        // the two ends above 10 first (so neither is overwritten), then
        // onto 3 and 4, which dup2 leaves open across exec.
        unsafe {
            cmd.pre_exec(move || {
                let a = libc::fcntl(r, libc::F_DUPFD, 10);
                let b = libc::fcntl(w, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMIUM}: {e}"));
        drop((cmd_r, ans_w));
        let (tx, from) = mpsc::channel();
        let mut ans = File::from(ans_r);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            while let Ok(n) = ans.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|b| *b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice(&msg[..end]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to: File::from(cmd_w),
            from,
            next: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = b.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().unwrap().to_string();
        let s = b.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        b.session = s["sessionId"].as_str().unwrap().to_string();
        b.page("Page.enable", json!({}));
        b.page(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
        b.page("Page.navigate", json!({"url": url}));
        b
    }

    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to
            .write_all(&bytes)
            .unwrap_or_else(|e| panic!("{method}: the browser is gone: {e}"));
        loop {
            let v = self
                .from
                .recv_timeout(CALL)
                .unwrap_or_else(|e| panic!("{method}: no answer from the browser: {e}"));
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
        }
    }

    /// A protocol command on the page.
    pub fn page(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.call(Some(&s), method, params)
    }

    /// Evaluate `js` in the page (a promise is awaited): its value, or a
    /// panic with the exception.
    pub fn eval(&mut self, js: &str) -> Value {
        let r = self.page(
            "Runtime.evaluate",
            json!({"expression": js, "awaitPromise": true, "returnByValue": true}),
        );
        assert!(
            r["exceptionDetails"].is_null(),
            "{js}\nthrew: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// Poll `js` (an expression) every 100 ms until it is truthy: its
    /// value; panic with `what` and the page's text after `limit`.
    pub fn wait(&mut self, what: &str, limit: Duration, js: &str) -> Value {
        let start = std::time::Instant::now();
        loop {
            let v = self.eval(&format!(
                "(() => {{ try {{ return {js}; }} catch (e) {{ return null; }} }})()"
            ));
            let truthy = !(v.is_null() || v == json!(false) || v == json!("") || v == json!(0));
            if truthy {
                return v;
            }
            if start.elapsed() > limit {
                let page = self.eval("document.body ? document.body.innerText : ''");
                panic!(
                    "timed out waiting for {what}; the page says:\n{}",
                    page.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The page, whole (not just the window), as PNG into `file`.
    pub fn screenshot(&mut self, file: &Path) {
        let r = self.page(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let png = base64_decode(r["data"].as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        std::fs::write(file, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (the protocol's screenshots), padding allowed.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let digits: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c) << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    out
}

#[test]
fn base64_decodes_with_and_without_padding() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode("YWJj"), b"abc");
}
