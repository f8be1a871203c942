//! examples/playground.sh end to end, as a newcomer runs it but without
//! waiting for Ctrl-C: `up --no-wait` starts the harness's real API server,
//! two real nodes (podstamp-node: containerd and the kubelet) and a podstamp
//! daemon for each, and walks the loop with real commands (the template's
//! pods running, an edit rolled node by node, a bad image failed on one node,
//! rolled back there and halting the other); then `down` stops everything
//! by PID and unmounts it all, which this test checks: no process of its
//! list left, no mount under its directory, the directory gone.
//!
//! Runs as root, holding the machine-wide kubelet lock (tests/kubelet/
//! support.rs: the kubelet uses fixed host paths). Needs what the playground
//! needs (the Go harness, the plugins, podstamp's pod check, containerd,
//! runc, busybox-static, kubectl): `bash tests/run.sh` builds and installs
//! them. `down` also runs when the test fails.

mod common;
#[allow(unused_imports)]
#[path = "kubelet/support.rs"]
mod node;
#[allow(unused_imports)]
#[path = "daemon/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The playground's state directory; `down` when dropped.
struct Playground {
    dir: PathBuf,
}

impl Playground {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(common::repo().join("examples/playground.sh"))
            .args(args)
            .env("PODSTAMP_PLAYGROUND_DIR", &self.dir)
            .env("PODSTAMP_PLAYGROUND_NO_BUILD", "1")
            .env("PODSTAMP_BIN", env!("CARGO_BIN_EXE_podstamp"))
            .env(
                "PODSTAMP_HARNESS_BIN",
                common::harness_bin("podstamp-node").parent().unwrap(),
            )
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .current_dir(common::repo())
            .output()
            .unwrap()
    }
}

impl Drop for Playground {
    fn drop(&mut self) {
        if self.dir.exists() {
            let _ = self.run(&["down"]);
        }
    }
}

/// The PIDs of the playground's processes, from its list.
fn pids(dir: &Path) -> Vec<(u32, String)> {
    fs::read_to_string(dir.join("pids"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            let pid = words.next().unwrap().parse().unwrap();
            let program = words.nth(1).unwrap().to_string();
            (pid, program)
        })
        .collect()
}

#[test]
fn the_playground_walks_the_loop_and_down_leaves_nothing() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the playground runs containerd and the kubelet: run the tests as root"
    );
    common::kubecheck();
    common::plugin("substitute");
    let _serial = node::serial();
    // Short: containerd's socket path under it must fit in 100 bytes.
    let playground = Playground {
        dir: PathBuf::from(format!("/tmp/pgt-{}", std::process::id())),
    };
    let up = playground.run(&["up", "--no-wait"]);
    let said = String::from_utf8_lossy(&up.stdout).to_string();
    let logs = || {
        let mut all = String::new();
        for name in ["podstamp-1", "podstamp-2", "node-1", "node-2"] {
            let text =
                fs::read_to_string(playground.dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            all.push_str(&format!("--- {name}.log (last lines)\n"));
            for line in tail.into_iter().rev() {
                all.push_str(line);
                all.push('\n');
            }
        }
        all
    };
    assert!(
        up.status.success(),
        "playground.sh up: {}\n{said}\n{}\n{}",
        up.status,
        String::from_utf8_lossy(&up.stderr),
        logs()
    );
    for expected in [
        // Both nodes run the template's pod, as rendered for each node.
        "$ kubectl get pods -n playground -o wide",
        "web-pg-1   1/1     Running",
        "web-pg-2   1/1     Running",
        "echo web version 1 on pg-1",
        // The edit, rolled and confirmed.
        "echo web version 2 on pg-1",
        "2/2       2/2     0        0",
        // The bad image: failed on one node, rolled back, the other halted.
        "(ErrImageNeverPull)",
        "   halted   ",
        "export KUBECONFIG=",
    ] {
        assert!(said.contains(expected), "no {expected:?} in:\n{said}");
    }

    let started = pids(&playground.dir);
    assert_eq!(started.len(), 5, "{started:?}");
    let down = playground.run(&["down"]);
    assert!(
        down.status.success(),
        "playground.sh down: {}\n{}",
        String::from_utf8_lossy(&down.stdout),
        String::from_utf8_lossy(&down.stderr)
    );
    for (pid, program) in started {
        let exe = fs::read_link(format!("/proc/{pid}/exe")).ok();
        assert!(
            exe.is_none_or(|e| e != fs::canonicalize(&program).unwrap_or_default()),
            "pid {pid} ({program}) still runs after down"
        );
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let prefix = format!("{}/", playground.dir.display());
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.split(' ').nth(1).is_some_and(|m| m.starts_with(&prefix)))
        .collect();
    assert!(left.is_empty(), "mounted after down: {left:?}");
    assert!(
        !playground.dir.exists(),
        "{} left",
        playground.dir.display()
    );
    for name in ["pg-1", "pg-2"] {
        let left = node::leftovers(&playground.dir, &format!("/podstamp-node-{name}"));
        assert!(left.is_empty(), "node {name} left: {left:?}");
    }
}
