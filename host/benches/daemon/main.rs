//! `podstamp run` against the real kube-apiserver of the test harness, side
//! by side with what users do today: tests/bench/kubectl-poller.sh, a loop
//! of `kubectl get -o json` + write every second. One API server, seven
//! parts, each in a namespace of its own and a module of its own (what
//! they share is in `bench`, `objects`, `observe`, `report`):
//!
//! * `latency`: update a PodTemplate, time until the new manifest is renamed
//!   into place (inotify), for podstamp and for the poller.
//! * `sync`: 1,000 selected templates among 11,000: time to all manifests,
//!   the API requests made, and the kube-runtime list options compared.
//! * `footprint`: RSS, idle CPU, cold and warm start to ready.
//! * `fanout`: N daemons, one update, time until all N manifests are written,
//!   and the API server's watch count.
//! * `reload`: a settings edit in the configuration file (renamed into
//!   place), time until the affected manifest is renamed into place, with a
//!   warm code cache; and RSS after reloads that each load a plugin of a new
//!   digest, against after the first. The directory source: no API server
//!   is used by these. Then the same settings edit in a catalog ConfigMap
//!   (`daemon.catalog.configMap`, the API source): time until the affected
//!   manifest is renamed into place.
//! * `kubelet`: a template change until the real kubelet (tests/harness
//!   `podstamp-node`) runs the new container, side by side with the
//!   kubelet's own floor: a manifest renamed into its directory by hand.
//!   Needs root, containerd, runc and busybox-static; waits for the
//!   machine-wide node lock of the kubelet tests.
//! * `rollout`: a template update rolled node by node across three real
//!   kubelets, against the same update by hand node after node; the API
//!   requests a rollout costs each node; the Lease writes of daemons
//!   with nothing to roll (expected none).
//! * `control-plane`: the harness's API server as the real kubelet's
//!   static pod, its template in itself: the API's downtime of a harmless
//!   flag change through podstamp against the same change by hand. Not run
//!   by default (several minutes per change): name it.
//!
//! It prints figures next to the targets of issue 5 and asserts nothing
//! about timing: the machine is shared and figures are noisy.
//!
//! * `fleet`: N simulated nodes in this process (podstamp's own rollout
//!   machine and coordinator each, with its own node-bound token, client
//!   and watches), one template rolled at max-unavailable 10 %: the API
//!   requests and watch events per node per rollout, the API server's CPU
//!   and memory, the wall time against the ideal.
//!
//! Run: `bash tests/harness/build.sh && bash plugins/build.sh && cargo bench --bench daemon [-- latency|sync|footprint|fanout|reload|kubelet|rollout|fleet|control-plane]`.
//! Sizes: PODSTAMP_BENCH_UPDATES (default 200; the poller's share takes
//! about 1.1 s per update, some 4 minutes), PODSTAMP_BENCH_DAEMONS (default 50),
//! PODSTAMP_BENCH_SYNC_TEMPLATES (default 1000, the templates the sync
//! selects), PODSTAMP_BENCH_RELOADS (default 100), PODSTAMP_BENCH_KUBELET_CHANGES
//! (default 20 of each shape; an update takes the kubelet 10–15 s),
//! PODSTAMP_BENCH_ROLLOUTS (default 3, about 2 minutes each),
//! PODSTAMP_BENCH_IDLE_SECONDS (default 60), PODSTAMP_BENCH_FLEET (the
//! fleet sizes, default `100,500,2000`), PODSTAMP_BENCH_FLEET_LIMIT
//! (seconds one fleet's rollout may take, default 900),
//! PODSTAMP_BENCH_FLEET_APF (`0`: the API server without API Priority and
//! Fairness, as the fleet figures before it; on by default when the fleet
//! part runs), PODSTAMP_BENCH_FLEET_PROFILE (seconds: the API server's CPU
//! profile over the first seconds of each fleet's rollout, saved as
//! target/bench-daemon/profiles/fleet-N.pb for `go tool pprof`),
//! PODSTAMP_BENCH_CONTROL_PLANE_CHANGES (default 3 of each kind, about 3
//! minutes a pair).

#[path = "../../../tests/common/mod.rs"]
mod common;
// The tests' helpers, of which the bench uses only some.
#[allow(unused_imports)]
#[path = "../../../tests/daemon/support.rs"]
mod support;
// The kubelet tests' node (podstamp-node), its teardown and their lock.
#[path = "../../../tests/kubelet/support.rs"]
mod node;
// The self-hosted control plane of tests/controlplane.rs.
#[path = "../../../tests/controlplane/support.rs"]
mod controlplane;

mod apimetrics;
mod bench;
mod control_plane;
mod fanout;
mod fleet;
mod footprint;
mod kubelet;
mod latency;
mod objects;
mod observe;
mod poller;
mod procfs;
mod reload;
mod report;
mod rollout;
mod sync;

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use bench::Bench;

const SELECTOR: &str = "podstamp.io/enabled=true";
/// How long one change may take to reach the disk before it counts as lost.
const CHANGE_LIMIT: Duration = Duration::from_secs(10);
/// How long a daemon may take to become ready.
const READY_LIMIT: Duration = Duration::from_secs(120);
const PARTS: [&str; 9] = [
    "latency",
    "sync",
    "footprint",
    "fanout",
    "reload",
    "kubelet",
    "rollout",
    "fleet",
    "control-plane",
];

fn main() {
    // cargo bench passes `--bench`; the other words name the parts to run.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if let Some(bad) = words.iter().find(|w| !PARTS.contains(&w.as_str())) {
        eprintln!(
            "unknown part {bad:?}: use one or more of {}",
            PARTS.join(", ")
        );
        std::process::exit(2);
    }
    // control-plane only when named: it takes minutes per change.
    let run = |part: &str| {
        (words.is_empty() && part != "control-plane") || words.iter().any(|w| w == part)
    };
    let plugins = common::repo().join("target/plugins");
    if ["arch-image", "node-env", "substitute"]
        .iter()
        .any(|p| !plugins.join(format!("{p}.wasm")).is_file())
    {
        eprintln!("the plugins are not built: run `bash plugins/build.sh` first");
        std::process::exit(2);
    }
    let apiserver = std::env::var_os("PODSTAMP_HARNESS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo().join("target/harness"))
        .join("podstamp-apiserver");
    if !apiserver.is_file() {
        eprintln!(
            "{} is missing: build the test harness with `bash tests/harness/build.sh` first",
            apiserver.display()
        );
        std::process::exit(2);
    }
    let updates = env_size("PODSTAMP_BENCH_UPDATES", 200);
    let daemons = env_size("PODSTAMP_BENCH_DAEMONS", 50);
    println!(
        "command: PODSTAMP_BENCH_UPDATES={updates} PODSTAMP_BENCH_DAEMONS={daemons} cargo bench --bench daemon{}{}",
        if words.is_empty() { "" } else { " -- " },
        words.join(" ")
    );
    println!(
        "machine: {} CPUs, shared with other work: figures are noisy; nothing here is asserted",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // API Priority and Fairness on when the fleet part runs (its figures
    // include what APF queued or rejected); the other parts keep the
    // harness's default (off), as their earlier figures were measured.
    // PODSTAMP_BENCH_FLEET_APF=0: off, as the fleet's figures before it.
    let apf = run("fleet") && std::env::var("PODSTAMP_BENCH_FLEET_APF").as_deref() != Ok("0");
    let profiling = run("fleet") && fleet_profile().is_some();
    let mut bench = Bench::new(updates, daemons, apf, profiling);
    println!(
        "podstamp: a copy of {} (built {}) in {}",
        env!("CARGO_BIN_EXE_podstamp"),
        fs::metadata(env!("CARGO_BIN_EXE_podstamp"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or("?".into(), |d| {
                let s = d.as_secs() % 86_400;
                format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
            }),
        bench.binary.display()
    );
    println!(
        "API server: podstamp-apiserver (kube-apiserver {}) at {}, state in {}",
        bench.server_version(),
        bench.server.url,
        bench.server.dir.display()
    );
    if !bench.has_poller {
        println!(
            "kubectl or jq is missing (apt-get install kubectl jq): the poller baseline is left out"
        );
    }
    if run("latency") {
        bench.latency();
    }
    if run("sync") {
        bench.sync();
    }
    if run("footprint") {
        bench.footprint();
    }
    if run("fanout") {
        bench.fanout();
    }
    if run("reload") {
        bench.reload(env_size("PODSTAMP_BENCH_RELOADS", 100));
    }
    if run("kubelet") {
        bench.kubelet(env_size("PODSTAMP_BENCH_KUBELET_CHANGES", 20));
    }
    if run("rollout") {
        bench.rollout(
            env_size("PODSTAMP_BENCH_ROLLOUTS", 3),
            Duration::from_secs(env_size("PODSTAMP_BENCH_IDLE_SECONDS", 60) as u64),
        );
    }
    if run("fleet") {
        bench.fleet(
            &fleet_sizes(),
            Duration::from_secs(env_size("PODSTAMP_BENCH_FLEET_LIMIT", 900) as u64),
        );
    }
    if run("control-plane") {
        bench.control_plane(env_size("PODSTAMP_BENCH_CONTROL_PLANE_CHANGES", 3));
    }
}

/// PODSTAMP_BENCH_FLEET: fleet sizes, comma-separated.
fn fleet_sizes() -> Vec<usize> {
    let text = std::env::var("PODSTAMP_BENCH_FLEET").unwrap_or_else(|_| "100,500,2000".into());
    text.split(',')
        .map(|n| {
            n.trim().parse().unwrap_or_else(|_| {
                eprintln!("PODSTAMP_BENCH_FLEET={text:?}: expected whole numbers, comma-separated");
                std::process::exit(2);
            })
        })
        .collect()
}

/// PODSTAMP_BENCH_FLEET_PROFILE: seconds of the API server's CPU profile
/// taken as each fleet starts rolling; unset: none.
pub fn fleet_profile() -> Option<u64> {
    let text = std::env::var("PODSTAMP_BENCH_FLEET_PROFILE").ok()?;
    match text.parse() {
        Ok(0) => None,
        Ok(seconds) => Some(seconds),
        Err(_) => {
            eprintln!("PODSTAMP_BENCH_FLEET_PROFILE={text:?}: expected whole seconds");
            std::process::exit(2);
        }
    }
}

fn env_size(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text.parse().unwrap_or_else(|_| {
            eprintln!("{name}={text:?}: expected a whole number");
            std::process::exit(2);
        }),
        Err(_) => default,
    }
}
