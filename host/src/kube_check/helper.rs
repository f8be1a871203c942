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
//! [`Helper::answer`], see `prefetch`): every helper since protocol 1 is
//! asked so, and the hello needs no new word for it.
//!
//! Every wait is bounded: the helper's stdin and stdout are non-blocking
//! pipes, written and read by the calling thread itself between `poll`s
//! bounded by the call's deadline, so a helper that stops reading or
//! answering makes the call time out instead of blocking the render; the
//! helper is then killed by its pid. (Each call is a round trip of two
//! wake-ups, the helper's and the caller's: no thread in between, which on
//! a loaded machine waits for a core at every hand-over.) It starts with an
//! empty environment but its Go settings, `/` as its directory, no descriptors but its three pipes,
//! and, when podstamp is root with the capability to, drops to nobody
//! (65534) before it reads a byte (it also sets no-new-privileges and a
//! limit of 16 open files on itself). Its stderr lines are logged, each cut to 1 KiB.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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
    /// None once it is being stopped.
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// What was read from stdout and not yet returned as an answer.
    unread: Vec<u8>,
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
        let spawned = set_nonblocking(stdin.as_raw_fd())
            .and_then(|()| set_nonblocking(stdout.as_raw_fd()))
            .and_then(|()| spawn("kubecheck-log", move || log_lines(stderr)));
        let mut helper = Helper {
            child,
            stdin: Some(stdin),
            stdout,
            unread: Vec::new(),
            kubernetes: String::new(),
            pod_security: None,
            both: false,
            last_used: Instant::now(),
        };
        if let Err(e) = spawned {
            helper.stop();
            return Err(Unavailable(format!(
                "cannot set up its pipes or its log's thread: {e}"
            )));
        }
        let hello = match helper.read_answer(Instant::now() + timeout, timeout) {
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
        let deadline = Instant::now() + timeout;
        let answer = self
            .write_all(&frame(parts), deadline, timeout)
            .and_then(|()| self.read_answer(deadline, timeout));
        self.last_used = Instant::now();
        answer
    }

    /// Sends one request of `parts` without reading its answer, written
    /// within `timeout`: the helper answers in the order it was asked, and
    /// the caller reads the answers in that order ([`Helper::answer`]).
    pub fn send(&mut self, parts: &[&[u8]], timeout: Duration) -> Result<(), Unavailable> {
        let sent = self.write_all(&frame(parts), Instant::now() + timeout, timeout);
        self.last_used = Instant::now();
        sent
    }

    /// The oldest answer not read yet, within `timeout`.
    pub fn answer(&mut self, timeout: Duration) -> Result<Vec<u8>, Unavailable> {
        let answer = self.read_answer(Instant::now() + timeout, timeout);
        self.last_used = Instant::now();
        answer
    }

    /// Writes all of `request` by `deadline`. While the helper's stdin is
    /// full, what it answered meanwhile is read into `unread`: with several
    /// requests in flight, a helper blocked on a full stdout would never
    /// read the rest of its stdin.
    fn write_all(
        &mut self,
        mut request: &[u8],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), Unavailable> {
        while !request.is_empty() {
            let Some(stdin) = self.stdin.as_mut() else {
                return Err(Unavailable("the pod check's process has stopped".into()));
            };
            match stdin.write(request) {
                Ok(0) => return Err(self.ended()),
                Ok(n) => request = &request[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // Its pipe is full: it has not read the last bytes yet.
                    let stdin = stdin.as_raw_fd();
                    if wait_for_either(stdin, self.stdout.as_raw_fd(), deadline, timeout)? {
                        self.read_some()?;
                    }
                }
                // Its end of the pipe is closed: it has exited.
                Err(e) if e.kind() == ErrorKind::BrokenPipe => return Err(self.ended()),
                Err(e) => {
                    return Err(Unavailable(format!("the pod check's process failed: {e}")));
                }
            }
        }
        Ok(())
    }

    /// The next answer (a frame's payload), read by `deadline`.
    fn read_answer(
        &mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<u8>, Unavailable> {
        loop {
            if let Some(len) = self
                .unread
                .first_chunk::<4>()
                .map(|n| u32::from_le_bytes(*n))
            {
                let len = len as usize;
                if len > MAX_ANSWER {
                    return Err(Unavailable(format!(
                        "the pod check's process failed: an answer of {len} bytes"
                    )));
                }
                if self.unread.len() >= 4 + len {
                    let answer = self.unread[4..4 + len].to_vec();
                    self.unread.drain(..4 + len);
                    return Ok(answer);
                }
            }
            if !self.read_some()? {
                wait_for(self.stdout.as_raw_fd(), libc::POLLIN, deadline, timeout)?;
            }
        }
    }

    /// Reads what the helper's stdout holds into `unread`, without waiting;
    /// whether anything was read.
    fn read_some(&mut self) -> Result<bool, Unavailable> {
        let mut chunk = [0u8; 16 << 10];
        loop {
            match self.stdout.read(&mut chunk) {
                // Its stdout closed: it has exited, or is about to.
                Ok(0) => return Err(self.ended()),
                Ok(n) => {
                    self.unread.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) => {
                    return Err(Unavailable(format!("the pod check's process failed: {e}")));
                }
            }
        }
    }

    fn ended(&mut self) -> Unavailable {
        Unavailable(format!(
            "the pod check's process ended ({})",
            self.exit_status()
        ))
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
        self.stdin = None;
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

fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns (a child's pipe, held
    // open by the caller); F_GETFL and F_SETFL touch only its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One request of `parts`, a NUL between each, behind its length.
fn frame(parts: &[&[u8]]) -> Vec<u8> {
    let len = parts.iter().map(|p| p.len()).sum::<usize>() + parts.len().saturating_sub(1);
    let mut request = Vec::with_capacity(4 + len);
    request.extend_from_slice(&(len as u32).to_le_bytes());
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            request.push(0);
        }
        request.extend_from_slice(part);
    }
    request
}

/// Waits by `deadline` until `stdin` takes bytes or `stdout` has some:
/// true when `stdout` has (or is closed).
fn wait_for_either(
    stdin: RawFd,
    stdout: RawFd,
    deadline: Instant,
    timeout: Duration,
) -> Result<bool, Unavailable> {
    let mut fds = [pollfd(stdin, libc::POLLOUT), pollfd(stdout, libc::POLLIN)];
    poll_until(&mut fds, deadline, timeout)?;
    Ok(fds[1].revents != 0)
}

/// Waits until `fd` is ready for `events` (or closed: the next read or
/// write then says how), at most until `deadline`.
fn wait_for(
    fd: RawFd,
    events: libc::c_short,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), Unavailable> {
    poll_until(&mut [pollfd(fd, events)], deadline, timeout)
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Polls `fds` until one is ready, at most until `deadline` (then the
/// call's timeout is the error).
fn poll_until(
    fds: &mut [libc::pollfd],
    deadline: Instant,
    timeout: Duration,
) -> Result<(), Unavailable> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Unavailable(format!(
                "the pod check did not answer within {} ms",
                timeout.as_millis()
            )));
        }
        // Rounded up: a wait of 0 ms would spin until the deadline.
        let ms = left.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of pollfds, its length their count.
        match unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) } {
            n if n > 0 => return Ok(()),
            0 => {}
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(Unavailable(format!("the pod check's process failed: {e}")));
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A helper that greets and then runs `rest` (shell), its stdout kept
    /// open and never written again.
    fn silent_helper(dir: &Path, rest: &str) -> std::path::PathBuf {
        let hello = br#"{"protocol":1,"kubernetes":"v1.37.2"}"#;
        let mut frame = (hello.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(hello);
        let escaped: String = frame.iter().map(|b| format!("\\{b:03o}")).collect();
        let path = dir.join("silent-helper");
        std::fs::write(&path, format!("#!/bin/sh\nprintf '{escaped}'\n{rest}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_helper_that_reads_and_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut helper = Helper::start(
            &silent_helper(dir.path(), "while read -r line; do :; done"),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(helper.kubernetes(), "v1.37.2");
        let started = Instant::now();
        let e = helper
            .call_parts(
                &[b"n1", b"", b"apiVersion: v1\n"],
                Duration::from_millis(200),
            )
            .unwrap_err();
        assert_eq!(e.0, "the pod check did not answer within 200 ms");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        helper.stop();
    }

    #[test]
    fn a_helper_that_stops_reading_times_out_on_a_request_larger_than_its_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let mut helper = Helper::start(
            &silent_helper(dir.path(), "exec sleep 30"),
            Duration::from_secs(5),
        )
        .unwrap();
        // More than a pipe holds (64 KiB on Linux): the write itself waits.
        let manifest = vec![b'#'; 1 << 20];
        let e = helper
            .call_parts(&[b"n1", b"", &manifest], Duration::from_millis(200))
            .unwrap_err();
        assert_eq!(e.0, "the pod check did not answer within 200 ms");
        helper.stop();
    }

    /// Many requests in flight, both pipes full: the helper cannot read
    /// the next request until its answers are read, and the caller is still
    /// writing requests. The answers read meanwhile keep both going.
    #[test]
    fn requests_in_flight_larger_than_both_pipes_do_not_block_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("echo-helper");
        // Greets, then answers each frame with 32 KiB of its own.
        let script = r#"#!/usr/bin/env python3
import struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(b):
    out.write(struct.pack('<I', len(b)) + b); out.flush()
send(b'{"protocol":1,"kubernetes":"v1.37.2"}')
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    body = inp.read(struct.unpack('<I', head)[0])
    send(b'x' * (32 << 10) + str(len(body)).encode())
"#;
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut helper = Helper::start(&path, Duration::from_secs(10)).unwrap();
        let manifest = vec![b'#'; 200 << 10];
        for _ in 0..8 {
            helper
                .send(&[&manifest[..]], Duration::from_secs(10))
                .unwrap();
        }
        for _ in 0..8 {
            let answer = helper.answer(Duration::from_secs(10)).unwrap();
            assert!(answer.ends_with(format!("{}", 200 << 10).as_bytes()));
            assert_eq!(answer.len(), (32 << 10) + 6);
        }
        helper.stop();
    }

    #[test]
    fn a_helper_that_exits_after_its_greeting_is_said_to_have_ended() {
        let dir = tempfile::tempdir().unwrap();
        let mut helper =
            Helper::start(&silent_helper(dir.path(), "exit 0"), Duration::from_secs(5)).unwrap();
        let e = helper
            .call_parts(&[b"n1", b"", b"apiVersion: v1\n"], Duration::from_secs(5))
            .unwrap_err();
        // Whether the request's write or the answer's read finds it gone.
        assert_eq!(e.0, "the pod check's process ended (exit status: 0)");
        helper.stop();
    }
}
