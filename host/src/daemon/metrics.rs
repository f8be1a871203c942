//! The daemon's health and metrics, and the small HTTP server that shows
//! them: `/healthz`, `/readyz` (ready after the first full sync) and
//! `/metrics` (Prometheus text format 0.0.4).
//!
//! The server may listen on every interface, so it bounds what clients can
//! take: at most a fixed number of connections at once (a new one closes
//! the oldest), each with a short time to send its request and to take the
//! response. No client can exhaust the daemon's file descriptors or keep
//! the kubelet's probes out.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::daemon::revisions::Counts as HistoryCounts;
use crate::oci::PullCounts;
use crate::reason::Reason;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{self, AbortHandle, JoinError, JoinSet};

/// Distinct (resource, verb) pairs of `podstamp_api_requests_total` kept
/// apart; the daemon uses a handful, and past this new ones count as `other`.
pub const MAX_API_SERIES: usize = 64;

/// Distinct plugin names of `podstamp_plugin_scope_refusals_total` kept
/// apart (a catalog names a handful; names from catalogs long replaced
/// would otherwise pile up); past this, new names count as `other`.
pub const MAX_SCOPE_SERIES: usize = 64;

/// Upper bounds of the plugin call duration buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The `watch` label of the watch metrics: the daemon's watches of the API
/// (all the ConfigMaps together).
const WATCHES: [&str; 6] = [
    "podtemplates",
    "node",
    "namespace",
    "pods",
    "configmaps",
    "leases",
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Inner {
    renders: BTreeMap<&'static str, u64>,
    failures: BTreeMap<Reason, u64>,
    plugin_calls: BTreeMap<(String, &'static str), Histogram>,
    /// Renders refused because a plugin changed a field outside its scope,
    /// by the plugin's catalog name.
    scope_refusals: BTreeMap<String, u64>,
    managed: usize,
    templates: usize,
    last_sync: Option<f64>,
    initial_sync: Option<Duration>,
    /// Where the first sync's time went, by part.
    initial_sync_parts: Vec<(&'static str, Duration)>,
    watch_restarts: BTreeMap<&'static str, u64>,
    watch_lists: BTreeMap<&'static str, u64>,
    removed: u64,
    events_dropped: u64,
    reloads: BTreeMap<&'static str, u64>,
    /// The digest of the catalog in use; None until one is.
    catalog: Option<String>,
    /// Per template: the revision in place and its rollout phase.
    rollouts: BTreeMap<String, (String, &'static str)>,
    rollout_results: BTreeMap<&'static str, u64>,
    /// Per template: the kubelet has not started the revision in place
    /// past its deadline (kubernetes/kubernetes#105543).
    kubelet_not_started: BTreeMap<String, bool>,
    /// Per template: times the mirror pod and the node itself disagreed.
    evidence_disagreements: BTreeMap<String, u64>,
    /// Writes to the API for rollouts across nodes: (object, result).
    fleet_writes: BTreeMap<(&'static str, &'static str), u64>,
    /// The same writes by what they were for (status, halt, take, renew,
    /// release) and result, a call that got no answer in time apart
    /// (timeout): what the fleet bench tells the excess writes by.
    fleet_kinds: BTreeMap<(&'static str, &'static str), u64>,
    slots_held: usize,
    /// Requests sent to the API server: (resource, verb).
    api_requests: BTreeMap<(String, &'static str), u64>,
}

/// Everything `/metrics` and `/readyz` report; shared by the daemon's parts.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    ready: AtomicBool,
    /// The plugin registry's pull counts, kept by the catalog loader.
    oci_pulls: OnceLock<Arc<PullCounts>>,
    /// The revision history's writer, behind the passes.
    history: OnceLock<Arc<HistoryCounts>>,
}

/// How one reload of the catalog ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    /// A new catalog was loaded and handed to the reconciler.
    Applied,
    /// The new catalog failed; the one in use keeps serving.
    Refused,
    /// The source changed but the catalog it gives is the one in use.
    Unchanged,
}

impl ReloadResult {
    pub fn label(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Refused => "refused",
            ReloadResult::Unchanged => "unchanged",
        }
    }
}

/// How one render ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderResult {
    /// The manifest changed and was written.
    Written,
    /// The manifest was rendered to the bytes already on disk.
    Unchanged,
    /// The render or the write failed; the last good manifest stays.
    Failed(Reason),
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn render(&self, result: RenderResult) {
        let mut inner = self.lock();
        let key = match result {
            RenderResult::Written => "written",
            RenderResult::Unchanged => "unchanged",
            RenderResult::Failed(reason) => {
                *inner.failures.entry(reason).or_default() += 1;
                "failed"
            }
        };
        *inner.renders.entry(key).or_default() += 1;
    }

    pub fn plugin_call(&self, plugin: &str, ok: bool, took: Duration) {
        let mut inner = self.lock();
        let result = if ok { "ok" } else { "error" };
        let h = inner
            .plugin_calls
            .entry((plugin.to_string(), result))
            .or_default();
        let seconds = took.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += seconds;
    }

    /// A render refused because `plugin` changed a field outside its scope.
    pub fn scope_refusal(&self, plugin: &str) {
        let mut inner = self.lock();
        let key = if inner.scope_refusals.contains_key(plugin)
            || inner.scope_refusals.len() < MAX_SCOPE_SERIES
        {
            plugin.to_string()
        } else {
            "other".to_string()
        };
        *inner.scope_refusals.entry(key).or_default() += 1;
    }

    /// The count of [`Metrics::scope_refusal`] for `plugin`.
    pub fn scope_refusals(&self, plugin: &str) -> u64 {
        self.lock().scope_refusals.get(plugin).copied().unwrap_or(0)
    }

    pub fn set_managed(&self, n: usize) {
        self.lock().managed = n;
    }

    /// How many templates the sources delivered (valid or not): with
    /// server-side selection, only the selected ones.
    pub fn set_templates(&self, n: usize) {
        self.lock().templates = n;
    }

    /// Records how long the first sync took, from the complete list of
    /// templates arriving to every manifest rendered and written.
    pub fn set_initial_sync(&self, took: Duration) {
        self.lock().initial_sync = Some(took);
    }

    /// Records where the first sync's time went: wall time by part
    /// (render, check, commit, ...), for the sync benchmark.
    pub fn set_initial_sync_parts(&self, parts: Vec<(&'static str, Duration)>) {
        self.lock().initial_sync_parts = parts;
    }

    pub fn removed(&self) {
        self.lock().removed += 1;
    }

    /// An Event was not queued: the queue to the API server was full.
    pub fn event_dropped(&self) {
        self.lock().events_dropped += 1;
    }

    pub fn reload(&self, result: ReloadResult) {
        *self.lock().reloads.entry(result.label()).or_default() += 1;
    }

    /// The catalog now in use (`podstamp_catalog_info{digest}`).
    pub fn set_catalog(&self, digest: &str) {
        self.lock().catalog = Some(digest.to_string());
    }

    pub fn synced_now(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.lock().last_sync = Some(now);
    }

    /// A watch failed and is tried again (resumed, or listed again).
    pub fn watch_restart(&self, watch: &'static str) {
        *self.lock().watch_restarts.entry(watch).or_default() += 1;
    }

    /// A watch starts a complete list.
    pub fn watch_list(&self, watch: &'static str) {
        *self.lock().watch_lists.entry(watch).or_default() += 1;
    }

    pub fn watch_restarts(&self, watch: &str) -> u64 {
        self.lock().watch_restarts.get(watch).copied().unwrap_or(0)
    }

    pub fn watch_lists(&self, watch: &str) -> u64 {
        self.lock().watch_lists.get(watch).copied().unwrap_or(0)
    }

    /// Template `id`'s revision in place and its rollout phase.
    pub fn set_rollout(&self, id: &str, revision: &str, phase: &'static str) {
        self.lock()
            .rollouts
            .insert(id.to_string(), (revision.to_string(), phase));
    }

    pub fn forget_rollout(&self, id: &str) {
        let mut inner = self.lock();
        inner.rollouts.remove(id);
        inner.kubelet_not_started.remove(id);
    }

    /// The mirror pod and the node itself disagreed about template `id`.
    pub fn evidence_disagreed(&self, id: &str) {
        *self
            .lock()
            .evidence_disagreements
            .entry(id.to_string())
            .or_default() += 1;
    }

    /// Whether the kubelet has not started template `id`'s revision in
    /// place past its deadline.
    pub fn set_kubelet_not_started(&self, id: &str, stalled: bool) {
        self.lock()
            .kubelet_not_started
            .insert(id.to_string(), stalled);
    }

    /// A rollout ended: `succeeded`, `failed`; `rolled_back` besides
    /// `failed` when the previous revision was written back.
    pub fn rollout_result(&self, result: &'static str) {
        *self.lock().rollout_results.entry(result).or_default() += 1;
    }

    /// A write of a rollout object (`slot` or `status`) to the API:
    /// `ok`, `conflict` (someone else wrote first) or `error`.
    pub fn fleet_write(&self, object: &'static str, result: &'static str) {
        *self
            .lock()
            .fleet_writes
            .entry((object, result))
            .or_default() += 1;
    }

    /// One write for rollouts across nodes, by what it was for (`kind`:
    /// status, halt, take, renew, release) and `result` (ok, conflict,
    /// timeout, error).
    pub fn fleet_write_kind(&self, kind: &'static str, result: &'static str) {
        *self.lock().fleet_kinds.entry((kind, result)).or_default() += 1;
    }

    /// Every (kind, result) count of [`Metrics::fleet_write_kind`] so far.
    pub fn fleet_writes_by_kind(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.lock().fleet_kinds.clone()
    }

    /// Shows `pulls` (the catalog's registry's) as `podstamp_oci_pulls_total`.
    pub fn follow_oci_pulls(&self, pulls: Arc<PullCounts>) {
        let _ = self.oci_pulls.set(pulls);
    }

    /// Shows the revision history's writer as
    /// `podstamp_revision_history_*`.
    pub fn follow_revision_history(&self, counts: Arc<HistoryCounts>) {
        let _ = self.history.set(counts);
    }

    /// One request sent to the API server (see `api_requests`).
    pub fn api_request(&self, resource: String, verb: &'static str) {
        let mut inner = self.lock();
        let full = inner.api_requests.len() >= MAX_API_SERIES;
        let key = if full && !inner.api_requests.contains_key(&(resource.clone(), verb)) {
            ("other".to_string(), verb)
        } else {
            (resource, verb)
        };
        *inner.api_requests.entry(key).or_default() += 1;
    }

    pub fn set_slots_held(&self, n: usize) {
        self.lock().slots_held = n;
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The Prometheus text exposition of every metric.
    pub fn exposition(&self) -> String {
        let inner = self.lock();
        let mut out = String::from(
            "# HELP podstamp_renders_total Renders of a template for this node, by result (written, unchanged, failed).\n\
             # TYPE podstamp_renders_total counter\n",
        );
        for result in ["written", "unchanged", "failed"] {
            let n = inner.renders.get(result).copied().unwrap_or(0);
            let _ = writeln!(out, "podstamp_renders_total{{result=\"{result}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_render_failures_total Failed renders by reason.\n# TYPE podstamp_render_failures_total counter"
        );
        for (reason, n) in &inner.failures {
            let _ = writeln!(
                out,
                "podstamp_render_failures_total{{reason=\"{}\"}} {n}",
                escape(reason.as_str())
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_plugin_call_duration_seconds Duration of one plugin call.\n# TYPE podstamp_plugin_call_duration_seconds histogram"
        );
        for ((plugin, result), h) in &inner.plugin_calls {
            let labels = format!("plugin=\"{}\",result=\"{result}\"", escape(plugin));
            for (bound, n) in BUCKETS.iter().zip(h.counts) {
                let _ = writeln!(
                    out,
                    "podstamp_plugin_call_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "podstamp_plugin_call_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}\n\
                 podstamp_plugin_call_duration_seconds_sum{{{labels}}} {}\n\
                 podstamp_plugin_call_duration_seconds_count{{{labels}}} {}",
                h.count, h.sum, h.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_plugin_scope_refusals_total Renders refused because a plugin changed a field outside its scope (the catalog entry's scope:), by plugin.\n# TYPE podstamp_plugin_scope_refusals_total counter"
        );
        for (plugin, n) in &inner.scope_refusals {
            let _ = writeln!(
                out,
                "podstamp_plugin_scope_refusals_total{{plugin=\"{}\"}} {n}",
                escape(plugin)
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_managed_manifests Manifest files podstamp manages in the manifest directory.\n\
             # TYPE podstamp_managed_manifests gauge\npodstamp_managed_manifests {}",
            inner.managed
        );
        let _ = writeln!(
            out,
            "# HELP podstamp_templates PodTemplates the daemon knows of (those the source selected).\n\
             # TYPE podstamp_templates gauge\npodstamp_templates {}",
            inner.templates
        );
        let _ = writeln!(
            out,
            "# HELP podstamp_initial_sync_seconds Time from the first complete list of templates to every manifest rendered and written.\n\
             # TYPE podstamp_initial_sync_seconds gauge"
        );
        if let Some(took) = inner.initial_sync {
            let _ = writeln!(out, "podstamp_initial_sync_seconds {}", took.as_secs_f64());
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_initial_sync_part_seconds Wall time of the first sync by part: render (plugin chains and manifests), check (each manifest read back and its kubelet and Pod Security verdicts taken), check_ahead (a chunk's questions sent to the helper ahead, its last answers waited for), commit_states, commit_manifests, commit_revisions (the writes put in place), gc; start_to_list from the daemon's start to the first complete list.\n\
             # TYPE podstamp_initial_sync_part_seconds gauge"
        );
        for (part, took) in &inner.initial_sync_parts {
            let _ = writeln!(
                out,
                "podstamp_initial_sync_part_seconds{{part=\"{part}\"}} {}",
                took.as_secs_f64()
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_manifests_removed_total Manifests removed because their template went away.\n\
             # TYPE podstamp_manifests_removed_total counter\npodstamp_manifests_removed_total {}",
            inner.removed
        );
        let _ = writeln!(
            out,
            "# HELP podstamp_events_dropped_total Events about failing templates not sent because the queue to the API server was full.\n\
             # TYPE podstamp_events_dropped_total counter\npodstamp_events_dropped_total {}",
            inner.events_dropped
        );
        let _ = writeln!(
            out,
            "# HELP podstamp_last_successful_sync_timestamp_seconds When the manifests were last in step with a complete list of templates.\n\
             # TYPE podstamp_last_successful_sync_timestamp_seconds gauge"
        );
        if let Some(t) = inner.last_sync {
            let _ = writeln!(out, "podstamp_last_successful_sync_timestamp_seconds {t}");
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_watch_restarts_total Watches tried again after a failure: resumed from the last resourceVersion seen, or listed again after 410 Gone.\n\
             # TYPE podstamp_watch_restarts_total counter"
        );
        for watch in WATCHES {
            let n = inner.watch_restarts.get(watch).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "podstamp_watch_restarts_total{{watch=\"{watch}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_watch_lists_total Complete lists a watch started: its first, and one after each 410 Gone (a dropped watch resumes without one).\n\
             # TYPE podstamp_watch_lists_total counter"
        );
        for watch in WATCHES {
            let n = inner.watch_lists.get(watch).copied().unwrap_or(0);
            let _ = writeln!(out, "podstamp_watch_lists_total{{watch=\"{watch}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_config_reloads_total Reloads of the plugin catalog after its source changed, by result (applied, refused: the previous catalog keeps serving, unchanged).\n\
             # TYPE podstamp_config_reloads_total counter"
        );
        for result in [
            ReloadResult::Applied,
            ReloadResult::Refused,
            ReloadResult::Unchanged,
        ] {
            let label = result.label();
            let n = inner.reloads.get(label).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "podstamp_config_reloads_total{{result=\"{label}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_catalog_info The plugin catalog in use, by digest (sha256 of its plugins, settings and chain); absent until one is.\n\
             # TYPE podstamp_catalog_info gauge"
        );
        if let Some(digest) = &inner.catalog {
            let _ = writeln!(
                out,
                "podstamp_catalog_info{{digest=\"{}\"}} 1",
                escape(digest)
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_template_revision The revision in this node's manifest for each template, by its rollout phase (written, running, ready, failed).\n\
             # TYPE podstamp_template_revision gauge"
        );
        for (template, (revision, phase)) in &inner.rollouts {
            let _ = writeln!(
                out,
                "podstamp_template_revision{{template=\"{}\",revision=\"{}\",phase=\"{phase}\"}} 1",
                escape(template),
                escape(revision)
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_evidence_disagreements_total Times the mirror pod and the node itself (the container runtime) disagreed about a template's revision in place for 5 s (the mirror pod decides).\n\
             # TYPE podstamp_evidence_disagreements_total counter"
        );
        for (template, n) in &inner.evidence_disagreements {
            let _ = writeln!(
                out,
                "podstamp_evidence_disagreements_total{{template=\"{}\"}} {n}",
                escape(template)
            );
        }
        // Each family's samples right after its own TYPE line: the text
        // format has a family's samples together.
        let _ = writeln!(
            out,
            "# HELP podstamp_kubelet_not_started 1 while the kubelet has not started the revision in place of a template (no sandbox on the node) past its progress deadline, with nothing to fall back to (kubernetes/kubernetes#105543).\n\
             # TYPE podstamp_kubelet_not_started gauge"
        );
        for (template, stalled) in &inner.kubelet_not_started {
            let _ = writeln!(
                out,
                "podstamp_kubelet_not_started{{template=\"{}\"}} {}",
                escape(template),
                u8::from(*stalled)
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_rollouts_total Rollouts ended on this node, by result (succeeded, failed; rolled_back counts the failed ones rolled back).\n\
             # TYPE podstamp_rollouts_total counter"
        );
        for result in ["succeeded", "failed", "rolled_back"] {
            let n = inner.rollout_results.get(result).copied().unwrap_or(0);
            let _ = writeln!(out, "podstamp_rollouts_total{{result=\"{result}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_rollout_api_writes_total Writes to the API server for rollouts across nodes, by object (slot, status) and result (ok, conflict, error); none while nothing rolls.\n\
             # TYPE podstamp_rollout_api_writes_total counter"
        );
        for object in ["slot", "status"] {
            for result in ["ok", "conflict", "error"] {
                let n = inner
                    .fleet_writes
                    .get(&(object, result))
                    .copied()
                    .unwrap_or(0);
                let _ = writeln!(
                    out,
                    "podstamp_rollout_api_writes_total{{object=\"{object}\",result=\"{result}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_rollout_slots_held Rollout slots this node holds (templates it is updating).\n# TYPE podstamp_rollout_slots_held gauge\npodstamp_rollout_slots_held {}",
            inner.slots_held
        );
        let _ = writeln!(
            out,
            "# HELP podstamp_api_requests_total Requests sent to the API server, by resource and verb (a watch counts when it starts).\n\
             # TYPE podstamp_api_requests_total counter"
        );
        for ((resource, verb), n) in &inner.api_requests {
            let _ = writeln!(
                out,
                "podstamp_api_requests_total{{resource=\"{resource}\",verb=\"{verb}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_oci_pulls_total Components of `oci:` catalog entries, by result: pulled, cached (the registry not asked) or the failure (unreachable, timeout, unauthorized, unknown, digest_mismatch, manifest_too_large, …).\n\
             # TYPE podstamp_oci_pulls_total counter"
        );
        if let Some(pulls) = self.oci_pulls.get() {
            for (result, n) in pulls.snapshot() {
                let _ = writeln!(out, "podstamp_oci_pulls_total{{result=\"{result}\"}} {n}");
            }
        }
        if let Some(history) = self.history.get() {
            use std::sync::atomic::Ordering::SeqCst;
            let _ = writeln!(
                out,
                "# HELP podstamp_revision_history_queued Revisions recorded and not yet written to the revision history (its writer works behind the passes).\n\
                 # TYPE podstamp_revision_history_queued gauge\n\
                 podstamp_revision_history_queued {}\n\
                 # HELP podstamp_revision_history_writes_total Revisions put in the revision history (written, renamed or pruned), by result: ok or failed (the log names the template and the error).\n\
                 # TYPE podstamp_revision_history_writes_total counter\n\
                 podstamp_revision_history_writes_total{{result=\"ok\"}} {}\n\
                 podstamp_revision_history_writes_total{{result=\"failed\"}} {}",
                history.queued.load(SeqCst),
                history.done.load(SeqCst),
                history.failed.load(SeqCst)
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_kubelet_newer_fields_total Manifests checked for writing with fields newer than the node's kubelet, which runs the pod without them, by node (docs/daemon.md, \"What the kubelet refuses\").\n\
             # TYPE podstamp_kubelet_newer_fields_total counter"
        );
        for (node, n) in crate::kube_check::KubeCheck::shared().newer_counts() {
            let _ = writeln!(
                out,
                "podstamp_kubelet_newer_fields_total{{node=\"{}\"}} {n}",
                escape(&node)
            );
        }
        let _ = writeln!(
            out,
            "# HELP podstamp_ready Whether the first full sync is done.\n# TYPE podstamp_ready gauge\npodstamp_ready {}",
            u8::from(self.is_ready())
        );
        out
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A client has this long to send its request, from the moment it is
/// accepted: the kubelet's probes and Prometheus send theirs at once.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// And this long to take the response.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `/healthz`, `/readyz` and `/metrics` until the process ends,
/// holding at most `max_connections` connections at once.
///
/// When that many are open, a new connection closes the oldest one, rather
/// than being refused or left waiting: idle or slow clients (a port scan,
/// a flood) can then neither take more file descriptors than the cap nor
/// keep out a liveness probe, which is always the newest connection and is
/// answered as soon as its request arrives. Each connection also has
/// [`READ_TIMEOUT`] to send its request.
pub async fn serve(
    listener: TcpListener,
    metrics: std::sync::Arc<Metrics>,
    max_connections: usize,
) {
    let mut tasks = JoinSet::new();
    // Open connections, oldest first.
    let mut open: VecDeque<(task::Id, AbortHandle)> = VecDeque::new();
    let mut accept_failing = false;
    loop {
        tokio::select! {
            Some(done) = tasks.join_next_with_id() => forget(&mut open, done),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if accept_failing {
                        tracing::info!("metrics listener: accepting connections again");
                        accept_failing = false;
                    }
                    while tasks.len() >= max_connections.max(1) {
                        if let Some((_, oldest)) = open.pop_front() {
                            oldest.abort();
                        }
                        // Reaped, so that its descriptor is closed before
                        // the new connection is served.
                        match tasks.join_next_with_id().await {
                            Some(done) => forget(&mut open, done),
                            None => break,
                        }
                    }
                    let metrics = metrics.clone();
                    let handle = tasks.spawn(async move {
                        let _ = answer(stream, &metrics).await;
                    });
                    open.push_back((handle.id(), handle));
                }
                Err(e) => {
                    // Logged once until it recovers, not every 100 ms.
                    if !accept_failing {
                        tracing::warn!("metrics listener: cannot accept a connection: {e}");
                        accept_failing = true;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Drops a finished (or aborted) connection from the open ones.
fn forget(open: &mut VecDeque<(task::Id, AbortHandle)>, done: Result<(task::Id, ()), JoinError>) {
    let id = match done {
        Ok((id, ())) => id,
        Err(e) => e.id(),
    };
    open.retain(|(open_id, _)| *open_id != id);
}

/// Reads one request's head (only its first line matters), up to 8 KiB.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut request = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    Ok(request)
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    // One request per connection.
    let request = match tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await {
        Ok(request) => request?,
        Err(_) => return Ok(()),
    };
    let line = String::from_utf8_lossy(&request);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET" | "HEAD", "/readyz") if metrics.is_ready() => {
            ("200 OK", "text/plain", "ok\n".to_string())
        }
        ("GET" | "HEAD", "/readyz") => (
            "503 Service Unavailable",
            "text/plain",
            "not synced yet\n".to_string(),
        ),
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.exposition(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .unwrap_or(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family() {
        let m = Metrics::default();
        m.render(RenderResult::Written);
        m.render(RenderResult::Failed(Reason::RenderFailed));
        m.plugin_call("node-env", true, Duration::from_micros(700));
        m.watch_restart("node");
        m.watch_list("pods");
        m.reload(ReloadResult::Refused);
        m.set_catalog("ab12");
        m.scope_refusal("evil");
        let text = m.exposition();
        for line in [
            "podstamp_renders_total{result=\"written\"} 1",
            "podstamp_renders_total{result=\"failed\"} 1",
            "podstamp_render_failures_total{reason=\"RenderFailed\"} 1",
            "podstamp_plugin_call_duration_seconds_bucket{plugin=\"node-env\",result=\"ok\",le=\"0.0005\"} 0",
            "podstamp_plugin_call_duration_seconds_bucket{plugin=\"node-env\",result=\"ok\",le=\"0.001\"} 1",
            "podstamp_plugin_call_duration_seconds_count{plugin=\"node-env\",result=\"ok\"} 1",
            "podstamp_watch_restarts_total{watch=\"node\"} 1",
            "podstamp_watch_restarts_total{watch=\"configmaps\"} 0",
            "podstamp_watch_lists_total{watch=\"pods\"} 1",
            "podstamp_watch_lists_total{watch=\"podtemplates\"} 0",
            "podstamp_managed_manifests 0",
            "podstamp_events_dropped_total 0",
            "podstamp_templates 0",
            "podstamp_ready 0",
            "podstamp_config_reloads_total{result=\"refused\"} 1",
            "podstamp_config_reloads_total{result=\"applied\"} 0",
            "podstamp_catalog_info{digest=\"ab12\"} 1",
            "podstamp_plugin_scope_refusals_total{plugin=\"evil\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    /// The text format keeps a family's samples together, after its TYPE
    /// line: a sample under another family's TYPE is read as that family's
    /// or refused, depending on the scraper.
    #[test]
    fn every_sample_follows_its_own_familys_type_line() {
        let m = Metrics::default();
        m.render(RenderResult::Written);
        m.plugin_call("node-env", true, Duration::from_micros(700));
        m.scope_refusal("evil");
        m.evidence_disagreed("ns/web");
        m.set_kubelet_not_started("ns/web", true);
        let text = m.exposition();
        assert!(text.contains("podstamp_kubelet_not_started{template=\"ns/web\"} 1"));
        let mut family = String::new();
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(family.clone()), "{family} typed twice");
            } else if !line.starts_with('#') && !line.is_empty() {
                let name = line.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| *b == family))
                    .unwrap_or(name);
                assert_eq!(base, family, "{line} is under {family}'s TYPE line");
            }
        }
    }

    #[test]
    fn scope_refusals_keep_a_bounded_number_of_series() {
        let m = Metrics::default();
        for i in 0..MAX_SCOPE_SERIES + 10 {
            m.scope_refusal(&format!("p{i}"));
        }
        m.scope_refusal("p0");
        assert_eq!(m.scope_refusals("p0"), 2);
        assert_eq!(m.scope_refusals("other"), 10);
        let series = m
            .exposition()
            .lines()
            .filter(|l| l.starts_with("podstamp_plugin_scope_refusals_total{"))
            .count();
        assert_eq!(series, MAX_SCOPE_SERIES + 1);
    }
}
