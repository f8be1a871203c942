//! The helper process and its protocol.
//!
//! Frames are a little-endian u32 length and that many bytes. The helper
//! speaks first (hello: `{"protocol":1,"kubernetes":"v1.37.2"}`); then each
//! request (node name, NUL, the node's kubelet version or nothing, NUL, the
//! manifest's bytes) gets one verdict (JSON, see `verdict`). A Pod Security
//! request (`pod_security`) is another frame on the same process: the hello
//! says whether the helper knows it (`podSecurity`, the library's version).
//! So does the combined request (both questions on one decode of the
//! manifest, for a write held to a level): `"both":true` in the hello.
//! The helper answers frames in the order they came, one after another, so
//! several requests may be in flight ([`Helper::send`] then
//! [`Helper::answer`], see `prefetch`): every helper
//! since protocol 1 is asked so, and the hello needs no new word for it.
//!
//! Every wait is bounded: the helper's stdin and stdout are served by a
//! thread each, so a helper that stops reading or answering makes the call
//! time out instead of blocking the render; the helper is then killed by its
//! pid, which ends both threads. It starts with an empty environment but
//! its Go settings, `/` as its directory, no descriptors but its three pipes,
//! and, when podstamp is root with the capability to, drops to nobody
//! (65534) before it reads a byte (it also sets no-new-privileges and a
//! limit of 16 open files on itself). Its stderr lines are logged, each cut to 1 KiB.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::Unavailable;

/// The protocol this podstamp speaks.
const PROTOCOL: u64 = 1;
/// nobody: the helper needs no privilege.
const NOBODY: u32 = 65534;
/// The largest answer read: a verdict lists at most the pod's errors.
const MAX_ANSWER: usize = 16 << 20;
const MAX_LOG_LINE: usize = 1024;

pub struct Helper {
    child: Child,
    requests: Option<Sender<Vec<u8>>>,
    answers: Receiver<Result<Vec<u8>, String>>,
    kubernetes: String,
    /// The Pod Security library's version, when the helper has the check.
    pod_security: Option<String>,
    /// The helper answers the combined request.
    both: bool,
    last_used: Instant,
}

impl Helper {
    /// Starts the helper at `path` and reads its hello within `timeout`.
    pub fn start(path: &Path, timeout: Duration) -> Result<Helper, Unavailable> {
        let mut command = Command::new(path);
        command
            .env_clear()
            // One thread runs Go code, as one render at a time asks; the
            // collector keeps the heap near what a pod needs.
            .env("GOMAXPROCS", "1")
            .env("GOMEMLIMIT", "256MiB")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            command.arg("--user").arg(NOBODY.to_string());
        }
        let mut child = command.spawn().map_err(|e| {
            Unavailable(format!(
                "cannot start {}: {e}: build it with `bash tests/harness/build-kubecheck.sh`",
                path.display()
            ))
        })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let (requests, to_write) = mpsc::channel::<Vec<u8>>();
        let (answered, answers) = mpsc::channel();
        let spawned = spawn("kubecheck-write", move || write_requests(stdin, to_write))
            .and_then(|()| spawn("kubecheck-read", move || read_answers(stdout, answered)))
            .and_then(|()| spawn("kubecheck-log", move || log_lines(stderr)));
        let mut helper = Helper {
            child,
            requests: Some(requests),
            answers,
            kubernetes: String::new(),
            pod_security: None,
            both: false,
            last_used: Instant::now(),
        };
        if let Err(e) = spawned {
            helper.stop();
            return Err(Unavailable(format!("cannot start a thread for it: {e}")));
        }
        let hello = match helper.answer(timeout) {
            Ok(hello) => hello,
            Err(e) => {
                helper.stop();
                return Err(Unavailable(format!(
                    "{} did not start: {}",
                    path.display(),
                    e.0
                )));
            }
        };
        match parse_hello(&hello) {
            Ok(hello) => {
                helper.kubernetes = hello.kubernetes;
                helper.pod_security = hello.pod_security;
                helper.both = hello.both;
            }
            Err(e) => {
                helper.stop();
                return Err(Unavailable(format!("{}: {e}", path.display())));
            }
        }
        Ok(helper)
    }

    /// The Kubernetes release the helper said it checks for.
    pub fn kubernetes(&self) -> &str {
        &self.kubernetes
    }

    /// The version of Kubernetes' Pod Security library in the helper; None:
    /// a helper older than the Pod Security request.
    pub fn pod_security(&self) -> Option<&str> {
        self.pod_security.as_deref()
    }

    /// Does the helper answer the combined request (kubelet and Pod
    /// Security on one decode)? A helper that predates it does not.
    pub fn both(&self) -> bool {
        self.both
    }

    pub fn idle_for(&self) -> Duration {
        self.last_used.elapsed()
    }

    /// One request of `parts`, a NUL between each; its answer within `timeout`.
    pub fn call_parts(
        &mut self,
        parts: &[&[u8]],
        timeout: Duration,
    ) -> Result<Vec<u8>, Unavailable> {
        self.send(parts)?;
        self.answer(timeout)
    }

    /// Frames `parts` (a NUL between each) and hands it to the writing
    /// thread, without waiting for its answer: the helper answers frames in
    /// the order they came, so the caller reads the answers in that order
    /// ([`Helper::answer`]).
    pub fn send(&mut self, parts: &[&[u8]]) -> Result<(), Unavailable> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>() + parts.len().saturating_sub(1);
        let mut request = Vec::with_capacity(4 + len);
        request.extend_from_slice(&(len as u32).to_le_bytes());
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                request.push(0);
            }
            request.extend_from_slice(part);
        }
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|requests| requests.send(request).is_ok());
        if !sent {
            return Err(Unavailable("the pod check's process has stopped".into()));
        }
        Ok(())
    }

    /// The next answer, within `timeout`.
    pub fn answer(&mut self, timeout: Duration) -> Result<Vec<u8>, Unavailable> {
        let answer = self.answers.recv_timeout(timeout);
        self.last_used = Instant::now();
        match answer {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(Unavailable(format!("the pod check's process failed: {e}"))),
            Err(RecvTimeoutError::Timeout) => Err(Unavailable(format!(
                "the pod check did not answer within {} ms",
                timeout.as_millis()
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(Unavailable(format!(
                "the pod check's process ended ({})",
                self.exit_status()
            ))),
        }
    }

    fn exit_status(&mut self) -> String {
        // Its stdout closed: it has exited, or is about to.
        let deadline = Instant::now() + Duration::from_millis(200);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.to_string();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        "still running".into()
    }

    /// Closes its stdin, kills it by its pid and reaps it.
    pub fn stop(mut self) {
        self.requests = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
}

fn write_requests(mut stdin: impl Write, requests: Receiver<Vec<u8>>) {
    for request in requests {
        if stdin
            .write_all(&request)
            .and_then(|()| stdin.flush())
            .is_err()
        {
            return;
        }
    }
}

fn read_answers(stdout: impl Read, answers: Sender<Result<Vec<u8>, String>>) {
    let mut stdout = BufReader::new(stdout);
    loop {
        let mut len = [0u8; 4];
        if stdout.read_exact(&mut len).is_err() {
            return;
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_ANSWER {
            let _ = answers.send(Err(format!("an answer of {len} bytes")));
            return;
        }
        let mut answer = vec![0; len];
        let read = stdout.read_exact(&mut answer).map_err(|e| e.to_string());
        let failed = read.is_err();
        if answers.send(read.map(|()| answer)).is_err() || failed {
            return;
        }
    }
}

fn log_lines(stderr: impl Read) {
    for line in BufReader::new(stderr).split(b'\n') {
        let Ok(line) = line else { return };
        let line = String::from_utf8_lossy(&line[..line.len().min(MAX_LOG_LINE)]).into_owned();
        tracing::warn!("{}: {line}", super::HELPER_NAME);
    }
}

/// What the helper says of itself first.
#[derive(serde::Deserialize)]
struct Hello {
    protocol: u64,
    /// The Kubernetes release it checks for.
    kubernetes: String,
    /// The Pod Security library's version, if it has the check.
    #[serde(rename = "podSecurity")]
    pod_security: Option<String>,
    /// It answers the combined request.
    #[serde(default)]
    both: bool,
}

fn parse_hello(hello: &[u8]) -> Result<Hello, String> {
    let hello: Hello = serde_json::from_slice(hello).map_err(|e| {
        format!(
            "its first answer is not the pod check's greeting ({e}): is it {}?",
            super::HELPER_NAME
        )
    })?;
    if hello.protocol != PROTOCOL {
        return Err(format!(
            "it speaks protocol {}, this podstamp {PROTOCOL}: install the {} built with this podstamp",
            hello.protocol,
            super::HELPER_NAME
        ));
    }
    Ok(hello)
}
