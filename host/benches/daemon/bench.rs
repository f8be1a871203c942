//! What every part shares: the API server, an admin client on it, the
//! copy of podstamp the daemons run with its configuration and its warm code
//! cache, and the helpers that make a part's namespace, Node, templates,
//! daemon and poller. Each part makes its objects in a namespace of its own,
//! so parts run in any combination.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, PodTemplate};
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::apimetrics::{Sample, parse_metrics};
use crate::objects::{node_json, private_dir, template, warm_cache, write_bench_config};
use crate::poller::Poller;
use crate::support::{self, ApiServer, Daemon};
use crate::{SELECTOR, common};

/// The API server, an admin client, and what every part shares.
pub struct Bench {
    pub rt: tokio::runtime::Runtime,
    pub server: ApiServer,
    pub client: kube::Client,
    /// target/bench-daemon: emptied at start.
    pub root: PathBuf,
    pub config: PathBuf,
    /// The compiled-code cache the daemons share (warm after the first start).
    pub cache: PathBuf,
    /// The copy of the podstamp binary that every daemon of this run runs.
    pub binary: PathBuf,
    pub has_poller: bool,
    pub updates: usize,
    pub daemons: usize,
    rng: u64,
    /// (VmRSS, VmHWM) in KiB of the daemon after the 1,000-template sync.
    pub after_sync_rss: Option<(u64, u64)>,
}

impl Bench {
    /// `apf`: the API server with API Priority and Fairness on (the
    /// harness turns it off by default), as the fleet part wants it.
    /// `profiling`: its /debug/pprof on (off in the harness), for the
    /// fleet part's CPU profile.
    pub fn new(updates: usize, daemons: usize, apf: bool, profiling: bool) -> Bench {
        let root = common::repo().join("target/bench-daemon");
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("logs")).unwrap();
        let cache = root.join("cache");
        private_dir(&cache);
        let config = write_bench_config(&root);
        let binary = root.join("podstamp");
        fs::copy(env!("CARGO_BIN_EXE_podstamp"), &binary).unwrap();
        warm_cache(&binary, &config, &cache);
        let mut args = vec!["--"];
        if apf {
            args.push("--enable-priority-and-fairness=true");
        }
        if profiling {
            args.push("--profiling=true");
        }
        let server = if args.len() > 1 {
            ApiServer::start_with(&root.join("apiserver"), &args)
        } else {
            ApiServer::start(&root.join("apiserver"))
        };
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

    pub fn server_version(&self) -> String {
        self.rt
            .block_on(self.client.apiserver_version())
            .map_or_else(|e| format!("? ({e})"), |v| v.git_version)
    }

    /// A pseudo-random duration in [0, limit) (xorshift; only to break phase).
    pub fn random_pause(&mut self, limit: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        limit.mul_f64((self.rng % 10_000) as f64 / 10_000.0)
    }

    /// A fresh namespace for one part.
    pub fn namespace(&self, part: &str) -> String {
        let ns = format!("bench-{part}");
        let api: Api<Namespace> = Api::all(self.client.clone());
        let object = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &object))
            .unwrap_or_else(|e| panic!("create namespace {ns}: {e}"));
        ns
    }

    /// A Node the daemons can render for (each daemon waits for its Node).
    pub fn node(&self, name: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        let object = serde_json::from_value(node_json(name)).unwrap();
        self.rt
            .block_on(api.create(&PostParams::default(), &object))
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
    }

    pub fn templates(&self, ns: &str) -> Api<PodTemplate> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn create_template(&self, ns: &str, name: &str, marker: &str) {
        let object = template(name, marker, true);
        self.rt
            .block_on(self.templates(ns).create(&PostParams::default(), &object))
            .unwrap_or_else(|e| panic!("create template {ns}/{name}: {e}"));
    }

    /// Sets one annotation of the template (e.g. its rollout policy).
    pub fn annotate(&self, ns: &str, name: &str, key: &str, value: &str) {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.rt
            .block_on(
                self.templates(ns)
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
            )
            .unwrap_or_else(|e| panic!("annotate template {ns}/{name}: {e}"));
    }

    /// Sets the template's marker (an env value of its container).
    pub fn set_marker(&self, ns: &str, name: &str, marker: &str) -> Result<(), String> {
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
    pub fn api_metrics(&self) -> Vec<Sample> {
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
    ///
    /// Its revision history is its node's own under the bench's root, so
    /// it starts empty in each bench run, as on a new node, and is kept
    /// across the restarts of one run, as on a node; left to the test
    /// support's default (one directory per log path, outside the root), a
    /// second bench run found the first's rollout states and revisions and
    /// measured a restart, not a first sync.
    pub fn daemon(&self, ns: &str, node: &str, dir: &Path, cache: &Path) -> Daemon {
        let kubeconfig = self.server.kubeconfig("admin");
        let revisions = self.root.join("revisions").join(node);
        fs::create_dir_all(&revisions).unwrap();
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
                "--revisions-dir",
                revisions.to_str().unwrap(),
            ],
            self.root.join("logs").join(format!("{node}.log")),
            "warn",
        )
    }

    pub fn poller(&self, ns: &str, dir: &Path, log: &str) -> Poller {
        Poller::start(
            &[ns, SELECTOR, dir.to_str().unwrap(), "1"],
            &self.server.kubeconfig("admin"),
            &self.root.join("logs").join(log),
            false,
        )
    }

    /// A fresh, empty directory under target/bench-daemon.
    pub fn dir(&self, path: &str) -> PathBuf {
        let dir = self.root.join(path);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
