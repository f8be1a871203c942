//! The baseline: tests/bench/kubectl-poller.sh, killed with its children
//! when dropped.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// tests/bench/kubectl-poller.sh in a process group of its own, so that it
/// and its kubectl and jq children go together.
pub struct Poller {
    pub child: Child,
}

impl Poller {
    pub fn start(args: &[&str], kubeconfig: &Path, log: &Path, once: bool) -> Poller {
        let mut command = Command::new("bash");
        command
            .arg(common::repo().join("tests/bench/kubectl-poller.sh"))
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .process_group(0);
        if once {
            command.env("POLL_ONCE", "1");
        }
        Poller {
            child: command
                .spawn()
                .expect("run bash tests/bench/kubectl-poller.sh"),
        }
    }

    /// Waits for it to exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        // SAFETY: signals the process group this Poller created, by its id.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
