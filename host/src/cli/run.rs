//! `podstamp run`'s command line (the binary's, not the library's: main.rs
//! declares this module). The flags become the top [`Layer`] of the
//! settings; the environment and the configuration file are read by
//! [`podstamp::settings`], which resolves them all in one place. The
//! environment variables are named here for `--help` only.

use std::path::PathBuf;

use clap::Args;

use podstamp::settings::Layer;

/// `podstamp run` flags. Each overrides its environment variable, which
/// overrides the config file's entry.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The configuration file: plugin catalog, chain, limits, `daemon:` settings [env: PODSTAMP_CONFIG].
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where templates come from: `api` (the Kubernetes API) or `dir:PATH` (PodTemplate files) [env: PODSTAMP_SOURCE] [default: api].
    #[arg(long, value_name = "api|dir:PATH")]
    pub source: Option<String>,
    /// A kubeconfig file [default: $KUBECONFIG, ~/.kube/config, else in-cluster credentials].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the PodTemplates, also written into the manifests [env: PODSTAMP_NAMESPACE] [default: kube-system].
    #[arg(long, short)]
    pub namespace: Option<String>,
    /// Label selector for the PodTemplates [env: PODSTAMP_SELECTOR] [default: podstamp.io/enabled=true].
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// This node's name [env: NODE_NAME].
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// A Node object (YAML/JSON) describing this node, for the `dir:` source.
    #[arg(long, value_name = "FILE")]
    pub node_file: Option<PathBuf>,
    /// The kubelet's static pod manifest directory [env: PODSTAMP_MANIFEST_DIR] [default: /etc/kubernetes/manifests].
    #[arg(long, value_name = "DIR")]
    pub manifest_dir: Option<PathBuf>,
    /// Address for /healthz, /readyz and /metrics [env: PODSTAMP_LISTEN] [default: 127.0.0.1:9464].
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// How often every template is rendered again, e.g. 5m [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub resync: Option<String>,
    /// How long one watch call lasts before it is renewed from the last
    /// resourceVersion, in whole seconds, e.g. 5m [default: 290s].
    #[arg(long, value_name = "DURATION")]
    pub watch_timeout: Option<String>,
    /// Where the last manifests of each template are kept, outside the manifest directory [env: PODSTAMP_REVISIONS_DIR] [default: /var/lib/podstamp/revisions].
    #[arg(long, value_name = "DIR")]
    pub revisions_dir: Option<PathBuf>,
    /// How many manifests are kept per template in the revisions directory [default: 3].
    #[arg(long, value_name = "N")]
    pub revision_history: Option<usize>,
    /// The container runtime's CRI socket, read (List and Status calls only) to follow rollouts while the API server is down [env: PODSTAMP_CRI_SOCKET] [default: /run/containerd/containerd.sock].
    #[arg(long, value_name = "PATH")]
    pub cri_socket: Option<PathBuf>,
    /// The namespace of the Leases through which the nodes roll updates one at a time (daemon.rollouts.namespace) [env: PODSTAMP_ROLLOUT_NAMESPACE] [default: podstamp-rollouts].
    #[arg(long, value_name = "NAMESPACE")]
    pub rollout_namespace: Option<String>,
    /// The namespace of the nodes' status records, which no node watches: kept apart from the slots, whose watches the API server would otherwise hand every record (daemon.rollouts.statusNamespace) [env: PODSTAMP_STATUS_NAMESPACE] [default: the rollout namespace's name and -status].
    #[arg(long, value_name = "NAMESPACE")]
    pub status_namespace: Option<String>,
    /// How long a rollout slot outlives a node that stopped renewing it, e.g. 30s, at most 5m (daemon.rollouts.leaseDuration) [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub slot_lease_duration: Option<String>,
    /// Lets the rollout Leases be in a namespace where the control plane keeps its own (kube-system, kube-node-lease, or one holding a kube-scheduler or kube-controller-manager Lease): said at start instead of refused (daemon.rollouts.allowControlPlaneNamespace).
    #[arg(long)]
    pub allow_control_plane_namespace: bool,
    /// The largest manifest written, and pod a plugin may return, e.g. 1Mi (limits.maxManifestSize) [env: PODSTAMP_MAX_MANIFEST_SIZE] [default: 1Mi].
    #[arg(long, value_name = "SIZE")]
    pub max_manifest_size: Option<String>,
    /// Where compiled plugin code is cached [env: PODSTAMP_CACHE_DIR] [default: the config's cacheDir, else $XDG_CACHE_HOME/podstamp or ~/.cache/podstamp; /var/cache/podstamp for root].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile plugins every time instead of using the cache.
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
    /// The Pod Security level of a template whose namespace has no pod-security.kubernetes.io/enforce label, LEVEL or LEVEL:VERSION (podSecurity) [env: PODSTAMP_POD_SECURITY] [default: baseline].
    #[arg(long, value_name = "LEVEL[:VERSION]")]
    pub pod_security: Option<String>,
    /// Credentials for `oci:` plugins: a docker config JSON file (daemon.registry.config) [env: PODSTAMP_REGISTRY_CONFIG].
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,
    /// Credentials for `oci:` plugins: a kubernetes.io/dockerconfigjson Secret of the daemon's namespace (daemon.registry.secret) [env: PODSTAMP_REGISTRY_SECRET].
    #[arg(long, value_name = "NAME")]
    pub registry_secret: Option<String>,
    /// CA certificates (PEM) trusted for registries besides the system's (daemon.registry.ca) [env: PODSTAMP_REGISTRY_CA].
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Option<PathBuf>,
    /// The most one pull of an `oci:` plugin may take, e.g. 30s (daemon.registry.timeout) [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub registry_timeout: Option<String>,
}

impl RunArgs {
    /// The flags' layer of the settings.
    pub fn layer(&self) -> Layer {
        Layer {
            config: self.config.clone(),
            namespace: self.namespace.clone(),
            max_manifest_size: self.max_manifest_size.clone(),
            timeout: None,
            memory: None,
            cache_dir: self.cache_dir.clone(),
            pod_security: self.pod_security.clone(),
            no_cache: self.no_cache,
            source: self.source.clone(),
            kubeconfig: self.kubeconfig.clone(),
            selector: self.selector.clone(),
            node_name: self.node_name.clone(),
            node_file: self.node_file.clone(),
            manifest_dir: self.manifest_dir.clone(),
            listen: self.listen.clone(),
            resync: self.resync.clone(),
            watch_timeout: self.watch_timeout.clone(),
            revisions_dir: self.revisions_dir.clone(),
            revision_history: self.revision_history,
            cri_socket: self.cri_socket.clone(),
            rollout_namespace: self.rollout_namespace.clone(),
            status_namespace: self.status_namespace.clone(),
            slot_lease_duration: self.slot_lease_duration.clone(),
            allow_control_plane_namespace: self.allow_control_plane_namespace.then_some(true),
            registry_config: self.registry_config.clone(),
            registry_secret: self.registry_secret.clone(),
            registry_ca: self.registry_ca.clone(),
            registry_timeout: self.registry_timeout.clone(),
        }
    }
}
