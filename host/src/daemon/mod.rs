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
//! [`run`] takes settings already resolved ([`crate::settings`]) and ends
//! with a [`DaemonError`] when it cannot start (or its reconciler died);
//! once running, errors are logged and the daemon keeps going (it never
//! stops because the API server is down). The command line and its exit
//! codes are the binary's.

pub mod api_catalog;
mod api_requests;
pub mod backoff;
pub mod catalog_record;
pub mod config_file;
pub mod configmaps;
pub mod coordinator;
pub mod cri;
pub mod events;
mod heap;
pub mod inbox;
pub mod lease_namespace;
pub mod local_evidence;
pub mod metrics;
pub mod mirror;
pub mod namespace_level;
pub mod outbox;
mod poll;
pub mod probes;
pub mod raw;
pub mod reconcile;
pub mod reload;
pub mod revisions;
mod rlimit;
pub mod rollout;
pub mod rollout_file;
pub mod source;
pub mod watch;
pub mod watch_file;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::NoConfigMaps;
use crate::catalog::{Catalog, CatalogError};
use crate::config::ConfigFile;
use crate::kube_client::ClientError;
use crate::node::NodeContext;
use crate::plugin::{LoadError, Runtime};
use crate::settings::{DaemonSettings, TemplateSource};

use inbox::Input;
use metrics::Metrics;
use reconcile::Reconciler;

/// Why the daemon could not start, or stopped on its own. Each message is
/// the one line the binary prints.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(
        "{field}: a ConfigMap is read from the API, but the source is dir:; with --source dir: give plugins by path and the catalog in the configuration file"
    )]
    ConfigMapWithDirSource { field: String },
    #[error(transparent)]
    Runtime(#[from] LoadError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("{}: {source}", dir.display())]
    ManifestDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--source dir:{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(transparent)]
    NodeFile(#[from] crate::node::NodeFileError),
    #[error("--node-file is for the dir: source; with the API the Node is read from it")]
    NodeFileWithApi,
    #[error("cannot start the async runtime: {0}")]
    AsyncRuntime(#[source] std::io::Error),
    #[error("--listen {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Revisions(#[from] revisions::OpenError),
    #[error("cannot start {what}: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Better restarted by the kubelet than alive and doing nothing.
    #[error("the reconciler panicked; exiting")]
    ReconcilerPanicked,
    /// Found at start, before any rollout Lease is written.
    #[error(transparent)]
    SharedLeaseNamespace(#[from] lease_namespace::SharedNamespace),
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

fn read_node_file(path: &Path, node_name: &str) -> Result<NodeContext, DaemonError> {
    let mut context = crate::node::read_node_file(path)?;
    context.name = node_name.to_string();
    Ok(context)
}

/// How long a stopping daemon waits for the revision history's last writes
/// (a disk that takes longer is stuck; the kubelet's grace period is 30 s).
const HISTORY_DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the daemon with resolved `settings` ([`crate::settings::daemon`])
/// until SIGTERM or SIGINT (Ok), or until it cannot go on.
pub fn run(settings: DaemonSettings) -> Result<(), DaemonError> {
    // Before the first thread: an arena made before the limit stays.
    if let Some(arenas) = heap::limit_arenas() {
        tracing::debug!("the C library's malloc limited to {arenas} arenas");
    }
    if let Some(bytes) = heap::fix_mmap_threshold() {
        tracing::debug!("the C library's malloc maps requests of {bytes} bytes or more apart");
    }
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
    let config = &settings.config;
    // A catalog that reads ConfigMaps is loaded by the loader, from the
    // API (or, when it does not answer, from disk), before anything renders.
    let needs_api = match (config_map_field(config), &settings.source) {
        (Some(field), TemplateSource::Dir(_)) => {
            return Err(DaemonError::ConfigMapWithDirSource { field });
        }
        (Some(_), TemplateSource::Api { .. }) => true,
        (None, _) => false,
    };
    let registry = crate::oci::Registry::new(settings.registry.clone());
    let oci_pulls = registry.pulls().clone();
    let plugins =
        Runtime::new(settings.limits, settings.cache_dir.as_deref())?.with_registry(registry);
    let catalog = if needs_api {
        None
    } else {
        let config_maps = NoConfigMaps {
            namespace: settings.namespace.clone(),
        };
        Some(Arc::new(config.load_catalog_with(
            &plugins,
            &config_maps,
            None,
        )?))
    };
    let reloading = settings.config_file.as_ref().map(|started| Reloading {
        source: config_file::FileCatalog::new(
            started.path.clone(),
            config.clone(),
            settings.namespace.clone(),
            settings.in_use(),
        ),
        path: started.path.clone(),
        content: started.content.clone(),
        runtime: plugins,
    });
    std::fs::create_dir_all(&settings.manifest_dir).map_err(|source| DaemonError::ManifestDir {
        dir: settings.manifest_dir.clone(),
        source,
    })?;
    let dir_node = match (&settings.source, &settings.node_file) {
        (TemplateSource::Dir(dir), file) => {
            if !dir.is_dir() {
                return Err(DaemonError::NotADirectory(dir.clone()));
            }
            match file {
                Some(f) => Some(read_node_file(f, &settings.node_name)?),
                None => Some(NodeContext::named(settings.node_name.clone())),
            }
        }
        (TemplateSource::Api { .. }, Some(_)) => return Err(DaemonError::NodeFileWithApi),
        (TemplateSource::Api { .. }, None) => None,
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(DaemonError::AsyncRuntime)?;
    runtime.block_on(serve(
        settings,
        catalog,
        reloading,
        dir_node,
        rlimit::max_connections(nofile),
        oci_pulls,
    ))
}

/// What reloading the catalog from the configuration file needs.
struct Reloading {
    source: config_file::FileCatalog,
    path: PathBuf,
    /// The file's content the catalog in use was loaded from.
    content: crate::config::Content,
    /// The plugin runtime of the catalog in use, for the loader's thread.
    runtime: Runtime,
}

async fn serve(
    settings: DaemonSettings,
    catalog: Option<Arc<Catalog>>,
    reloading: Option<Reloading>,
    dir_node: Option<NodeContext>,
    max_connections: usize,
    oci_pulls: Arc<crate::oci::PullCounts>,
) -> Result<(), DaemonError> {
    let metrics = Arc::new(Metrics::default());
    metrics.follow_oci_pulls(oci_pulls);
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| DaemonError::Listen {
            addr: settings.listen,
            source,
        })?;
    let client = match &settings.source {
        TemplateSource::Api { kubeconfig } => {
            Some(client(kubeconfig.as_deref(), metrics.clone()).await?)
        }
        TemplateSource::Dir(_) => None,
    };
    let (events, publisher): (Option<events::EventSink>, _) = match &client {
        Some(c) => {
            // Rollout Events the API server does not take are kept beside
            // each template's rollout state, published once it answers.
            let outbox = outbox::Outbox::new(&settings.revisions_dir);
            let (sink, task) = events::recorder(
                c.clone(),
                &settings.node_name,
                metrics.clone(),
                Some(outbox),
            );
            (Some(sink), Some(task))
        }
        None => (None, None),
    };
    let mut reconciler = Reconciler::new(
        settings.manifest_dir.clone(),
        settings.namespace.clone(),
        settings.limits.max_output_bytes,
        metrics.clone(),
        events.clone(),
    )
    .map_err(|source| DaemonError::ManifestDir {
        dir: settings.manifest_dir.clone(),
        source,
    })?;
    // With the API, the namespace's own label decides the level, read
    // before anything renders; a directory of files has no namespace to
    // read, and the configured level holds.
    let from_api = matches!(settings.source, TemplateSource::Api { .. });
    reconciler.hold_to(settings.pod_security.clone(), from_api);
    tracing::info!(level = %settings.pod_security, namespace_label = from_api,
        "Pod Security: every rendered pod is held to its namespace's {} label, else this level",
        crate::security_level::ENFORCE_LABEL);
    let history = revisions::Store::open(
        settings.revisions_dir.clone(),
        settings.revision_history,
        &settings.manifest_dir,
    )?;
    metrics.follow_revision_history(history.counts());
    let history_drain = history.drain();
    reconciler.set_revisions(history);
    // With the API, updates roll across the nodes through its Leases.
    let coordinating = client.as_ref().map(|client| {
        let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
        reconciler.coordinate(asks);
        (client.clone(), asked)
    });
    tracing::info!(listen = %settings.listen, node = %settings.node_name, namespace = %settings.namespace,
        dir = %settings.manifest_dir.display(), source = ?settings.source, "podstamp run starting");

    let (inputs, received) = std::sync::mpsc::channel::<Input>();
    let (shared_tx, shared) = tokio::sync::oneshot::channel::<lease_namespace::SharedNamespace>();
    // The first thing the reconciler gets: nothing renders without it (a
    // catalog from the API comes from the loader).
    if let Some(catalog) = &catalog {
        let _ = inputs.send(Input::Catalog(catalog.clone()));
    }
    let resync = settings.resync;
    let (panicked, reconciler_died) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("reconciler".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| reconciler.run(received, resync));
            if std::panic::catch_unwind(run).is_err() {
                let _ = panicked.send(());
            }
        })
        .map_err(|source| DaemonError::Thread {
            what: "the reconciler",
            source,
        })?;
    tracing::info!(
        listen = %settings.listen,
        "metrics server: at most {max_connections} connections at once (a new one closes the oldest); a request must arrive within {:?}",
        metrics::READ_TIMEOUT
    );
    if let Some(reloading) = reloading {
        let api = client.clone().map(|client| ApiReloading {
            client,
            namespace: settings.namespace.clone(),
            watch_timeout: settings.watch_timeout,
            events,
            node_name: settings.node_name.clone(),
        });
        start_reloading(reloading, catalog, api, inputs.clone(), metrics.clone()).map_err(
            |source| DaemonError::Thread {
                what: "reloading the configuration",
                source,
            },
        )?;
    }
    tokio::spawn(metrics::serve(listener, metrics.clone(), max_connections));
    if let Some(task) = publisher {
        tokio::spawn(task);
    }
    match (&settings.source, client) {
        (TemplateSource::Api { .. }, Some(client)) => {
            tokio::spawn(source::watch_node(
                client.clone(),
                settings.node_name.clone(),
                settings.watch_timeout,
                inputs.clone(),
                metrics.clone(),
            ));
            if let Some((client, asked)) = coordinating {
                let coordinator = coordinator::Settings {
                    namespace: settings.rollout_namespace.clone(),
                    status_namespace: settings.status_namespace.clone(),
                    node: settings.node_name.clone(),
                    lease_duration: settings.slot_lease_duration,
                    watch_timeout: settings.watch_timeout,
                };
                let (inputs, metrics) = (inputs.clone(), metrics.clone());
                let allowed = settings.allow_control_plane_namespace;
                // No rollout Lease is written before both namespaces are
                // known not to be the control plane's.
                tokio::spawn(async move {
                    let namespaces = [
                        (lease_namespace::Setting::Rollouts, &coordinator.namespace),
                        (
                            lease_namespace::Setting::Status,
                            &coordinator.status_namespace,
                        ),
                    ];
                    for (setting, namespace) in namespaces {
                        if let Err(shared) =
                            lease_namespace::check(&client, setting, namespace, allowed).await
                        {
                            let _ = shared_tx.send(shared);
                            return;
                        }
                    }
                    coordinator::run(client, coordinator, asked, inputs, metrics).await
                });
            }
            tokio::spawn(namespace_level::watch(
                client.clone(),
                settings.namespace.clone(),
                settings.watch_timeout,
                inputs.clone(),
                metrics.clone(),
            ));
            // Whether the mirror pods are followed: the local evidence
            // poller runs the pods' probes only while they are not.
            let followed = Arc::new(std::sync::atomic::AtomicBool::new(false));
            tokio::spawn(mirror::watch(
                client.clone(),
                settings.namespace.clone(),
                settings.node_name.clone(),
                settings.watch_timeout,
                inputs.clone(),
                metrics.clone(),
                followed.clone(),
            ));
            // The node's own evidence, for when the mirror pods cannot be
            // followed (the API server down). Only with the API source:
            // a `dir:` source has no mirror pods to prefer, and rolls
            // nothing back (docs/daemon.md).
            tokio::spawn(local_evidence::watch(
                settings.cri_socket.clone(),
                settings.manifest_dir.clone(),
                inputs.clone(),
                followed,
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
        (TemplateSource::Dir(dir), _) => {
            if let Some(node) = dir_node {
                let _ = inputs.send(Input::Node(node));
            }
            let (dir, namespace, inputs) =
                (dir.clone(), settings.namespace.clone(), inputs.clone());
            std::thread::Builder::new()
                .name("dir-source".into())
                .spawn(move || source::run_dir_source(dir, namespace, inputs))
                .map_err(|source| DaemonError::Thread {
                    what: "the directory source",
                    source,
                })?;
        }
        (TemplateSource::Api { .. }, None) => unreachable!("an API source has a client"),
    }
    drop(inputs);
    let died = async {
        // Dropped without a word: the reconciler ended with the daemon.
        if reconciler_died.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let refused = async {
        // Dropped without a word: the namespace is the rollouts' own.
        match shared.await {
            Ok(shared) => shared,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        () = shutdown_signal() => {}
        () = died => {
            tracing::error!("the reconciler panicked; exiting");
            return Err(DaemonError::ReconcilerPanicked);
        }
        // The binary prints it, as the one line of a refusal at start.
        shared = refused => return Err(shared.into()),
    }
    tracing::info!("stopping");
    // The revisions a pass recorded are written behind it: finished before
    // the process ends, unless the disk hangs.
    let done = tokio::task::spawn_blocking(move || history_drain.wait(HISTORY_DRAIN_LIMIT))
        .await
        .unwrap_or(false);
    if !done {
        tracing::warn!(limit = ?HISTORY_DRAIN_LIMIT,
            "the revision history's last writes did not finish in time; the manifests are in place, their newest revisions may be missing from the history");
    }
    Ok(())
}

/// What the API source adds to reloading: the ConfigMaps a catalog names,
/// and Events on them.
struct ApiReloading {
    client: kube::Client,
    namespace: String,
    watch_timeout: Option<u32>,
    events: Option<events::EventSink>,
    /// The Node a refusal that no ConfigMap caused is reported on.
    node_name: String,
}

/// Starts the catalog loader and the configuration file's watch, each on a
/// thread of its own; with the API, the watches of the ConfigMaps the
/// catalog names, on the async runtime (call from it).
fn start_reloading(
    reloading: Reloading,
    catalog: Option<Arc<Catalog>>,
    api: Option<ApiReloading>,
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
            Box::new(api_catalog::ApiCatalog::new(
                reloading.source,
                watches,
                api.events,
                reloading.runtime.clone(),
                api.node_name,
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

/// The daemon's client ([`crate::kube_client::config`]), every request it
/// sends counted in `metrics` (`podstamp_api_requests_total`).
pub async fn client(
    kubeconfig: Option<&Path>,
    metrics: Arc<Metrics>,
) -> Result<kube::Client, ClientError> {
    let config = crate::kube_client::config(kubeconfig).await?;
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ClientError::Client)?;
    Ok(builder.with_layer(&api_requests::layer(metrics)).build())
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
