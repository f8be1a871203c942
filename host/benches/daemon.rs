//! `podstamp run` against the real kube-apiserver of the test harness, side
//! by side with what users do today: tests/bench/kubectl-poller.sh, a loop
//! of `kubectl get -o json` + write every second. One API server, four
//! parts, each in a namespace of its own:
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
//!
//! It prints figures next to the targets of issue 5 and asserts nothing
//! about timing: the machine is shared and figures are noisy.
//!
//! Run: `bash tests/harness/build.sh && bash plugins/build.sh && cargo bench --bench daemon [-- latency|sync|footprint|fanout|reload]`.
//! Sizes: PODSTAMP_BENCH_UPDATES (default 200; the poller's share takes
//! about 1.1 s per update, some 4 minutes), PODSTAMP_BENCH_DAEMONS (default 50),
//! PODSTAMP_BENCH_RELOADS (default 100).

#[path = "../../tests/common/mod.rs"]
mod common;
// The tests' helpers, of which the bench uses only some.
#[allow(unused_imports)]
#[path = "../../tests/daemon/support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use inotify::{Inotify, WatchDescriptor, WatchMask};
use k8s_openapi::api::core::v1::{Namespace, Node, PodTemplate};
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use support::{ApiServer, Daemon};

const SELECTOR: &str = "podstamp.io/enabled=true";
/// How long one change may take to reach the disk before it counts as lost.
const CHANGE_LIMIT: Duration = Duration::from_secs(10);
/// How long a daemon may take to become ready.
const READY_LIMIT: Duration = Duration::from_secs(120);
const PARTS: [&str; 5] = ["latency", "sync", "footprint", "fanout", "reload"];

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
    let run = |part: &str| words.is_empty() || words.iter().any(|w| w == part);
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
    let mut bench = Bench::new(updates, daemons);
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

/// The API server, an admin client, and what every part shares.
struct Bench {
    rt: tokio::runtime::Runtime,
    server: ApiServer,
    client: kube::Client,
    /// target/bench-daemon: emptied at start.
    root: PathBuf,
    config: PathBuf,
    /// The compiled-code cache the daemons share (warm after the first start).
    cache: PathBuf,
    /// The copy of the podstamp binary that every daemon of this run runs.
    binary: PathBuf,
    has_poller: bool,
    updates: usize,
    daemons: usize,
    rng: u64,
    /// (VmRSS, VmHWM) in KiB of the daemon after the 1,000-template sync.
    after_sync_rss: Option<(u64, u64)>,
}

impl Bench {
    fn new(updates: usize, daemons: usize) -> Bench {
        let root = common::repo().join("target/bench-daemon");
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("logs")).unwrap();
        let cache = root.join("cache");
        private_dir(&cache);
        let config = write_bench_config(&root);
        let binary = root.join("podstamp");
        fs::copy(env!("CARGO_BIN_EXE_podstamp"), &binary).unwrap();
        warm_cache(&binary, &config, &cache);
        let server = ApiServer::start(&root.join("apiserver"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(support::client(&server.kubeconfig("admin")));
        let has_poller = ["kubectl", "jq"].iter().all(|tool| {
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Bench {
            rt,
            server,
            client,
            root,
            config,
            cache,
            binary,
            has_poller,
            updates,
            daemons,
            rng: seed,
            after_sync_rss: None,
        }
    }

    fn server_version(&self) -> String {
        self.rt
            .block_on(self.client.apiserver_version())
            .map_or_else(|e| format!("? ({e})"), |v| v.git_version)
    }

    /// A pseudo-random duration in [0, limit) (xorshift; only to break phase).
    fn random_pause(&mut self, limit: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        limit.mul_f64((self.rng % 10_000) as f64 / 10_000.0)
    }

    /// A fresh namespace for one part.
    fn namespace(&self, part: &str) -> String {
        let ns = format!("bench-{part}");
        let api: Api<Namespace> = Api::all(self.client.clone());
        let object = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &object))
            .unwrap_or_else(|e| panic!("create namespace {ns}: {e}"));
        ns
    }

    /// A Node the daemons can render for (each daemon waits for its Node).
    fn node(&self, name: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        let object = serde_json::from_value(node_json(name)).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &object))
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
    }

    fn templates(&self, ns: &str) -> Api<PodTemplate> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn create_template(&self, ns: &str, name: &str, marker: &str) {
        let object = template(name, marker, true);
        self.rt
            .block_on(self.templates(ns).create(&PostParams::default(), &object))
            .unwrap_or_else(|e| panic!("create template {ns}/{name}: {e}"));
    }

    /// Sets the template's marker (an env value of its container).
    fn set_marker(&self, ns: &str, name: &str, marker: &str) -> Result<(), String> {
        let patch = json!({"template": {"spec": {"containers": [
            {"name": "agent", "env": [{"name": "MARKER", "value": marker}]}]}}});
        self.rt
            .block_on(self.templates(ns).patch(
                name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            ))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The API server's own metrics (GET /metrics as admin).
    fn api_metrics(&self) -> Vec<Sample> {
        let request = kube::core::Request::new("")
            .get("metrics", &GetParams::default())
            .unwrap();
        match self.rt.block_on(self.client.request_text(request)) {
            Ok(text) => parse_metrics(&text),
            Err(e) => {
                println!("  (the API server's /metrics failed: {e})");
                Vec::new()
            }
        }
    }

    /// `podstamp run` for `node` on `ns`, with the 3-plugin chain, at the
    /// default log level, the compiled code cached in `cache`.
    fn daemon(&self, ns: &str, node: &str, dir: &Path, cache: &Path) -> Daemon {
        let kubeconfig = self.server.kubeconfig("admin");
        Daemon::start_binary(
            &self.binary,
            &[
                "--config",
                self.config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                ns,
                "--node-name",
                node,
                "--manifest-dir",
                dir.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            self.root.join("logs").join(format!("{node}.log")),
            "warn",
        )
    }

    fn poller(&self, ns: &str, dir: &Path, log: &str) -> Poller {
        Poller::start(
            &[ns, SELECTOR, dir.to_str().unwrap(), "1"],
            &self.server.kubeconfig("admin"),
            &self.root.join("logs").join(log),
            false,
        )
    }

    /// A fresh, empty directory under target/bench-daemon.
    fn dir(&self, path: &str) -> PathBuf {
        let dir = self.root.join(path);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    // ---------------------------------------------------------------- latency

    /// Sets a new marker on the template `agent`, `updates` times, one at a
    /// time, and times each until `file` holding it is renamed into place;
    /// `pause`, when given, waits a random part of it before each update.
    fn time_updates(
        &mut self,
        ns: &str,
        file: &str,
        renames: &mut Renames,
        prefix: char,
        pause: Option<Duration>,
    ) -> Samples {
        let mut samples = Samples::default();
        for i in 1..=self.updates {
            if let Some(period) = pause {
                let pause = self.random_pause(period);
                std::thread::sleep(pause);
            }
            let marker = format!("{prefix}{i:06}");
            let t0 = Instant::now();
            if let Err(e) = self.set_marker(ns, "agent", &marker) {
                samples.errors.push(e);
                continue;
            }
            samples.push(renames.wait_marker(file, &marker, t0, t0 + CHANGE_LIMIT)[0]);
        }
        samples
    }

    fn latency(&mut self) {
        println!(
            "\n== change -> manifest latency ({} updates each) ==",
            self.updates
        );
        let ns = self.namespace("latency");
        let node = "bench-latency-node";
        self.node(node);
        let file = "agent.yaml";
        self.create_template(&ns, "agent", "S000000");

        let dir = self.dir("latency/podstamp");
        let daemon = self.daemon(&ns, node, &dir, &self.cache);
        let podstamp = if time_to_ready(&daemon, Instant::now(), READY_LIMIT).is_none() {
            println!(
                "  podstamp did not become ready: see {}",
                daemon.log.display()
            );
            None
        } else {
            let mut renames = Renames::watch(std::slice::from_ref(&dir));
            Some(self.time_updates(&ns, file, &mut renames, 'P', None))
        };
        drop(daemon);

        let poller = if self.has_poller {
            let dir = self.dir("latency/poller");
            let mut renames = Renames::watch(std::slice::from_ref(&dir));
            let poller = self.poller(&ns, &dir, "poller-latency.log");
            let first = renames.wait_marker(
                file,
                "value",
                Instant::now(),
                Instant::now() + Duration::from_secs(30),
            )[0];
            if first.is_none() {
                println!(
                    "  the poller wrote nothing in 30 s: see {}",
                    self.root.join("logs/poller-latency.log").display()
                );
            }
            // The poller's latency depends on where in its 1 s period a
            // change lands: a random pause spreads the changes over it
            // instead of always landing just after a sweep.
            let samples =
                self.time_updates(&ns, file, &mut renames, 'K', Some(Duration::from_secs(1)));
            drop(poller);
            Some(samples)
        } else {
            None
        };

        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "", "p50", "p90", "p99", "max", "mean", "lost"
        );
        for (name, samples) in [
            ("podstamp (watch, 3 plugins)", &podstamp),
            ("kubectl poller (1 s, no plugins)", &poller),
        ] {
            match samples {
                Some(s) => s.row(name),
                None => println!("  {name:<34} (not measured)"),
            }
        }
        if let (Some(p), Some(k)) = (&podstamp, &poller)
            && let (Some(pp), Some(kp)) = (p.percentile(0.5), k.percentile(0.5))
        {
            let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64().max(1e-9);
            println!(
                "  poller / podstamp: p50 {:.0}x, p99 {:.0}x",
                ratio(pp, kp),
                ratio(
                    p.percentile(0.99).unwrap_or(pp),
                    k.percentile(0.99).unwrap_or(kp)
                )
            );
        }
        if let Some(p99) = podstamp.as_ref().and_then(|s| s.percentile(0.99)) {
            let lost = podstamp.as_ref().map_or(0, |s| s.lost + s.errors.len());
            println!(
                "  target: podstamp p99 < 100 ms: {} ({}){}",
                ms(p99),
                verdict(p99 < Duration::from_millis(100) && lost == 0),
                if lost > 0 {
                    format!(", {lost} updates lost or failed")
                } else {
                    String::new()
                }
            );
        }
        for (name, samples) in [("podstamp", &podstamp), ("poller", &poller)] {
            if let Some(e) = samples.as_ref().and_then(|s| s.errors.first()) {
                println!("  {name}: first failed update: {e}");
            }
        }
    }

    // ------------------------------------------------------------------- sync

    fn sync(&mut self) {
        const SELECTED: usize = 1000;
        const UNSELECTED: usize = 10_000;
        println!(
            "\n== initial sync: {SELECTED} selected templates + {UNSELECTED} unselected in the namespace =="
        );
        let ns = self.namespace("sync");
        let node = "bench-sync-node";
        self.node(node);
        let objects: Vec<PodTemplate> = (0..SELECTED)
            .map(|i| template(&format!("sel-{i:04}"), "S000000", true))
            .chain((0..UNSELECTED).map(|i| template(&format!("other-{i:05}"), "S000000", false)))
            .collect();
        let start = Instant::now();
        let (created, failed) = self
            .rt
            .block_on(create_all(self.templates(&ns), objects, 32));
        println!(
            "  created {created} templates in {:.1} s (32 requests in flight){}",
            start.elapsed().as_secs_f64(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(", {} failed, first: {}", failed.len(), failed[0])
            }
        );
        let features = self.api_metrics();
        let gate = |name: &str| {
            features
                .iter()
                .find(|s| s.name == "kubernetes_feature_enabled" && s.label("name") == name)
                .map_or("not listed".to_string(), |s| {
                    format!(
                        "{} ({})",
                        if s.value > 0.0 { "on" } else { "off" },
                        s.label("stage")
                    )
                })
        };
        println!(
            "  API server feature gates: WatchList {}, ConsistentListFromCache {}, ListFromCacheSnapshot {}",
            gate("WatchList"),
            gate("ConsistentListFromCache"),
            gate("ListFromCacheSnapshot")
        );

        // The daemon.
        let dir = self.dir("sync/podstamp");
        let mut renames = Renames::watch(std::slice::from_ref(&dir));
        let before = self.api_metrics();
        let spawned = Instant::now();
        let daemon = self.daemon(&ns, node, &dir, &self.cache);
        let mut seen = BTreeSet::new();
        let (mut first, mut half, mut all, mut ready) = (None, None, None, None);
        let deadline = spawned + READY_LIMIT;
        let mut next_probe = Instant::now();
        while (all.is_none() || ready.is_none()) && Instant::now() < deadline {
            // inotify for the files, /readyz every 10 ms in between.
            for (_, name, when) in renames.next(Instant::now() + Duration::from_millis(10)) {
                if !name.starts_with('.') && seen.insert(name) {
                    let took = when - spawned;
                    first.get_or_insert(took);
                    if seen.len() == SELECTED / 2 {
                        half = Some(took);
                    }
                    if seen.len() == SELECTED {
                        all = Some(took);
                    }
                }
            }
            if ready.is_none() && Instant::now() >= next_probe {
                if daemon.get("/readyz").is_some_and(|(code, _)| code == 200) {
                    ready = Some(spawned.elapsed());
                }
                next_probe = Instant::now() + Duration::from_millis(10);
            }
        }
        // Give the watch requests a moment to be counted, then read both sides.
        std::thread::sleep(Duration::from_millis(500));
        let after = self.api_metrics();
        let metrics = daemon
            .get("/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        let daemon_metric = |sample: &str| {
            metrics.lines().find_map(|l| {
                l.strip_prefix(sample)?
                    .strip_prefix(' ')?
                    .parse::<f64>()
                    .ok()
            })
        };
        let rss = (
            proc_status_kib(daemon.pid(), "VmRSS"),
            proc_status_kib(daemon.pid(), "VmHWM"),
        );
        if let (Some(rss), Some(hwm)) = rss {
            self.after_sync_rss = Some((rss, hwm));
        }
        let initial_sync = daemon_metric("podstamp_initial_sync_seconds");
        let show = |d: Option<Duration>| d.map_or("timed out".to_string(), ms);
        println!("  podstamp (3 plugins, warm code cache, log level warn):");
        println!(
            "    spawn -> first manifest written        {:>12}",
            show(first)
        );
        println!(
            "    spawn -> {:>4}th manifest written       {:>12}",
            SELECTED / 2,
            show(half)
        );
        println!(
            "    spawn -> all {SELECTED} manifests written      {:>12}   ({} files seen)",
            show(all),
            seen.len()
        );
        println!(
            "    spawn -> /readyz 200                   {:>12}",
            show(ready)
        );
        println!(
            "    podstamp_initial_sync_seconds          {:>12}   target < 1 s after the list returns: {}",
            initial_sync.map_or("absent".into(), |s| ms(Duration::from_secs_f64(s))),
            initial_sync.map_or("unknown", |s| verdict(s < 1.0))
        );
        let templates = daemon_metric("podstamp_templates");
        println!(
            "    podstamp_templates                     {:>12}   (server-side selection: {})",
            templates.map_or("absent".into(), |n| format!("{n}")),
            templates.map_or("unknown", |n| if n as usize == SELECTED {
                "only the selected ones reached the daemon"
            } else {
                "NOT as expected"
            })
        );
        println!(
            "    renders written / unchanged / failed   {:>12}",
            format!(
                "{} / {} / {}",
                daemon_metric("podstamp_renders_total{result=\"written\"}").unwrap_or(0.0),
                daemon_metric("podstamp_renders_total{result=\"unchanged\"}").unwrap_or(0.0),
                daemon_metric("podstamp_renders_total{result=\"failed\"}").unwrap_or(0.0)
            )
        );
        for plugin in ["arch-image", "node-env", "substitute"] {
            let labels = format!("{{plugin=\"{plugin}\",result=\"ok\"}}");
            if let (Some(sum), Some(count)) = (
                daemon_metric(&format!(
                    "podstamp_plugin_call_duration_seconds_sum{labels}"
                )),
                daemon_metric(&format!(
                    "podstamp_plugin_call_duration_seconds_count{labels}"
                )),
            ) {
                println!(
                    "    plugin {plugin:<11} calls {count:>5}, total {:>9}, mean {:>7.0} µs",
                    ms(Duration::from_secs_f64(sum)),
                    sum / count.max(1.0) * 1e6
                );
            }
        }
        if let (Some(rss), Some(hwm)) = rss {
            println!(
                "    RSS after the sync                     {:>12}   (peak {})",
                mib(rss),
                mib(hwm)
            );
        }
        println!(
            "    API requests made by the daemon (the API server's apiserver_request_total, by verb):"
        );
        print_requests(&before, &after, "      ");
        drop(daemon);

        // The poller's first sweep: one kubectl get of the 1,000 selected.
        if self.has_poller {
            let dir = self.dir("sync/poller");
            let before = self.api_metrics();
            let start = Instant::now();
            let mut poller = Poller::start(
                &[&ns, SELECTOR, dir.to_str().unwrap(), "1"],
                &self.server.kubeconfig("admin"),
                &self.root.join("logs/poller-sync.log"),
                true,
            );
            let status = poller.wait(READY_LIMIT);
            let took = start.elapsed();
            let after = self.api_metrics();
            let files = fs::read_dir(&dir).map_or(0, |d| {
                d.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            });
            println!("  kubectl poller, first sweep (POLL_ONCE=1):");
            println!(
                "    start -> all manifests written         {:>12}   ({files} files, exit {})",
                ms(took),
                status.map_or("timed out".into(), |s| s
                    .code()
                    .map_or(s.to_string(), |c| c.to_string()))
            );
            println!("    API requests made by kubectl:");
            print_requests(&before, &after, "      ");
        }

        self.list_options(&ns);
    }

    /// The initial list alone, through kube-runtime's watcher as podstamp
    /// uses it (host/src/daemon/source.rs), with each list option: time to
    /// the end of the initial list, and the requests it made.
    fn list_options(&self, ns: &str) {
        println!("  the initial list alone (kube-runtime 5 watcher, in-process), median of 3:");
        let base = watcher::Config::default().labels(SELECTOR);
        let mut unpaged = base.clone();
        unpaged.page_size = None;
        let variants = [
            (
                "default: list, page 500, most recent (podstamp)",
                base.clone(),
            ),
            ("list, unpaged, most recent", unpaged),
            (
                "list, page 500, any_semantic (rv=0, cache)",
                base.clone().any_semantic(),
            ),
            (
                "streaming_lists (sendInitialEvents watch)",
                base.clone().streaming_lists(),
            ),
        ];
        println!(
            "    {:<50} {:>9} {:>6}  requests per list",
            "watcher config", "time", "items"
        );
        for (name, config) in variants {
            let mut times = Vec::new();
            let mut items = 0;
            let mut requests = String::new();
            let mut error = None;
            for _ in 0..3 {
                let before = self.api_metrics();
                let result = self.rt.block_on(initial_list(
                    self.templates(ns),
                    config.clone(),
                    READY_LIMIT,
                ));
                // A streaming list's watch is counted when it closes.
                std::thread::sleep(Duration::from_millis(300));
                let after = self.api_metrics();
                match result {
                    Ok((took, n)) => {
                        times.push(took);
                        items = n;
                    }
                    Err(e) => error = Some(e),
                }
                requests = request_delta(&before, &after)
                    .iter()
                    .filter(|((resource, _), _)| resource == "podtemplates")
                    .map(|((_, verb), n)| format!("{verb} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            times.sort();
            let median = times.get(times.len() / 2).copied();
            println!(
                "    {name:<50} {:>9} {items:>6}  {}{}",
                median.map_or("failed".into(), ms),
                if requests.is_empty() { "-" } else { &requests },
                error.map_or(String::new(), |e| format!("  (error: {e})"))
            );
        }
    }

    // -------------------------------------------------------------- footprint

    fn footprint(&mut self) {
        println!("\n== footprint ==");
        let ns = self.namespace("footprint");
        let node = "bench-footprint-node";
        self.node(node);
        self.create_template(&ns, "agent", "F000000");
        let ticks = clock_ticks();

        let dir = self.dir("footprint/podstamp");
        let daemon = self.daemon(&ns, node, &dir, &self.cache);
        let ready = time_to_ready(&daemon, Instant::now(), READY_LIMIT);
        std::thread::sleep(Duration::from_secs(2));
        let pid = daemon.pid();
        let idle = (proc_status_kib(pid, "VmRSS"), proc_status_kib(pid, "VmHWM"));
        let (podstamp_cpu, podstamp_peak) = observe(
            Duration::from_secs(10),
            || proc_ticks(pid, false),
            || proc_status_kib(pid, "VmRSS").unwrap_or(0),
        );
        drop(daemon);

        let poller = if self.has_poller {
            let dir = self.dir("footprint/poller");
            let mut renames = Renames::watch(std::slice::from_ref(&dir));
            let poller = self.poller(&ns, &dir, "poller-footprint.log");
            renames.wait_marker(
                "agent.yaml",
                "F000000",
                Instant::now(),
                Instant::now() + Duration::from_secs(30),
            );
            let pid = poller.child.id();
            let usage = observe(
                Duration::from_secs(10),
                // bash's own time plus that of the kubectl and jq it waited for.
                || proc_ticks(pid, true),
                || group_rss_kib(pid),
            );
            drop(poller);
            Some(usage)
        } else {
            None
        };

        // Cold (empty code cache) and warm starts, to /readyz 200.
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for i in 0..5 {
            let cache = self.root.join(format!("footprint/cold-cache-{i}"));
            private_dir(&cache);
            for (cache, into) in [(&cache, &mut cold), (&self.cache, &mut warm)] {
                let dir = self.dir("footprint/start");
                let spawned = Instant::now();
                let daemon = self.daemon(&ns, node, &dir, cache);
                into.push(time_to_ready(&daemon, spawned, READY_LIMIT));
            }
        }

        let cpu = |t: Option<u64>| {
            t.map_or("?".to_string(), |t| {
                format!("{:.0} ms", t as f64 * 1000.0 / ticks as f64)
            })
        };
        println!("  {:<44} {:>14} {:>14}", "", "podstamp", "kubectl poller");
        println!(
            "  {:<44} {:>14} {:>14}   target < 40 MiB: {}",
            "RSS idle, 3 plugins, 1 template",
            idle.0.map_or("?".into(), mib),
            "-",
            idle.0.map_or("unknown", |k| verdict(k < 40 * 1024))
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "  peak so far (VmHWM)",
            idle.1.map_or("?".into(), mib),
            "-"
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "RSS after the 1,000-template sync",
            self.after_sync_rss
                .map_or("(run `sync`)".into(), |(rss, _)| mib(rss)),
            "-"
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "  peak during the sync (VmHWM)",
            self.after_sync_rss
                .map_or("(run `sync`)".into(), |(_, hwm)| mib(hwm)),
            "-"
        );
        println!(
            "  {:<44} {:>14} {:>14}",
            "peak RSS, 10 s idle (poller: +kubectl, jq)",
            mib(podstamp_peak),
            poller.map_or("-".into(), |(_, peak)| mib(peak))
        );
        println!(
            "  {:<44} {:>14} {:>14}   podstamp should be ~0 (no polling)",
            "CPU used over 10 s idle",
            cpu(podstamp_cpu),
            poller.map_or("-".into(), |(t, _)| cpu(t))
        );
        println!(
            "  {:<44} {:>14}",
            "first start to ready (warm cache)",
            ready.map_or("timed out".into(), ms)
        );
        let summary = |v: &[Option<Duration>]| {
            let mut ok: Vec<Duration> = v.iter().flatten().copied().collect();
            ok.sort();
            if ok.is_empty() {
                return ("timed out".to_string(), None);
            }
            let median = ok[ok.len() / 2];
            (
                format!(
                    "{} (min {}, max {}{})",
                    ms(median),
                    ms(ok[0]),
                    ms(ok[ok.len() - 1]),
                    if ok.len() < v.len() {
                        format!(", {} timed out", v.len() - ok.len())
                    } else {
                        String::new()
                    }
                ),
                Some(median),
            )
        };
        let (text, _) = summary(&cold);
        println!(
            "  start -> /readyz 200, empty code cache, median of {}: {text}",
            cold.len()
        );
        let (text, median) = summary(&warm);
        println!(
            "  start -> /readyz 200, warm code cache,  median of {}: {text}   target < 150 ms: {}",
            warm.len(),
            median.map_or("unknown", |m| verdict(m < Duration::from_millis(150)))
        );
    }

    // ----------------------------------------------------------------- fanout

    fn fanout(&mut self) {
        let n = self.daemons;
        println!("\n== fan-out: {n} daemons, one API server on loopback ==");
        let ns = self.namespace("fanout");
        self.create_template(&ns, "agent", "N000000");
        let names: Vec<String> = (0..n).map(|i| format!("bench-fan-{i:03}")).collect();
        for name in &names {
            self.node(name);
        }
        let before = self.api_metrics();
        let dirs: Vec<PathBuf> = names
            .iter()
            .map(|name| self.dir(&format!("fanout/{name}")))
            .collect();
        let spawned = Instant::now();
        let daemons: Vec<Daemon> = names
            .iter()
            .zip(&dirs)
            .map(|(name, dir)| self.daemon(&ns, name, dir, &self.cache))
            .collect();
        let ready: Vec<Option<Duration>> = daemons
            .iter()
            .map(|d| time_to_ready(d, spawned, READY_LIMIT.saturating_sub(spawned.elapsed())))
            .collect();
        let all_ready = ready.iter().all(Option::is_some);
        println!(
            "  {} of {n} ready; the last {} after they were all spawned",
            ready.iter().flatten().count(),
            ready.iter().flatten().max().map_or("-".into(), |d| ms(*d))
        );
        std::thread::sleep(Duration::from_millis(500));
        let after = self.api_metrics();

        let mut renames = Renames::watch(&dirs);
        let mut rows = Vec::new();
        for u in 1..=5 {
            std::thread::sleep(Duration::from_millis(500));
            let marker = format!("N{u:06}");
            let t0 = Instant::now();
            if let Err(e) = self.set_marker(&ns, "agent", &marker) {
                println!("  update {u}: failed: {e}");
                continue;
            }
            let took = renames.wait_marker("agent.yaml", &marker, t0, t0 + CHANGE_LIMIT);
            let mut done: Vec<Duration> = took.iter().flatten().copied().collect();
            done.sort();
            rows.push((u, done, took.len()));
        }
        println!(
            "  {:<8} {:>10} {:>10} {:>14} {:>8}",
            "update", "first", "median", "all N written", "missing"
        );
        let mut alls = Vec::new();
        for (u, done, total) in &rows {
            let missing = total - done.len();
            let all = (missing == 0).then(|| done[done.len() - 1]);
            if let Some(a) = all {
                alls.push(a);
            }
            println!(
                "  {u:<8} {:>10} {:>10} {:>14} {missing:>8}",
                done.first().map_or("-".into(), |d| ms(*d)),
                done.get(done.len() / 2).map_or("-".into(), |d| ms(*d)),
                all.map_or("timed out".into(), ms),
            );
        }
        alls.sort();
        if !alls.is_empty() {
            println!(
                "  time until all {n} manifests are written: p50 {}, max {} (over {} updates)",
                ms(alls[alls.len() / 2]),
                ms(alls[alls.len() - 1]),
                alls.len()
            );
        }
        let watches = |samples: &[Sample], resource: &str| {
            samples
                .iter()
                .filter(|s| {
                    s.name == "apiserver_longrunning_requests"
                        && s.label("verb") == "WATCH"
                        && s.label("resource") == resource
                })
                .map(|s| s.value)
                .sum::<f64>()
        };
        println!(
            "  open watches (apiserver_longrunning_requests{{verb=\"WATCH\"}}), before -> with the daemons{}:",
            if all_ready { "" } else { " (not all ready)" }
        );
        for resource in ["podtemplates", "nodes"] {
            let (b, a) = (watches(&before, resource), watches(&after, resource));
            println!(
                "    {resource:<13} {b:>5} -> {a:>5}: {:+} ({:.2} per daemon; expected 1)",
                a - b,
                (a - b) / n.max(1) as f64
            );
        }
        let registered: Vec<String> = after
            .iter()
            .filter(|s| {
                s.name == "apiserver_registered_watchers"
                    && ["PodTemplate", "Node"].contains(&s.label("kind"))
            })
            .map(|s| format!("{} {}", s.label("kind"), s.value))
            .collect();
        if !registered.is_empty() {
            println!(
                "    apiserver_registered_watchers: {}",
                registered.join(", ")
            );
        }
        println!("  API requests of the {n} daemons' start (apiserver_request_total, by verb):");
        print_requests(&before, &after, "    ");
        let mut rss: Vec<u64> = daemons
            .iter()
            .filter_map(|d| proc_status_kib(d.pid(), "VmRSS"))
            .collect();
        rss.sort();
        if !rss.is_empty() {
            println!(
                "  RSS per daemon: median {}, max {}; all {}: {}",
                mib(rss[rss.len() / 2]),
                mib(rss[rss.len() - 1]),
                rss.len(),
                mib(rss.iter().sum())
            );
        }
        drop(daemons);
    }

    // ----------------------------------------------------------------- reload

    /// `podstamp run` on the directory source, with `config`.
    fn dir_daemon(&self, config: &Path, templates: &Path, node_file: &Path, dir: &Path) -> Daemon {
        Daemon::start_binary(
            &self.binary,
            &[
                "--config",
                config.to_str().unwrap(),
                "--source",
                &format!("dir:{}", templates.display()),
                "--node-name",
                "bench-reload-node",
                "--node-file",
                node_file.to_str().unwrap(),
                "--manifest-dir",
                dir.to_str().unwrap(),
                "--cache-dir",
                self.cache.to_str().unwrap(),
            ],
            self.root
                .join("logs")
                .join(format!("{}.log", support::unique("reload"))),
            "warn",
        )
    }

    /// Edits the configuration file `reloads` times (a new setting of
    /// `substitute`, renamed into place) and times each edit until the
    /// affected manifest is renamed into place; then loads `reloads` plugins
    /// of new digests, one per edit, and compares the daemon's RSS.
    fn reload(&mut self, reloads: usize) {
        println!("\n== configuration reload -> manifest ({reloads} reloads) ==");
        let root = self.dir("reload");
        let templates = root.join("templates");
        fs::create_dir(&templates).unwrap();
        fs::write(templates.join("agent.yaml"), RELOAD_AGENT).unwrap();
        fs::write(templates.join("bystander.yaml"), RELOAD_BYSTANDER).unwrap();
        let node_file = root.join("node.yaml");
        fs::write(
            &node_file,
            serde_json::to_string(&node_json("bench-reload-node")).unwrap(),
        )
        .unwrap();
        let config = root.join("podstamp.yaml");
        let write_config = |marker: &str, identity: Option<&Path>| {
            let temp = root.join(".podstamp.yaml.tmp");
            fs::write(&temp, reload_config(marker, identity)).unwrap();
            fs::rename(&temp, &config).unwrap();
        };

        // Settings edits, with the code cache warm (the plugins are those
        // warm_cache compiled).
        write_config("R000000", None);
        let dir = self.dir("reload/manifests");
        let daemon = self.dir_daemon(&config, &templates, &node_file, &dir);
        if time_to_ready(&daemon, Instant::now(), READY_LIMIT).is_none() {
            println!(
                "  podstamp did not become ready: see {}",
                daemon.log.display()
            );
            return;
        }
        let bystander = identity(&dir.join("bystander.yaml"));
        let mut renames = Renames::watch(std::slice::from_ref(&dir));
        let mut edits = Samples::default();
        for i in 1..=reloads {
            let marker = format!("R{i:06}");
            let t0 = Instant::now();
            write_config(&marker, None);
            edits.push(renames.wait_marker("agent.yaml", &marker, t0, t0 + CHANGE_LIMIT)[0]);
        }
        let untouched = bystander.is_some() && identity(&dir.join("bystander.yaml")) == bystander;
        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "", "p50", "p90", "p99", "max", "mean", "lost"
        );
        edits.row("settings edit (warm code cache)");
        let verdict_p99 = edits.percentile(0.99);
        println!(
            "  target p99 < 200 ms with a warm code cache: {} (includes the watch's {} ms debounce)",
            verdict(verdict_p99.is_some_and(|p| p < Duration::from_millis(200)) && edits.lost == 0),
            podstamp::daemon::watch_file::DEBOUNCE.as_millis()
        );
        println!(
            "  the bystander template's manifest (its chain did not change): {}",
            if untouched {
                "untouched (same inode and mtime)"
            } else {
                "REWRITTEN"
            }
        );
        println!(
            "  reloads: {} applied, {} refused, {} unchanged",
            daemon.metric("podstamp_config_reloads_total{result=\"applied\"}"),
            daemon.metric("podstamp_config_reloads_total{result=\"refused\"}"),
            daemon.metric("podstamp_config_reloads_total{result=\"unchanged\"}"),
        );
        drop(daemon);

        // A new plugin digest at each reload: identity.wasm with a custom
        // section of its own (a valid component, the same behaviour, another
        // sha256), so each reload compiles and loads a component and drops
        // the replaced catalog's.
        let identity = fs::read(common::plugin("identity")).unwrap();
        let components: Vec<PathBuf> = (0..=reloads)
            .map(|i| {
                let path = root.join(format!("identity-{i:04}.wasm"));
                fs::write(&path, with_custom_section(&identity, i)).unwrap();
                path
            })
            .collect();
        write_config("D000000", Some(&components[0]));
        let dir = self.dir("reload/manifests-digests");
        let daemon = self.dir_daemon(&config, &templates, &node_file, &dir);
        if time_to_ready(&daemon, Instant::now(), READY_LIMIT).is_none() {
            println!(
                "  podstamp did not become ready: see {}",
                daemon.log.display()
            );
            return;
        }
        let pid = daemon.pid();
        let mut renames = Renames::watch(std::slice::from_ref(&dir));
        let mut digests = Samples::default();
        let mut after_first = None;
        for (i, component) in components.iter().enumerate().skip(1) {
            let marker = format!("D{i:06}");
            let t0 = Instant::now();
            write_config(&marker, Some(component));
            digests.push(renames.wait_marker("agent.yaml", &marker, t0, t0 + CHANGE_LIMIT)[0]);
            if i == 1 {
                after_first = proc_status_kib(pid, "VmRSS");
            }
        }
        let after_all = proc_status_kib(pid, "VmRSS");
        digests.row("new plugin digest (compiled)");
        match (after_first, after_all) {
            (Some(first), Some(all)) => {
                let growth = all.saturating_sub(first);
                println!(
                    "  RSS after the first reload with a new digest: {}; after {reloads}: {} (growth {}; target < 5 MiB: {})",
                    mib(first),
                    mib(all),
                    mib(growth),
                    verdict(growth < 5 * 1024)
                );
            }
            _ => println!(
                "  RSS not read (the daemon exited? see {})",
                daemon.log.display()
            ),
        }
        println!(
            "  reloads: {} applied, {} refused, {} unchanged",
            daemon.metric("podstamp_config_reloads_total{result=\"applied\"}"),
            daemon.metric("podstamp_config_reloads_total{result=\"refused\"}"),
            daemon.metric("podstamp_config_reloads_total{result=\"unchanged\"}"),
        );
        drop(daemon);
        self.reload_configmap(reloads);
    }

    /// The catalog from a ConfigMap (API source): `reloads` settings edits
    /// of the catalog ConfigMap, each timed until the affected manifest is
    /// renamed into place.
    fn reload_configmap(&mut self, reloads: usize) {
        use k8s_openapi::api::core::v1::ConfigMap;
        println!("\n== catalog ConfigMap edit -> manifest ({reloads} reloads) ==");
        let ns = self.namespace("reload-configmap");
        let node = "bench-reload-configmap-node";
        self.node(node);
        let templates = self.templates(&ns);
        for text in [RELOAD_AGENT, RELOAD_BYSTANDER] {
            let mut object: serde_json::Value = serde_norway::from_str(text).unwrap();
            object["metadata"]["labels"] = json!({"podstamp.io/enabled": "true"});
            let object: PodTemplate = serde_json::from_value(object).unwrap();
            self.rt
                .block_on(templates.create(&PostParams::default(), &object))
                .unwrap();
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
        let put_catalog = |marker: &str| {
            // The file's catalog (absolute paths), without its limits.
            let catalog = reload_config(marker, None);
            let catalog = catalog.split("\nlimits:").next().unwrap().to_string();
            let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "podstamp-catalog"}, "data": {"catalog.yaml": catalog}});
            self.rt
                .block_on(config_maps.patch(
                    "podstamp-catalog",
                    &PatchParams::apply("podstamp-bench").force(),
                    &Patch::Apply(object),
                ))
                .unwrap();
        };
        put_catalog("C000000");
        let root = self.dir("reload-configmap");
        let config = root.join("podstamp.yaml");
        fs::write(
            &config,
            "daemon: {catalog: {configMap: podstamp-catalog}}\nlimits: {timeout: 100ms, memory: 64Mi, maxManifestSize: 1Mi}\n",
        )
        .unwrap();
        let dir = self.dir("reload-configmap/manifests");
        let kubeconfig = self.server.kubeconfig("admin");
        let daemon = Daemon::start_binary(
            &self.binary,
            &[
                "--config",
                config.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                &ns,
                "--node-name",
                node,
                "--manifest-dir",
                dir.to_str().unwrap(),
                "--cache-dir",
                self.cache.to_str().unwrap(),
            ],
            self.root.join("logs").join(format!("{node}.log")),
            "warn",
        );
        if time_to_ready(&daemon, Instant::now(), READY_LIMIT).is_none() {
            println!(
                "  podstamp did not become ready: see {}",
                daemon.log.display()
            );
            return;
        }
        let bystander = identity(&dir.join("bystander.yaml"));
        let mut renames = Renames::watch(std::slice::from_ref(&dir));
        let mut edits = Samples::default();
        for i in 1..=reloads {
            let marker = format!("C{i:06}");
            let t0 = Instant::now();
            put_catalog(&marker);
            edits.push(renames.wait_marker("agent.yaml", &marker, t0, t0 + CHANGE_LIMIT)[0]);
        }
        let untouched = bystander.is_some() && identity(&dir.join("bystander.yaml")) == bystander;
        println!(
            "  {:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "", "p50", "p90", "p99", "max", "mean", "lost"
        );
        edits.row("catalog ConfigMap edit (warm)");
        let p99 = edits.percentile(0.99);
        println!(
            "  target p99 < 200 ms with a warm code cache: {} (from the API request to the rename: the watch event, the load, the render)",
            verdict(p99.is_some_and(|p| p < Duration::from_millis(200)) && edits.lost == 0),
        );
        println!(
            "  the bystander template's manifest (its chain did not change): {}",
            if untouched {
                "untouched (same inode and mtime)"
            } else {
                "REWRITTEN"
            }
        );
        println!(
            "  reloads: {} applied, {} refused, {} unchanged",
            daemon.metric("podstamp_config_reloads_total{result=\"applied\"}"),
            daemon.metric("podstamp_config_reloads_total{result=\"refused\"}"),
            daemon.metric("podstamp_config_reloads_total{result=\"unchanged\"}"),
        );
        drop(daemon);
    }
}

/// (inode, mtime) of a file, None when it cannot be read.
fn identity(path: &Path) -> Option<(u64, std::time::SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).ok()?;
    Some((meta.ino(), meta.modified().ok()?))
}

/// The reload part's templates: `agent` reads `substitute`'s settings;
/// `bystander` runs `node-env` alone, which no edit changes.
const RELOAD_AGENT: &str = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: agent}\ntemplate:\n  spec:\n    containers:\n    - name: agent\n      image: example.invalid/agent:1\n      command: [agent, \"--marker=${var.marker}\"]\n";
const RELOAD_BYSTANDER: &str = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: bystander, annotations: {podstamp.io/plugins: node-env}}\ntemplate:\n  spec:\n    containers:\n    - name: agent\n      image: example.invalid/bystander:1\n";

/// The bench's chain, `substitute` setting `marker`; with `identity`, that
/// component runs first.
fn reload_config(marker: &str, identity: Option<&Path>) -> String {
    let plugin = |name: &str| common::plugin(name).display().to_string();
    let arch = podstamp::node::host_architecture();
    let (entry, first) = match identity {
        Some(path) => (
            format!("  identity:\n    path: {}\n", path.display()),
            "identity, ",
        ),
        None => (String::new(), ""),
    };
    format!(
        "plugins:\n{entry}\
         \x20 arch-image:\n    path: {}\n    settings: {{images: {{agent: {{{arch}: example.invalid/agent:1-{arch}, arm64: example.invalid/agent:1-arm64}}}}}}\n\
         \x20 node-env:\n    path: {}\n    settings: {{containers: [agent], nodeIP: \"\", labels: {{NODE_ZONE: topology.kubernetes.io/zone}}}}\n\
         \x20 substitute:\n    path: {}\n    settings: {{vars: {{marker: {marker}}}}}\n\
         chain: [{first}arch-image, node-env, substitute]\n\
         limits: {{timeout: 100ms, memory: 64Mi, maxManifestSize: 1Mi}}\n",
        plugin("arch-image"),
        plugin("node-env"),
        plugin("substitute"),
    )
}

/// `component` with a custom section `podstamp-bench` holding `n`: a valid
/// component that behaves the same, with another sha256.
fn with_custom_section(component: &[u8], n: usize) -> Vec<u8> {
    fn leb128(mut value: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"podstamp-bench";
    let payload = n.to_le_bytes();
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name);
    body.extend_from_slice(&payload);
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb128(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

// ------------------------------------------------------------------ objects

fn node_json(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/arch": podstamp::node::host_architecture(),
        "topology.kubernetes.io/zone": "zone-a"}}})
}

/// A small agent pod. Each plugin of the chain has work to do: arch-image
/// sets the image, node-env adds env vars, substitute fills the placeholders.
/// MARKER is what the latency parts change.
fn template(name: &str, marker: &str, selected: bool) -> PodTemplate {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "labels": {"podstamp.io/enabled": selected.to_string()}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{
                "name": "agent", "image": "set-by-arch-image",
                "command": ["agent", "--node=${node.name}", "--zone=${node.label[topology.kubernetes.io/zone]}"],
                "env": [{"name": "MARKER", "value": marker}]
            }]}
        }
    }))
    .unwrap()
}

/// The example chain (arch-image → node-env → substitute, as in
/// examples/podstamp.yaml) with settings for the bench's template.
fn write_bench_config(root: &Path) -> PathBuf {
    let plugin = |name: &str| common::plugin(name).display().to_string();
    let arch = podstamp::node::host_architecture();
    let text = format!(
        "plugins:\n\
         \x20 arch-image:\n    path: {}\n    settings: {{images: {{agent: {{{arch}: example.invalid/agent:1-{arch}, arm64: example.invalid/agent:1-arm64}}}}}}\n\
         \x20 node-env:\n    path: {}\n    settings: {{containers: [agent], nodeIP: \"\", labels: {{NODE_ZONE: topology.kubernetes.io/zone}}}}\n\
         \x20 substitute:\n    path: {}\n\
         chain: [arch-image, node-env, substitute]\n\
         limits: {{timeout: 100ms, memory: 64Mi, maxManifestSize: 1Mi}}\n",
        plugin("arch-image"),
        plugin("node-env"),
        plugin("substitute"),
    );
    let path = root.join("podstamp.yaml");
    fs::write(&path, text).unwrap();
    path
}

/// A directory only its owner may write, as the code cache must be.
/// Compiles the chain's plugins into `cache` with one offline render, so
/// that every part that says "warm code cache" has one, whichever parts run.
fn warm_cache(binary: &Path, config: &Path, cache: &Path) {
    let template = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: warm}\n\
                    template:\n  spec:\n    containers: [{name: agent, image: x}]\n";
    let mut render = Command::new(binary)
        .args(["render", "-", "--node-name", "warm", "--node-label"])
        .arg("topology.kubernetes.io/zone=a")
        .arg("--config")
        .arg(config)
        .arg("--cache-dir")
        .arg(cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run podstamp render");
    use std::io::Write as _;
    render
        .stdin
        .take()
        .unwrap()
        .write_all(template.as_bytes())
        .unwrap();
    let status = render.wait().unwrap();
    assert!(status.success(), "warming the code cache failed: {status}");
}

fn private_dir(path: &Path) {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .unwrap();
}

/// Creates `objects` with at most `in_flight` requests at a time: the count
/// created and the errors.
async fn create_all(
    api: Api<PodTemplate>,
    objects: Vec<PodTemplate>,
    in_flight: usize,
) -> (usize, Vec<String>) {
    let results: Vec<Result<(), String>> = futures::stream::iter(objects)
        .map(|object| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &object)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let created = results.iter().filter(|r| r.is_ok()).count();
    (
        created,
        results.into_iter().filter_map(Result::err).collect(),
    )
}

/// Runs a watcher until its initial list is done: the time it took and the
/// objects it listed.
async fn initial_list(
    api: Api<PodTemplate>,
    config: watcher::Config,
    limit: Duration,
) -> Result<(Duration, usize), String> {
    let start = Instant::now();
    let mut stream = std::pin::pin!(watcher::watcher(api, config));
    let mut items = 0;
    loop {
        let left = limit.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, stream.next()).await {
            Err(_) => return Err("timed out".into()),
            Ok(None) => return Err("the stream ended".into()),
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(Some(Ok(watcher::Event::InitApply(_)))) => items += 1,
            Ok(Some(Ok(watcher::Event::InitDone))) => return Ok((start.elapsed(), items)),
            Ok(Some(Ok(_))) => {}
        }
    }
}

// ------------------------------------------------------------- observation

/// Polls /readyz every 5 ms until 200: the time since `since`; None after
/// `limit`.
fn time_to_ready(daemon: &Daemon, since: Instant, limit: Duration) -> Option<Duration> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if daemon.get("/readyz").is_some_and(|(code, _)| code == 200) {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Renames into place (IN_MOVED_TO) in a set of directories.
struct Renames {
    inotify: Inotify,
    dirs: Vec<PathBuf>,
    watches: Vec<WatchDescriptor>,
    buffer: Vec<u8>,
}

impl Renames {
    fn watch(dirs: &[PathBuf]) -> Renames {
        let inotify = Inotify::init().expect("inotify");
        let watches = dirs
            .iter()
            .map(|d| {
                inotify
                    .watches()
                    .add(d, WatchMask::MOVED_TO)
                    .expect("inotify watch")
            })
            .collect();
        Renames {
            inotify,
            dirs: dirs.to_vec(),
            watches,
            buffer: vec![0; 256 * 1024],
        }
    }

    /// The next renames: (directory index, file name, when seen); empty once
    /// `deadline` passed.
    fn next(&mut self, deadline: Instant) -> Vec<(usize, String, Instant)> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Vec::new();
            }
            let wait = (deadline - now).as_millis().clamp(1, 1000) as i32;
            let mut poll = libc::pollfd {
                fd: self.inotify.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            if unsafe { libc::poll(&mut poll, 1, wait) } <= 0 {
                continue;
            }
            let when = Instant::now();
            let mut out = Vec::new();
            match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => {
                    for event in events {
                        if let (Some(i), Some(name)) =
                            (self.watches.iter().position(|w| *w == event.wd), event.name)
                        {
                            out.push((i, name.to_string_lossy().into_owned(), when));
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("inotify: {e}"),
            }
            if !out.is_empty() {
                return out;
            }
        }
    }

    /// Waits until `file`, holding `marker`, is renamed into place in every
    /// directory: the time each took since `t0`, None if not by `deadline`.
    fn wait_marker(
        &mut self,
        file: &str,
        marker: &str,
        t0: Instant,
        deadline: Instant,
    ) -> Vec<Option<Duration>> {
        let mut took = vec![None; self.dirs.len()];
        while took.iter().any(Option::is_none) {
            let batch = self.next(deadline);
            if batch.is_empty() {
                break;
            }
            for (i, name, when) in batch {
                if name == file
                    && took[i].is_none()
                    && fs::read_to_string(self.dirs[i].join(&name))
                        .is_ok_and(|text| text.contains(marker))
                {
                    took[i] = Some(when - t0);
                }
            }
        }
        took
    }
}

/// Latencies, and the updates that never arrived or could not be sent.
#[derive(Default)]
struct Samples {
    took: Vec<Duration>,
    lost: usize,
    errors: Vec<String>,
}

impl Samples {
    fn push(&mut self, took: Option<Duration>) {
        match took {
            Some(d) => self.took.push(d),
            None => self.lost += 1,
        }
    }

    /// Nearest-rank percentile of the arrived ones.
    fn percentile(&self, q: f64) -> Option<Duration> {
        let mut sorted = self.took.clone();
        sorted.sort();
        let n = sorted.len();
        (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
    }

    fn row(&self, name: &str) {
        let p = |q| self.percentile(q).map_or("-".into(), ms);
        let mean = (!self.took.is_empty())
            .then(|| self.took.iter().sum::<Duration>() / self.took.len() as u32);
        println!(
            "  {name:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            p(0.5),
            p(0.9),
            p(0.99),
            p(1.0),
            mean.map_or("-".into(), ms),
            format!(
                "{}/{}",
                self.lost + self.errors.len(),
                self.took.len() + self.lost + self.errors.len()
            )
        );
    }
}

/// A `kVALUE` line of /proc/PID/status, in KiB.
fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The fields of /proc/PID/stat after the command name.
fn proc_stat(pid: u32) -> Option<Vec<u64>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    // Field 3 (state) is a letter; keep the numbering by putting 0 there.
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// utime + stime (+ cutime + cstime: children waited for) in clock ticks.
fn proc_ticks(pid: u32, children: bool) -> Option<u64> {
    let f = proc_stat(pid)?;
    // Fields 14..=17 of stat, counted from 3 here.
    let (utime, stime, cutime, cstime) = (f[11], f[12], f[13], f[14]);
    Some(utime + stime + if children { cutime + cstime } else { 0 })
}

/// The RSS of every process in process group `pgid`, in KiB.
fn group_rss_kib(pgid: u32) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|f| f.get(2) == Some(&u64::from(pgid))))
        .filter_map(|pid| proc_status_kib(pid, "VmRSS"))
        .sum()
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// The CPU ticks `ticks` counts over `window`, and the peak of `rss`,
/// sampled every 100 ms.
fn observe(
    window: Duration,
    ticks: impl Fn() -> Option<u64>,
    rss: impl Fn() -> u64,
) -> (Option<u64>, u64) {
    let start = ticks();
    let end = Instant::now() + window;
    let mut peak = 0;
    while Instant::now() < end {
        peak = peak.max(rss());
        std::thread::sleep(Duration::from_millis(100));
    }
    (start.zip(ticks()).map(|(a, b)| b.saturating_sub(a)), peak)
}

/// tests/bench/kubectl-poller.sh in a process group of its own, so that it
/// and its kubectl and jq children go together.
struct Poller {
    child: Child,
}

impl Poller {
    fn start(args: &[&str], kubeconfig: &Path, log: &Path, once: bool) -> Poller {
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
    fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
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

// -------------------------------------------------- the API server's metrics

/// One sample of the Prometheus text format.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(parse_sample)
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name, mut rest) = match line.find('{') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some(Sample {
                name: name.to_string(),
                labels: BTreeMap::new(),
                value: value.split_whitespace().next()?.parse().ok()?,
            });
        }
    };
    let mut labels = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            rest = after;
            break;
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    value.push(if escaped == 'n' { '\n' } else { escaped });
                }
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.to_string(), value);
        rest = &after[end + 1..];
    }
    Some(Sample {
        name: name.to_string(),
        labels,
        value: rest.split_whitespace().next()?.parse().ok()?,
    })
}

/// apiserver_request_total for podtemplates and nodes, by (resource, verb).
fn requests(samples: &[Sample]) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for s in samples {
        if s.name == "apiserver_request_total"
            && ["podtemplates", "nodes"].contains(&s.label("resource"))
        {
            *out.entry((s.label("resource").to_string(), s.label("verb").to_string()))
                .or_default() += s.value;
        }
    }
    out
}

fn request_delta(before: &[Sample], after: &[Sample]) -> BTreeMap<(String, String), f64> {
    let before = requests(before);
    requests(after)
        .into_iter()
        .map(|(key, n)| {
            let d = n - before.get(&key).copied().unwrap_or(0.0);
            (key, d)
        })
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

fn print_requests(before: &[Sample], after: &[Sample], indent: &str) {
    let delta = request_delta(before, after);
    if delta.is_empty() {
        println!("{indent}(none counted)");
    }
    for ((resource, verb), n) in delta {
        println!("{indent}{resource:<13} {verb:<6} {n}");
    }
    println!(
        "{indent}(a WATCH is counted when it ends; open ones are in apiserver_longrunning_requests)"
    );
}

// --------------------------------------------------------------- formatting

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn verdict(met: bool) -> &'static str {
    if met { "target met" } else { "not met" }
}
