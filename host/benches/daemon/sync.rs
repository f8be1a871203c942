//! `sync`: 1,000 selected templates (PODSTAMP_BENCH_SYNC_TEMPLATES) beside
//! 10,000 unselected ones in one namespace: time
//! from the daemon's start to all manifests, the API requests it made, the
//! poller's first sweep over the same namespace, and the initial list alone
//! through kube-runtime's watcher with each list option.

use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;

use crate::apimetrics::{print_requests, request_delta};
use crate::bench::Bench;
use crate::objects::template;
use crate::observe::Renames;
use crate::poller::Poller;
use crate::procfs::{
    children_rss_kib, children_ticks, clock_ticks, proc_status_kib, proc_ticks, rss_by_mapping,
};
use crate::report::{mib, ms, verdict};
use crate::{READY_LIMIT, SELECTOR};

impl Bench {
    pub fn sync(&mut self) {
        // The targets are for 1,000 selected; more shows how the pass
        // grows with their number.
        let selected = crate::env_size("PODSTAMP_BENCH_SYNC_TEMPLATES", 1000);
        const UNSELECTED: usize = 10_000;
        println!(
            "\n== initial sync: {selected} selected templates + {UNSELECTED} unselected in the namespace{} ==",
            if selected == 1000 {
                ""
            } else {
                " (the targets are for 1,000)"
            }
        );
        let ns = self.namespace("sync");
        let node = "bench-sync-node";
        self.node(node);
        let objects: Vec<PodTemplate> = (0..selected)
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

        // The daemon, on a disk with nothing of the set-up left to write:
        // the bench's copy of podstamp (200 MB with its line tables), the
        // API server's writes of 11,000 templates and the previous run's
        // tree removed would otherwise be written back (and, on a disk
        // mounted with `discard`, trimmed) under the sync's fsyncs. It does
        // not stop each run of a sitting being dearer than the last
        // (docs/performance.md §3.4): compare runs in alternating pairs.
        flush_disk();
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
                    if seen.len() == selected / 2 {
                        half = Some(took);
                    }
                    if seen.len() == selected {
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
        // The revision history is written behind the passes: when its
        // writer has nothing queued (polled every 10 ms).
        // (A podstamp that writes it in the pass has no such metric.)
        let mut history = None;
        while history.is_none() && Instant::now() < deadline {
            let body = daemon.get("/metrics").map(|(_, b)| b).unwrap_or_default();
            let value = |name: &str| crate::common::sample_value(&body, name);
            if value("podstamp_initial_sync_seconds").is_some() {
                match value("podstamp_revision_history_queued") {
                    None => break,
                    Some(0.0) => history = Some(spawned.elapsed()),
                    Some(_) => {}
                }
            }
            if history.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Give the watch requests a moment to be counted, then read both sides.
        std::thread::sleep(Duration::from_millis(500));
        let after = self.api_metrics();
        let metrics = daemon
            .get("/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        let daemon_metric = |sample: &str| crate::common::sample_value(&metrics, sample);
        let rss = (
            proc_status_kib(daemon.pid(), "VmRSS"),
            proc_status_kib(daemon.pid(), "VmHWM"),
        );
        if let (Some(rss), Some(hwm)) = rss {
            self.after_sync_rss = Some((rss, hwm));
        }
        let rss_split = rss_by_mapping(daemon.pid());
        let helper = children_rss_kib(daemon.pid());
        // CPU since the spawn: podstamp's own, and its pod check helper's
        // (started by the first check; its start included).
        let cpu_ms = |ticks: u64| ticks as f64 * 1000.0 / clock_ticks() as f64;
        let daemon_cpu = proc_ticks(daemon.pid(), false).map(cpu_ms);
        let helper_cpu = cpu_ms(children_ticks(daemon.pid()));
        let initial_sync = daemon_metric("podstamp_initial_sync_seconds");
        let show = |d: Option<Duration>| d.map_or("timed out".to_string(), ms);
        println!("  podstamp (3 plugins, warm code cache, log level warn):");
        println!(
            "    spawn -> first manifest written        {:>12}",
            show(first)
        );
        println!(
            "    spawn -> {:>4}th manifest written       {:>12}",
            selected / 2,
            show(half)
        );
        println!(
            "    spawn -> all {selected} manifests written      {:>12}   ({} files seen)",
            show(all),
            seen.len()
        );
        println!(
            "    spawn -> /readyz 200                   {:>12}",
            show(ready)
        );
        println!(
            "    spawn -> revision history written      {:>12}   (behind the passes; polled every 10 ms)",
            history.map_or("in the pass".to_string(), ms)
        );
        println!(
            "    podstamp_initial_sync_seconds          {:>12}   target < 0.5 s after the list returns: {}",
            initial_sync.map_or("absent".into(), |s| ms(Duration::from_secs_f64(s))),
            initial_sync.map_or("unknown", |s| verdict(s < 0.5))
        );
        // Where the pass's time went (the daemon's own wall-time sums on
        // its reconciler thread; "rest" is the pass's time outside them).
        let parts: Vec<(&str, f64)> = metrics
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("podstamp_initial_sync_part_seconds{part=\"")?;
                let (part, value) = rest.split_once("\"} ")?;
                Some((part, value.parse().ok()?))
            })
            .filter(|(part, _)| *part != "start_to_list")
            .collect();
        if let (Some(total), false) = (initial_sync, parts.is_empty()) {
            let summed: f64 = parts.iter().map(|(_, s)| s).sum();
            let plugins: f64 = ["arch-image", "node-env", "substitute"]
                .iter()
                .filter_map(|p| {
                    daemon_metric(&format!(
                        "podstamp_plugin_call_duration_seconds_sum{{plugin=\"{p}\",result=\"ok\"}}"
                    ))
                })
                .sum();
            let share = |s: f64| {
                format!(
                    "{:>9} {:>4.0}%",
                    ms(Duration::from_secs_f64(s)),
                    s / total * 100.0
                )
            };
            println!("    the sync's time by part (wall, reconciler thread):");
            for (part, s) in &parts {
                println!("      {part:<38} {}", share(*s));
            }
            println!(
                "      {:<38} {}",
                "  of render: the plugin calls",
                share(plugins)
            );
            println!(
                "      {:<38} {}",
                "rest of the pass",
                share((total - summed).max(0.0))
            );
        }
        let written = daemon_metric("podstamp_renders_total{result=\"written\"}").unwrap_or(0.0);
        println!(
            "    CPU since the spawn: podstamp {}, its pod check helper {helper_cpu:.0} ms ({:.0} µs a manifest written)",
            daemon_cpu.map_or("unknown".into(), |c| format!("{c:.0} ms")),
            if written > 0.0 {
                helper_cpu * 1000.0 / written
            } else {
                0.0
            }
        );
        if let Some(to_list) =
            daemon_metric("podstamp_initial_sync_part_seconds{part=\"start_to_list\"}")
        {
            println!(
                "    daemon start -> first complete list     {:>12}   (catalog, watches, the list and its decode)",
                ms(Duration::from_secs_f64(to_list))
            );
        }
        let templates = daemon_metric("podstamp_templates");
        println!(
            "    podstamp_templates                     {:>12}   (server-side selection: {})",
            templates.map_or("absent".into(), |n| format!("{n}")),
            templates.map_or("unknown", |n| if n as usize == selected {
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
                "    RSS after the sync                     {:>12}   (peak {}), target < 32 MiB: {}",
                mib(rss),
                mib(hwm),
                verdict(rss < 32 * 1024)
            );
            println!(
                "      of which (smaps): {}",
                rss_split
                    .iter()
                    .map(|(what, kib)| format!("{what} {}", mib(*kib)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            println!(
                "    + the pod check's helper after the sync {:>9.1} MiB   ({} process, stopped 10 s after the last render)",
                helper.0 as f64 / 1024.0,
                helper.1
            );
        }
        println!(
            "    API requests made by the daemon (the API server's apiserver_request_total, by verb):"
        );
        print_requests(&before, &after, "      ");
        drop(daemon);

        // The poller's first sweep: one kubectl get of the selected ones.
        if self.has_poller {
            let dir = self.dir("sync/poller");
            flush_disk();
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
            // Side by side: both from their start to the 1,000th file.
            if let Some(all) = all {
                println!(
                    "  podstamp vs the poller, start -> all {selected} manifests: {} vs {} = {:.2}x the poller's time ({})",
                    ms(all),
                    ms(took),
                    all.as_secs_f64() / took.as_secs_f64(),
                    if all < took {
                        "podstamp is faster"
                    } else {
                        "podstamp is NOT faster"
                    }
                );
            }
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

/// Writes back everything the machine holds for its disks, and says how
/// long it took.
fn flush_disk() {
    let start = Instant::now();
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    println!(
        "  (the disks flushed first, {:.0} ms)",
        start.elapsed().as_secs_f64() * 1000.0
    );
}
