//! `podstamp run`: the node daemon.
//!
//! Sources ([`source`]: the API server's PodTemplates and this node's Node,
//! or a directory of files) feed the [`reconcile`]r, which renders through
//! the plugin chain and keeps the kubelet's manifest directory in step.
//! Failures become [`events`]; [`metrics`] serves health and Prometheus
//! metrics. The [`reload`] loader builds a new plugin catalog when the
//! configuration file changes ([`watch_file`], [`config_file`]) or, with the
//! API source, a ConfigMap it names ([`configmaps`], [`api_catalog`]), and
//! hands it to the reconciler. docs/daemon.md is the user's reference.
//!
//! Exit codes: 2 for a usage or configuration error at start; once running,
//! errors are logged and the daemon keeps going (it never exits because the
//! API server is down); 0 after SIGTERM or SIGINT.

pub mod api_catalog;
pub mod config_file;
pub mod configmaps;
pub mod events;
pub mod metrics;
pub mod mirror;
mod poll;
pub mod raw;
pub mod reconcile;
pub mod reload;
pub mod revisions;
mod rlimit;
pub mod rollout;
pub mod rollout_state;
pub mod source;
pub mod watch_file;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::config::{self, Catalog, CatalogError, ConfigFile};
use crate::node::NodeContext;
use crate::plugin::{Limits, Runtime};

use metrics::Metrics;
use reconcile::{Input, Reconciler};

pub const DEFAULT_SELECTOR: &str = "podstamp.io/enabled=true";
pub const DEFAULT_MANIFEST_DIR: &str = "/etc/kubernetes/manifests";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// `podstamp run` flags. Each overrides the config file's `daemon:` entry.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The configuration file: plugin catalog, chain, limits, `daemon:` settings.
    #[arg(long, short, env = "PODSTAMP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where templates come from: `api` (the Kubernetes API) or `dir:PATH` (PodTemplate files) [default: api].
    #[arg(long, env = "PODSTAMP_SOURCE", value_name = "api|dir:PATH")]
    pub source: Option<String>,
    /// A kubeconfig file [default: $KUBECONFIG, ~/.kube/config, else in-cluster credentials].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the PodTemplates, also written into the manifests [default: kube-system].
    #[arg(long, short, env = "PODSTAMP_NAMESPACE")]
    pub namespace: Option<String>,
    /// Label selector for the PodTemplates [default: podstamp.io/enabled=true].
    #[arg(long, short = 'l', env = "PODSTAMP_SELECTOR")]
    pub selector: Option<String>,
    /// This node's name.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// A Node object (YAML/JSON) describing this node, for the `dir:` source.
    #[arg(long, value_name = "FILE")]
    pub node_file: Option<PathBuf>,
    /// The kubelet's static pod manifest directory [default: /etc/kubernetes/manifests].
    #[arg(long, env = "PODSTAMP_MANIFEST_DIR", value_name = "DIR")]
    pub manifest_dir: Option<PathBuf>,
    /// Address for /healthz, /readyz and /metrics [default: 127.0.0.1:9464].
    #[arg(long, env = "PODSTAMP_LISTEN", value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// How often every template is rendered again, e.g. 5m [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub resync: Option<String>,
    /// How long one watch call lasts before it is renewed from the last
    /// resourceVersion, in whole seconds, e.g. 5m [default: 290s].
    #[arg(long, value_name = "DURATION")]
    pub watch_timeout: Option<String>,
    /// Where the last manifests of each template are kept, outside the manifest directory [default: /var/lib/podstamp/revisions].
    #[arg(long, env = "PODSTAMP_REVISIONS_DIR", value_name = "DIR")]
    pub revisions_dir: Option<PathBuf>,
    /// How many manifests are kept per template in the revisions directory [default: 3].
    #[arg(long, value_name = "N")]
    pub revision_history: Option<usize>,
    /// Where compiled plugin code is cached [default: the config's cacheDir, $PODSTAMP_CACHE_DIR, $XDG_CACHE_HOME/podstamp or ~/.cache/podstamp].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile plugins every time instead of using the cache.
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
}

#[derive(Debug)]
enum Source {
    Api { kubeconfig: Option<PathBuf> },
    Dir(PathBuf),
}

/// The resolved settings.
#[derive(Debug)]
struct Settings {
    source: Source,
    namespace: String,
    selector: String,
    node_name: String,
    node_file: Option<PathBuf>,
    manifest_dir: PathBuf,
    listen: SocketAddr,
    resync: Duration,
    /// `limits.maxManifestSize`.
    max_manifest_bytes: usize,
    /// Seconds; None: kube-rs's default.
    watch_timeout: Option<u32>,
    revisions_dir: PathBuf,
    revision_history: usize,
}

fn settings(args: &RunArgs, config: &ConfigFile) -> Result<Settings, String> {
    let d = &config.daemon;
    let source = match args.source.clone().or_else(|| d.source.clone()).as_deref() {
        None | Some("api") => Source::Api {
            kubeconfig: args.kubeconfig.clone().or_else(|| d.kubeconfig.clone()),
        },
        Some(s) if s.starts_with("dir:") && s.len() > 4 => Source::Dir(PathBuf::from(&s[4..])),
        Some(other) => return Err(format!("--source {other:?}: expected `api` or `dir:PATH`")),
    };
    let namespace = args
        .namespace
        .clone()
        .or_else(|| config.namespace.clone())
        .unwrap_or_else(|| config::DEFAULT_NAMESPACE.to_string());
    crate::validate::check_dns_label(&namespace).map_err(|e| format!("namespace: {e}"))?;
    let node_name = args
        .node_name
        .clone()
        .or_else(|| d.node_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or("say which node this is: --node-name NAME, or the NODE_NAME environment variable")?;
    crate::validate::check_dns_subdomain(&node_name).map_err(|e| format!("node name: {e}"))?;
    let listen = args
        .listen
        .clone()
        .or_else(|| d.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listen = listen
        .parse()
        .map_err(|_| format!("--listen {listen:?}: expected HOST:PORT, e.g. 127.0.0.1:9464"))?;
    let resync = match args.resync.as_ref().or(d.resync.as_ref()) {
        Some(text) => config::parse_duration(text).map_err(|e| format!("resync: {e}"))?,
        None => DEFAULT_RESYNC,
    };
    let watch_timeout = match &args.watch_timeout {
        Some(text) => {
            let d = config::parse_duration(text).map_err(|e| format!("--watch-timeout: {e}"))?;
            match u32::try_from(d.as_secs()) {
                Ok(secs) if secs > 0 && u128::from(secs) * 1000 == d.as_millis() => Some(secs),
                _ => {
                    return Err(format!(
                        "--watch-timeout {text:?}: must be a whole number of seconds, at least 1s"
                    ));
                }
            }
        }
        None => None,
    };
    Ok(Settings {
        source,
        namespace,
        selector: args
            .selector
            .clone()
            .or_else(|| d.selector.clone())
            .unwrap_or_else(|| DEFAULT_SELECTOR.to_string()),
        node_name,
        node_file: args.node_file.clone().or_else(|| d.node_file.clone()),
        manifest_dir: args
            .manifest_dir
            .clone()
            .or_else(|| d.manifest_dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MANIFEST_DIR)),
        listen,
        resync,
        max_manifest_bytes: crate::plugin::Limits::default().max_output_bytes,
        watch_timeout,
        revisions_dir: args
            .revisions_dir
            .clone()
            .or_else(|| d.revisions_dir.clone())
            .unwrap_or_else(|| PathBuf::from(revisions::DEFAULT_DIR)),
        revision_history: args
            .revision_history
            .or(d.revision_history)
            .unwrap_or(revisions::DEFAULT_HISTORY),
    })
}

/// The first field of the configuration that reads a ConfigMap.
fn config_map_field(config: &ConfigFile) -> Option<String> {
    if config.daemon.catalog.is_some() {
        return Some("daemon.catalog.configMap".into());
    }
    config
        .plugins
        .iter()
        .find(|(_, entry)| entry.config_map.is_some())
        .map(|(name, _)| format!("{}.configMap", crate::validate::join_key("plugins", name)))
}

fn read_node_file(path: &Path, node_name: &str) -> Result<NodeContext, String> {
    let mut context = crate::node::read_node_file(path)?;
    context.name = node_name.to_string();
    Ok(context)
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!(
        "podstamp: error: {}",
        message.to_string().replace('\n', " ")
    );
    ExitCode::from(2)
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn main(args: RunArgs) -> ExitCode {
    let nofile = match rlimit::raise_open_file_limit() {
        Ok(limit) if limit.now > limit.before => {
            tracing::info!(
                "raised the open file limit (RLIMIT_NOFILE) from {} to {}, the hard limit",
                limit.before,
                limit.now
            );
            limit.now
        }
        Ok(limit) => {
            tracing::info!("open file limit (RLIMIT_NOFILE): {}", limit.now);
            limit.now
        }
        Err(e) => {
            tracing::warn!("cannot read or raise the open file limit (RLIMIT_NOFILE): {e}");
            1024
        }
    };
    // The content the first catalog comes from, read before it: a change
    // in between is seen as one by the watch.
    let content = args.config.as_deref().map(watch_file::content);
    let config = match &args.config {
        Some(path) => match ConfigFile::read(path) {
            Ok(c) => c,
            Err(e) => return usage(e),
        },
        None => ConfigFile::default(),
    };
    let mut settings = match settings(&args, &config) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let limits = match config.sandbox_limits() {
        Ok(l) => l,
        Err(e) => return usage(e),
    };
    settings.max_manifest_bytes = limits.max_output_bytes;
    let cache_dir = crate::plugin::choose_cache_dir(
        args.no_cache,
        args.cache_dir.as_deref(),
        config.cache_dir.as_deref(),
    );
    // A catalog that reads ConfigMaps is loaded by the loader, from the
    // API (or, when it does not answer, from disk), before anything renders.
    let needs_api = match (config_map_field(&config), &settings.source) {
        (Some(field), Source::Dir(_)) => {
            return usage(format!(
                "{field}: a ConfigMap is read from the API, but the source is dir:; with --source dir: give plugins by path and the catalog in the configuration file"
            ));
        }
        (Some(_), Source::Api { .. }) => true,
        (None, _) => false,
    };
    let plugins = match Runtime::new(limits, cache_dir.as_deref()) {
        Ok(r) => r,
        Err(e) => return usage(e),
    };
    let catalog = if needs_api {
        None
    } else {
        match Catalog::load(&config, &plugins) {
            Ok(c) => Some(Arc::new(c)),
            Err(CatalogError::Config(e)) => return usage(e),
            Err(CatalogError::Plugin(e)) => return usage(e),
        }
    };
    let reloading = match (&args.config, content) {
        (Some(path), Some(content)) => {
            let in_use = in_use(&settings, &limits, &config, cache_dir.as_deref());
            Some(Reloading {
                source: config_file::FileSource::new(path.clone(), config.clone(), in_use),
                path: path.clone(),
                content,
                runtime: plugins,
            })
        }
        _ => None,
    };
    if let Err(e) = std::fs::create_dir_all(&settings.manifest_dir) {
        return usage(format!("{}: {e}", settings.manifest_dir.display()));
    }
    let dir_node = match (&settings.source, &settings.node_file) {
        (Source::Dir(dir), file) => {
            if !dir.is_dir() {
                return usage(format!("--source dir:{}: not a directory", dir.display()));
            }
            match file {
                Some(f) => match read_node_file(f, &settings.node_name) {
                    Ok(n) => Some(n),
                    Err(e) => return usage(e),
                },
                None => Some(NodeContext::named(settings.node_name.clone())),
            }
        }
        (Source::Api { .. }, Some(_)) => {
            return usage(
                "--node-file is for the dir: source; with the API the Node is read from it",
            );
        }
        (Source::Api { .. }, None) => None,
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return usage(format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(run(
        settings,
        catalog,
        reloading,
        dir_node,
        rlimit::max_connections(nofile),
    ))
}

/// What reloading the catalog from the configuration file needs.
struct Reloading {
    source: config_file::FileSource,
    path: PathBuf,
    /// The file's content the catalog in use was loaded from.
    content: watch_file::Content,
    /// The plugin runtime of the catalog in use, for the loader's thread.
    runtime: Runtime,
}

/// Each node-local setting of the configuration file as in use, by its name
/// in the file: what a change of it, which needs a restart, keeps.
fn in_use(
    settings: &Settings,
    limits: &Limits,
    config: &ConfigFile,
    cache_dir: Option<&Path>,
) -> BTreeMap<&'static str, String> {
    let budget = config.render_budget(limits.timeout).ok();
    BTreeMap::from([
        ("namespace", settings.namespace.clone()),
        (
            "cacheDir",
            cache_dir.map_or("no code cache".into(), |d| d.display().to_string()),
        ),
        (
            "daemon.source",
            match &settings.source {
                Source::Api { .. } => "api".to_string(),
                Source::Dir(dir) => format!("dir:{}", dir.display()),
            },
        ),
        (
            "daemon.kubeconfig",
            match &settings.source {
                Source::Api {
                    kubeconfig: Some(k),
                } => k.display().to_string(),
                _ => "(none)".to_string(),
            },
        ),
        ("daemon.selector", settings.selector.clone()),
        ("daemon.nodeName", settings.node_name.clone()),
        (
            "daemon.nodeFile",
            settings
                .node_file
                .as_ref()
                .map_or("(none)".into(), |f| f.display().to_string()),
        ),
        (
            "daemon.manifestDir",
            settings.manifest_dir.display().to_string(),
        ),
        ("daemon.listen", settings.listen.to_string()),
        ("daemon.resync", format!("{:?}", settings.resync)),
        (
            "daemon.revisionsDir",
            settings.revisions_dir.display().to_string(),
        ),
        (
            "daemon.revisionHistory",
            settings.revision_history.to_string(),
        ),
        ("limits.timeout", format!("{:?}", limits.timeout)),
        ("limits.memory", format!("{} bytes", limits.memory_bytes)),
        (
            "limits.maxManifestSize",
            format!("{} bytes", limits.max_output_bytes),
        ),
        (
            "limits.renderTimeout",
            budget.map_or("?".into(), |b| format!("{b:?}")),
        ),
    ])
}

async fn run(
    settings: Settings,
    catalog: Option<Arc<Catalog>>,
    reloading: Option<Reloading>,
    dir_node: Option<NodeContext>,
    max_connections: usize,
) -> ExitCode {
    let metrics = Arc::new(Metrics::default());
    let listener = match tokio::net::TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) => return usage(format!("--listen {}: {e}", settings.listen)),
    };
    let client = match &settings.source {
        Source::Api { kubeconfig } => match client(kubeconfig.as_deref()).await {
            Ok(c) => Some(c),
            Err(e) => return usage(e),
        },
        Source::Dir(_) => None,
    };
    let (events, publisher): (Option<events::EventSink>, _) = match &client {
        Some(c) => {
            let (sink, task) = events::recorder(c.clone(), &settings.node_name, metrics.clone());
            (Some(sink), Some(task))
        }
        None => (None, None),
    };
    let reconciler = match Reconciler::new(
        settings.manifest_dir.clone(),
        settings.namespace.clone(),
        metrics.clone(),
        events.clone(),
    ) {
        Ok(mut r) => {
            r.set_max_manifest_size(settings.max_manifest_bytes);
            match revisions::Store::open(
                settings.revisions_dir.clone(),
                settings.revision_history,
                &settings.manifest_dir,
            ) {
                Ok(store) => r.set_revisions(store),
                Err(e) => return usage(e),
            }
            r
        }
        Err(e) => return usage(format!("{}: {e}", settings.manifest_dir.display())),
    };
    tracing::info!(listen = %settings.listen, node = %settings.node_name, namespace = %settings.namespace,
        dir = %settings.manifest_dir.display(), source = ?settings.source, "podstamp run starting");

    let (inputs, received) = std::sync::mpsc::channel::<Input>();
    // The first thing the reconciler gets: nothing renders without it (a
    // catalog from the API comes from the loader).
    if let Some(catalog) = &catalog {
        let _ = inputs.send(Input::Catalog(catalog.clone()));
    }
    let resync = settings.resync;
    let worker = std::thread::Builder::new()
        .name("reconciler".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| reconciler.run(received, resync));
            if std::panic::catch_unwind(run).is_err() {
                // Better restarted by the kubelet than alive and doing nothing.
                tracing::error!("the reconciler panicked; exiting");
                std::process::exit(70);
            }
        });
    if let Err(e) = worker {
        return usage(format!("cannot start the reconciler: {e}"));
    }
    tracing::info!(
        listen = %settings.listen,
        "metrics server: at most {max_connections} connections at once (a new one closes the oldest); a request must arrive within {:?}",
        metrics::READ_TIMEOUT
    );
    if let Some(reloading) = reloading {
        let api = client.clone().map(|client| ApiCatalog {
            client,
            namespace: settings.namespace.clone(),
            watch_timeout: settings.watch_timeout,
            events,
        });
        let started = start_reloading(reloading, catalog, api, inputs.clone(), metrics.clone());
        if let Err(e) = started {
            return usage(format!("cannot start reloading the configuration: {e}"));
        }
    }
    tokio::spawn(metrics::serve(listener, metrics.clone(), max_connections));
    if let Some(task) = publisher {
        tokio::spawn(task);
    }
    match (&settings.source, client) {
        (Source::Api { .. }, Some(client)) => {
            tokio::spawn(source::watch_node(
                client.clone(),
                settings.node_name.clone(),
                settings.watch_timeout,
                inputs.clone(),
                metrics.clone(),
            ));
            tokio::spawn(mirror::watch(
                client.clone(),
                settings.namespace.clone(),
                settings.node_name.clone(),
                settings.watch_timeout,
                inputs.clone(),
                metrics.clone(),
            ));
            tokio::spawn(source::watch_templates(
                client,
                settings.namespace.clone(),
                settings.selector.clone(),
                settings.watch_timeout,
                inputs.clone(),
                metrics.clone(),
            ));
        }
        (Source::Dir(dir), _) => {
            if let Some(node) = dir_node {
                let _ = inputs.send(Input::Node(node));
            }
            let (dir, namespace, inputs) =
                (dir.clone(), settings.namespace.clone(), inputs.clone());
            let spawned = std::thread::Builder::new()
                .name("dir-source".into())
                .spawn(move || source::run_dir_source(dir, namespace, inputs));
            if let Err(e) = spawned {
                return usage(format!("cannot start the directory source: {e}"));
            }
        }
        (Source::Api { .. }, None) => unreachable!("an API source has a client"),
    }
    drop(inputs);
    shutdown_signal().await;
    tracing::info!("stopping");
    ExitCode::SUCCESS
}

/// What the API source adds to reloading: the ConfigMaps a catalog names,
/// and Events on them.
struct ApiCatalog {
    client: kube::Client,
    namespace: String,
    watch_timeout: Option<u32>,
    events: Option<events::EventSink>,
}

/// Starts the catalog loader and the configuration file's watch, each on a
/// thread of its own; with the API, the watches of the ConfigMaps the
/// catalog names, on the async runtime (call from it).
fn start_reloading(
    reloading: Reloading,
    catalog: Option<Arc<Catalog>>,
    api: Option<ApiCatalog>,
    inputs: std::sync::mpsc::Sender<Input>,
    metrics: Arc<Metrics>,
) -> std::io::Result<()> {
    let (triggers, received) = std::sync::mpsc::channel();
    let source: Box<dyn reload::CatalogSource> = match api {
        Some(api) => {
            let on_change = triggers.clone();
            let watches = configmaps::ConfigMapWatches::new(
                api.client,
                api.namespace,
                api.watch_timeout,
                tokio::runtime::Handle::current(),
                metrics.clone(),
                // Called from the async runtime: a send never blocks.
                move |name| {
                    let _ = on_change.send(api_catalog::trigger(name));
                },
            );
            Box::new(api_catalog::ApiSource::new(
                reloading.source,
                watches,
                api.events,
                reloading.runtime.clone(),
            ))
        }
        None => Box::new(reloading.source),
    };
    let loader = reload::Loader::new(reloading.runtime, source, catalog, inputs, metrics);
    reload::spawn(loader, received)?;
    let (path, content) = (reloading.path, reloading.content);
    std::thread::Builder::new()
        .name("config-watch".into())
        .spawn(move || {
            if let Err(e) = watch_file::watch(path.clone(), content, triggers) {
                tracing::error!(config = %path.display(),
                    "cannot watch the configuration file: {e}; a change to it needs a restart");
            }
        })
        .map(drop)
}

async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!("no Kubernetes credentials (give --kubeconfig, or run in a pod): {e}")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot handle SIGTERM: {e}");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
