//! A real node for the kubelet end-to-end tests: `podstamp-node` (from
//! tests/harness) runs containerd and the real kubelet under a directory of
//! the test, registered with the harness API server.
//!
//! Invariants: one node at a time on the machine (the kubelet uses fixed
//! host paths, and a node's cgroups are named after it), so every test
//! holds [`serial`] while its node runs, a lock of the whole machine: other
//! test processes (another checkout's suite, the kubelet benchmark) wait; a node is
//! torn down by its `Drop` (SIGTERM, then podstamp-node's ordered teardown),
//! also when the test fails; [`leftovers`] names anything a node left
//! running, mounted or in the cgroup tree.
#![allow(dead_code)]

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::common::harness_bin;
use crate::support::wait_for;

/// Held by each test while its node runs: this process's tests one at a
/// time (the mutex), and one process on the machine at a time (an flock(2)
/// on a file in /run, released when the guard's file is closed, also when
/// the process dies).
pub struct Serial {
    _file: fs::File,
    _guard: MutexGuard<'static, ()>,
}

pub fn serial() -> Serial {
    use std::os::fd::AsRawFd;
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let path = Path::new("/run/podstamp-kubelet-tests.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Blocks until no other process holds it.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    Serial {
        _file: file,
        _guard: guard,
    }
}

/// One container as the CRI reports it (`podstamp-node containers`).
#[derive(serde::Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    pub id: String,
    pub name: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub state: String,
    /// How many times the kubelet started this container of its pod before.
    #[serde(default)]
    pub attempt: u32,
    /// The image as the CRI names it (the image's id, `sha256:…`).
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
}

impl Container {
    pub fn running(&self) -> bool {
        self.state == "CONTAINER_RUNNING"
    }

    pub fn has_env(&self, pair: &str) -> bool {
        self.env.iter().flatten().any(|e| e == pair)
    }
}

/// A running `podstamp-node`: containerd + kubelet, registered as `name`.
pub struct Node {
    pub dir: PathBuf,
    pub name: String,
    pub cgroup_root: String,
    child: Option<Child>,
}

impl Node {
    /// Starts a node in `dir` (kept short: containerd's socket is in it)
    /// and waits until its Node object exists in the API server.
    pub fn start(dir: &Path, kubeconfig: &Path, name: &str) -> Node {
        Node::start_with(dir, kubeconfig, name, &[])
    }

    /// [`Node::start`] with extra podstamp-node flags (`--registry-hosts DIR`).
    pub fn start_with(dir: &Path, kubeconfig: &Path, name: &str, flags: &[&str]) -> Node {
        fs::create_dir_all(dir).unwrap();
        let log = fs::File::create(dir.join("podstamp-node.log")).unwrap();
        let mut command = Command::new(harness_bin("podstamp-node"));
        command
            .arg("--dir")
            .arg(dir)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--node-name", name])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // SIGTERM, not SIGKILL, if the thread that started it goes: the node
        // then still tears down what it started.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = command.spawn().expect("start podstamp-node");
        let pid = u64::from(child.id());
        let ready = dir.join("ready");
        let node_log = dir.join("podstamp-node.log");
        wait_for("the node's ready file", Duration::from_secs(120), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "podstamp-node exited with {status}:\n{}\n(the kubelet's and containerd's logs are in {})",
                    fs::read_to_string(&node_log).unwrap_or_default(),
                    dir.display()
                );
            }
            let text = fs::read_to_string(&ready).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            (value["pid"].as_u64() == Some(pid)).then_some(())
        });
        Node {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cgroup_root: format!("/podstamp-node-{name}"),
            child: Some(child),
        }
    }

    /// Restarts the node's kubelet alone, as systemd would: SIGUSR1 to
    /// podstamp-node (by its PID), which stops its kubelet and starts it
    /// again with the same config and flags, its containers left running;
    /// returns once the new kubelet's /healthz answers (podstamp-node's
    /// ready file counts the restart), with the new kubelet's PID.
    pub fn restart_kubelet(&self) -> u32 {
        let ready = self.dir.join("ready");
        let read = || -> Option<serde_json::Value> {
            serde_json::from_str(&fs::read_to_string(&ready).ok()?).ok()
        };
        let before = read()
            .and_then(|v| v["kubeletRestarts"].as_u64())
            .expect("the node's ready file counts kubelet restarts");
        let child = self.child.as_ref().expect("the node runs");
        unsafe {
            libc::kill(child.id() as i32, libc::SIGUSR1);
        }
        wait_for(
            "the kubelet restarted (podstamp-node's ready file)",
            Duration::from_secs(60),
            || {
                let value = read()?;
                (value["kubeletRestarts"].as_u64() == Some(before + 1))
                    .then(|| value["kubeletPid"].as_u64())?
                    .map(|pid| pid as u32)
            },
        )
    }

    /// The kubelet's staticPodPath.
    pub fn manifests(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    /// Every container of the node, in any state.
    pub fn containers(&self) -> Vec<Container> {
        let out = Command::new(harness_bin("podstamp-node"))
            .args(["containers", "--dir"])
            .arg(&self.dir)
            .output()
            .expect("run podstamp-node containers");
        assert!(
            out.status.success(),
            "podstamp-node containers: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Stops the container `id` through the CRI with no grace period
    /// (SIGKILL), as a crash would; the kubelet restarts it.
    pub fn kill_container(&self, id: &str) {
        let out = Command::new(harness_bin("podstamp-node"))
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .args(["--id", id])
            .output()
            .expect("run podstamp-node stop");
        assert!(
            out.status.success(),
            "podstamp-node stop --id {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The running containers of the static pod `pod` (its mirror pod's name).
    pub fn running(&self, pod: &str) -> Vec<Container> {
        self.containers()
            .into_iter()
            .filter(|c| c.pod_name == pod && c.running())
            .collect()
    }

    pub fn logs(&self) -> String {
        let read = |f: &str| fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        let tail = |text: String| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        // A kubelet restarted (SIGUSR1) left its log as kubelet.log.0.
        let earlier = read("kubelet.log.0");
        let earlier = if earlier.is_empty() {
            String::new()
        } else {
            format!(
                "\nthe kubelet before its restart (last lines):\n{}",
                tail(earlier)
            )
        };
        format!(
            "podstamp-node:\n{}{earlier}\nkubelet (last lines):\n{}",
            read("podstamp-node.log"),
            tail(read("kubelet.log"))
        )
    }

    /// SIGTERM and wait for the teardown; its exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if start.elapsed() > Duration::from_secs(90) {
                // Should not happen: the teardown's own steps have time limits.
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a node on `dir` with this cgroup root left behind: mounts under
/// `dir`, processes naming `dir` (containerd, shims, kubelet) or living in
/// the cgroup root (containers), the cgroup directories themselves.
pub fn leftovers(dir: &Path, cgroup_root: &str) -> Vec<String> {
    // The mount table resolves symlinks.
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let dir = dir.to_str().unwrap();
    let mut found = Vec::new();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mountinfo.lines() {
        let point = line.split(' ').nth(4).unwrap_or_default();
        if point == dir || point.starts_with(&format!("{dir}/")) {
            found.push(format!("mounted: {point}"));
        }
    }
    let me = std::process::id().to_string();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let cmdline = fs::read(entry.path().join("cmdline"))
            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            .unwrap_or_default();
        let cgroups = fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cmdline.contains(dir) || cgroups.contains(&format!(":{cgroup_root}/")) {
            found.push(format!("process {pid}: {cmdline}"));
        }
    }
    for hierarchy in fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let path = hierarchy.path().join(cgroup_root.trim_start_matches('/'));
        if path.exists() {
            found.push(format!("cgroup: {}", path.display()));
        }
    }
    found
}
