//! The settings of `podstamp run` and `podstamp render`, resolved in one
//! place.
//!
//! Each setting is taken from the highest layer that gives it:
//!
//! ```text
//! flags  >  environment  >  configuration file  >  default
//! ```
//!
//! Layers are [`Layer`]s, all of the same shape: the binary turns its flags
//! into one, [`Layer::from_env`] reads the environment, [`Layer::from_file`]
//! the configuration file. [`daemon`] and [`render`] pick each value from
//! the highest layer that has it, parse and check it, and name the layer it
//! came from when it is wrong (`--namespace`, `PODSTAMP_NAMESPACE`, or the
//! file and its field). Nothing else reads these environment variables or
//! applies these defaults: the daemon (its reconciler, loader and sources)
//! and `render` are given the resolved values. An empty environment
//! variable counts as unset.
//!
//! | setting (file) | flag | environment | default |
//! | --- | --- | --- | --- |
//! | configuration file | `--config` | `PODSTAMP_CONFIG` (run only) | none |
//! | `namespace` | `--namespace` | `PODSTAMP_NAMESPACE` | `kube-system` |
//! | `limits.maxManifestSize` | `--max-manifest-size` | `PODSTAMP_MAX_MANIFEST_SIZE` | `1Mi` |
//! | `limits.timeout` | `--timeout` (render) | | `100ms` |
//! | `limits.memory` | `--memory` (render) | | `64Mi` |
//! | `cacheDir` | `--cache-dir`, `--no-cache` | `PODSTAMP_CACHE_DIR` | [`default_cache_dir`] when safe |
//! | `podSecurity` | `--pod-security` | `PODSTAMP_POD_SECURITY` | `baseline` ([`crate::security_level`]) |
//! | `daemon.source` | `--source` | `PODSTAMP_SOURCE` | `api` |
//! | `daemon.kubeconfig` | `--kubeconfig` | (`KUBECONFIG`, kube-rs) | kube-rs's inference |
//! | `daemon.selector` | `--selector` | `PODSTAMP_SELECTOR` | `podstamp.io/enabled=true` |
//! | `daemon.nodeName` | `--node-name` | `NODE_NAME` | required |
//! | `daemon.nodeFile` | `--node-file` | | none |
//! | `daemon.manifestDir` | `--manifest-dir` | `PODSTAMP_MANIFEST_DIR` | `/etc/kubernetes/manifests` |
//! | `daemon.listen` | `--listen` | `PODSTAMP_LISTEN` | `127.0.0.1:9464` |
//! | `daemon.resync` | `--resync` | | `5m` |
//! | (none) | `--watch-timeout` | | kube-rs's (290 s) |
//! | `daemon.revisionsDir` | `--revisions-dir` | `PODSTAMP_REVISIONS_DIR` | `/var/lib/podstamp/revisions` |
//! | `daemon.revisionHistory` | `--revision-history` | | `3` |
//! | `daemon.criSocket` | `--cri-socket` | `PODSTAMP_CRI_SOCKET` | `/run/containerd/containerd.sock` |
//! | `daemon.rollouts.namespace` | `--rollout-namespace` | `PODSTAMP_ROLLOUT_NAMESPACE` | `podstamp-rollouts` |
//! | `daemon.rollouts.statusNamespace` | `--status-namespace` | `PODSTAMP_STATUS_NAMESPACE` | the rollout namespace's name and `-status` (`podstamp-rollouts-status`) |
//! | `daemon.rollouts.leaseDuration` | `--slot-lease-duration` | | `30s` (at most `5m`) |
//! | `daemon.rollouts.allowControlPlaneNamespace` | `--allow-control-plane-namespace` | | `false` |
//! | `daemon.registry.config` | `--registry-config` | `PODSTAMP_REGISTRY_CONFIG` | none |
//! | `daemon.registry.secret` | `--registry-secret` | `PODSTAMP_REGISTRY_SECRET` | none |
//! | `daemon.registry.ca` | `--registry-ca` | `PODSTAMP_REGISTRY_CA` | the system's CAs only |
//! | `daemon.registry.timeout` | `--registry-timeout` | | `30s` |
//!
//! `podstamp render` and `podstamp test` read the `daemon.registry` fields
//! of their configuration (and the variables, for `render`) too, so that
//! an `oci:` catalog entry renders offline as the daemon would (a Secret is
//! read through the default kubeconfig); they have no registry flags.
//!
//! Not settings in this sense: the catalog (`plugins`, `chain`, or
//! `daemon.catalog`, with `limits.renderTimeout`, which the catalog's render
//! budget reads with the resolved `timeout`) comes from the file or its
//! ConfigMap only and is reloaded at run time ([`crate::daemon::reload`]);
//! these settings are fixed at start (a changed one in the file is
//! reported as needing a restart, with the value in use from
//! [`DaemonSettings::in_use`]). The log format and filter (`--log-format`,
//! `--log-level`/`RUST_LOG`) are the binary's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{
    ConfigError, ConfigFile, DEFAULT_NAMESPACE, DEFAULT_ROLLOUT_NAMESPACE, NoStatusNamespace,
    default_status_namespace, derived_status_namespace, parse_duration, parse_size,
};
use crate::kube_check::Policy;
use crate::plugin::{Limits, choose_cache_dir};
use crate::security_level::Held;

pub const DEFAULT_SELECTOR: &str = "podstamp.io/enabled=true";
pub const DEFAULT_MANIFEST_DIR: &str = "/etc/kubernetes/manifests";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);
/// Where the daemon keeps its revision history ([`crate::daemon::revisions`]).
pub const DEFAULT_REVISIONS_DIR: &str = "/var/lib/podstamp/revisions";
/// containerd's CRI socket, where kubeadm, RKE2 and k0s nodes have it.
pub const DEFAULT_CRI_SOCKET: &str = "/run/containerd/containerd.sock";
/// How many revisions of each template are kept.
pub const DEFAULT_REVISION_HISTORY: usize = 3;
/// The default `leaseDurationSeconds` of a rollout slot.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(30);
/// The longest `daemon.rollouts.leaseDuration`: deploy/node-identity.yaml
/// refuses a Lease whose `leaseDurationSeconds` is longer, so a longer one
/// could never be written. It bounds how long a dead node's slot stalls a
/// rollout.
pub const MAX_SLOT_LEASE_DURATION: Duration = Duration::from_secs(300);
/// Namespaces where the control plane keeps Leases of its own: kube-system
/// (leader election of kube-scheduler and kube-controller-manager, the API
/// servers' identities), kube-node-lease (each kubelet's heartbeat). The
/// rollout Leases are refused there unless
/// `daemon.rollouts.allowControlPlaneNamespace` says otherwise: a Lease
/// write granted there reaches the control plane's too.
pub const CONTROL_PLANE_NAMESPACES: [&str; 2] = ["kube-system", "kube-node-lease"];

/// The settings one layer gives, as written there (text, parsed when
/// resolved). None: this layer does not set it.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    pub config: Option<PathBuf>,
    pub namespace: Option<String>,
    pub max_manifest_size: Option<String>,
    pub timeout: Option<String>,
    pub memory: Option<String>,
    pub cache_dir: Option<PathBuf>,
    /// `LEVEL` or `LEVEL:VERSION`: the Pod Security level of a template
    /// whose namespace has none.
    pub pod_security: Option<String>,
    /// `--no-cache` (flags only): no code cache, whatever the lower layers say.
    pub no_cache: bool,
    pub source: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub selector: Option<String>,
    pub node_name: Option<String>,
    pub node_file: Option<PathBuf>,
    pub manifest_dir: Option<PathBuf>,
    pub listen: Option<String>,
    pub resync: Option<String>,
    pub watch_timeout: Option<String>,
    pub revisions_dir: Option<PathBuf>,
    pub revision_history: Option<usize>,
    pub cri_socket: Option<PathBuf>,
    pub rollout_namespace: Option<String>,
    pub status_namespace: Option<String>,
    pub slot_lease_duration: Option<String>,
    pub allow_control_plane_namespace: Option<bool>,
    pub registry_config: Option<PathBuf>,
    pub registry_secret: Option<String>,
    pub registry_ca: Option<PathBuf>,
    pub registry_timeout: Option<String>,
}

/// Where a setting is given: its flag, environment variable and field of
/// the configuration file, for the messages.
struct Key {
    flag: &'static str,
    env: Option<&'static str>,
    file: &'static str,
}

const fn key(flag: &'static str, env: Option<&'static str>, file: &'static str) -> Key {
    Key { flag, env, file }
}

const CONFIG: Key = key("--config", Some("PODSTAMP_CONFIG"), "(none)");
const NAMESPACE: Key = key("--namespace", Some("PODSTAMP_NAMESPACE"), "namespace");
const MAX_MANIFEST_SIZE: Key = key(
    "--max-manifest-size",
    Some("PODSTAMP_MAX_MANIFEST_SIZE"),
    "limits.maxManifestSize",
);
const TIMEOUT: Key = key("--timeout", None, "limits.timeout");
const MEMORY: Key = key("--memory", None, "limits.memory");
const CACHE_DIR: Key = key("--cache-dir", Some("PODSTAMP_CACHE_DIR"), "cacheDir");
const POD_SECURITY: Key = key(
    "--pod-security",
    Some("PODSTAMP_POD_SECURITY"),
    "podSecurity",
);
const SOURCE: Key = key("--source", Some("PODSTAMP_SOURCE"), "daemon.source");
const KUBECONFIG: Key = key("--kubeconfig", None, "daemon.kubeconfig");
const SELECTOR: Key = key("--selector", Some("PODSTAMP_SELECTOR"), "daemon.selector");
const NODE_NAME: Key = key("--node-name", Some("NODE_NAME"), "daemon.nodeName");
const NODE_FILE: Key = key("--node-file", None, "daemon.nodeFile");
const MANIFEST_DIR: Key = key(
    "--manifest-dir",
    Some("PODSTAMP_MANIFEST_DIR"),
    "daemon.manifestDir",
);
const LISTEN: Key = key("--listen", Some("PODSTAMP_LISTEN"), "daemon.listen");
const RESYNC: Key = key("--resync", None, "daemon.resync");
const WATCH_TIMEOUT: Key = key("--watch-timeout", None, "(none)");
const REVISIONS_DIR: Key = key(
    "--revisions-dir",
    Some("PODSTAMP_REVISIONS_DIR"),
    "daemon.revisionsDir",
);
const REVISION_HISTORY: Key = key("--revision-history", None, "daemon.revisionHistory");
const CRI_SOCKET: Key = key(
    "--cri-socket",
    Some("PODSTAMP_CRI_SOCKET"),
    "daemon.criSocket",
);
const ROLLOUT_NAMESPACE: Key = key(
    "--rollout-namespace",
    Some("PODSTAMP_ROLLOUT_NAMESPACE"),
    "daemon.rollouts.namespace",
);
const STATUS_NAMESPACE: Key = key(
    "--status-namespace",
    Some("PODSTAMP_STATUS_NAMESPACE"),
    "daemon.rollouts.statusNamespace",
);
const SLOT_LEASE_DURATION: Key = key(
    "--slot-lease-duration",
    None,
    "daemon.rollouts.leaseDuration",
);
const ALLOW_CONTROL_PLANE_NAMESPACE: Key = key(
    "--allow-control-plane-namespace",
    None,
    "daemon.rollouts.allowControlPlaneNamespace",
);

const REGISTRY_CONFIG: Key = key(
    "--registry-config",
    Some("PODSTAMP_REGISTRY_CONFIG"),
    "daemon.registry.config",
);
const REGISTRY_SECRET: Key = key(
    "--registry-secret",
    Some("PODSTAMP_REGISTRY_SECRET"),
    "daemon.registry.secret",
);
const REGISTRY_CA: Key = key(
    "--registry-ca",
    Some("PODSTAMP_REGISTRY_CA"),
    "daemon.registry.ca",
);
const REGISTRY_TIMEOUT: Key = key("--registry-timeout", None, "daemon.registry.timeout");

impl Layer {
    /// The environment's layer; `var` reads a variable (`std::env::var`,
    /// or a map in tests).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Layer {
        let text = |key: &Key| key.env.and_then(&var).filter(|value| !value.is_empty());
        let path = |key: &Key| text(key).map(PathBuf::from);
        Layer {
            config: path(&CONFIG),
            namespace: text(&NAMESPACE),
            max_manifest_size: text(&MAX_MANIFEST_SIZE),
            cache_dir: path(&CACHE_DIR),
            pod_security: text(&POD_SECURITY),
            source: text(&SOURCE),
            selector: text(&SELECTOR),
            node_name: text(&NODE_NAME),
            manifest_dir: path(&MANIFEST_DIR),
            listen: text(&LISTEN),
            revisions_dir: path(&REVISIONS_DIR),
            cri_socket: path(&CRI_SOCKET),
            rollout_namespace: text(&ROLLOUT_NAMESPACE),
            status_namespace: text(&STATUS_NAMESPACE),
            registry_config: path(&REGISTRY_CONFIG),
            registry_secret: text(&REGISTRY_SECRET),
            registry_ca: path(&REGISTRY_CA),
            ..Layer::default()
        }
    }

    /// The process's environment.
    pub fn from_process_env() -> Layer {
        Layer::from_env(|name| std::env::var(name).ok())
    }

    /// The configuration file's layer (its paths already relative to it).
    pub fn from_file(config: &ConfigFile) -> Layer {
        let d = &config.daemon;
        let l = &config.limits;
        Layer {
            config: None,
            namespace: config.namespace.clone(),
            max_manifest_size: l.max_manifest_size.clone(),
            timeout: l.timeout.clone(),
            memory: l.memory.clone(),
            cache_dir: config.cache_dir.clone(),
            pod_security: config.pod_security.clone(),
            no_cache: false,
            source: d.source.clone(),
            kubeconfig: d.kubeconfig.clone(),
            selector: d.selector.clone(),
            node_name: d.node_name.clone(),
            node_file: d.node_file.clone(),
            manifest_dir: d.manifest_dir.clone(),
            listen: d.listen.clone(),
            resync: d.resync.clone(),
            watch_timeout: None,
            revisions_dir: d.revisions_dir.clone(),
            revision_history: d.revision_history,
            cri_socket: d.cri_socket.clone(),
            rollout_namespace: d.rollouts.as_ref().and_then(|r| r.namespace.clone()),
            status_namespace: d.rollouts.as_ref().and_then(|r| r.status_namespace.clone()),
            slot_lease_duration: d.rollouts.as_ref().and_then(|r| r.lease_duration.clone()),
            allow_control_plane_namespace: d
                .rollouts
                .as_ref()
                .and_then(|r| r.allow_control_plane_namespace),
            registry_config: d.registry.as_ref().and_then(|r| r.config.clone()),
            registry_secret: d.registry.as_ref().and_then(|r| r.secret.clone()),
            registry_ca: d.registry.as_ref().and_then(|r| r.ca.clone()),
            registry_timeout: d.registry.as_ref().and_then(|r| r.timeout.clone()),
        }
    }
}

/// A setting that cannot be used, or a configuration file that cannot be
/// read. The message names where the value came from.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{at}: {message}")]
    Invalid { at: String, message: String },
    #[error(transparent)]
    NoStatusNamespace(#[from] NoStatusNamespace),
    #[error("say which node this is: --node-name NAME, or the NODE_NAME environment variable")]
    NoNodeName,
}

/// The layers, highest first.
struct Layers<'a> {
    flags: &'a Layer,
    env: &'a Layer,
    file: &'a Layer,
    /// The configuration file, for the messages.
    file_name: Option<&'a Path>,
}

impl<'a> Layers<'a> {
    /// The value of the highest layer that has one, and where it is given.
    fn pick<T: ?Sized>(
        &self,
        key: &Key,
        get: impl Fn(&'a Layer) -> Option<&'a T>,
    ) -> Option<(&'a T, String)> {
        if let Some(v) = get(self.flags) {
            return Some((v, key.flag.to_string()));
        }
        if let (Some(v), Some(env)) = (get(self.env), key.env) {
            return Some((v, env.to_string()));
        }
        let at = match self.file_name {
            Some(file) => format!("{}: {}", file.display(), key.file),
            None => key.file.to_string(),
        };
        get(self.file).map(|v| (v, at))
    }

    fn invalid(at: String, message: impl std::fmt::Display) -> SettingsError {
        SettingsError::Invalid {
            at,
            message: message.to_string(),
        }
    }

    fn namespace(&self) -> Result<String, SettingsError> {
        match self.pick(&NAMESPACE, |l| l.namespace.as_deref()) {
            Some((namespace, at)) => {
                crate::validate::check_dns_label(namespace).map_err(|e| Layers::invalid(at, e))?;
                Ok(namespace.to_string())
            }
            None => Ok(DEFAULT_NAMESPACE.to_string()),
        }
    }

    /// A namespace podstamp writes Leases in (`key`), if one is given: a
    /// DNS label, and none of [`CONTROL_PLANE_NAMESPACES`] unless allowed
    /// (the refusal names `default`, the way out).
    fn lease_namespace(
        &self,
        key: &Key,
        get: impl Fn(&'a Layer) -> Option<&'a str>,
        default: &str,
        allow_control_plane: bool,
    ) -> Result<Option<String>, SettingsError> {
        let Some((ns, at)) = self.pick(key, get) else {
            return Ok(None);
        };
        crate::validate::check_dns_label(ns).map_err(|e| Layers::invalid(at.clone(), e))?;
        if CONTROL_PLANE_NAMESPACES.contains(&ns) && !allow_control_plane {
            return Err(Layers::invalid(
                format!("{at} {ns:?}"),
                format!(
                    "the control plane keeps its own Leases there, which the rollouts' Lease permission would reach; use a namespace of their own (default {default}, deploy/namespace.yaml), or say --allow-control-plane-namespace (daemon.rollouts.allowControlPlaneNamespace: true)"
                ),
            ));
        }
        Ok(Some(ns.to_string()))
    }

    /// The registry options: credentials from a file or a Secret (not
    /// both), a CA, a timeout.
    fn registry(
        &self,
        namespace: &str,
        source: &TemplateSource,
    ) -> Result<crate::oci::RegistryOptions, SettingsError> {
        use crate::oci::{Credentials, RegistryOptions};
        let file = self.path(&REGISTRY_CONFIG, |l| l.registry_config.as_ref());
        let secret = self.pick(&REGISTRY_SECRET, |l| l.registry_secret.as_deref());
        let credentials = match (file, secret) {
            (Some(_), Some((_, at))) => {
                return Err(Layers::invalid(
                    at,
                    "give registry credentials from a file (--registry-config) or a Secret (--registry-secret), not both",
                ));
            }
            (Some(file), None) => Credentials::File(file),
            (None, Some((name, at))) => {
                crate::validate::check_dns_subdomain(name).map_err(|e| Layers::invalid(at, e))?;
                Credentials::Secret {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    kubeconfig: match source {
                        TemplateSource::Api { kubeconfig } => kubeconfig.clone(),
                        TemplateSource::Dir(_) => None,
                    },
                }
            }
            (None, None) => Credentials::Anonymous,
        };
        let timeout = match self.pick(&REGISTRY_TIMEOUT, |l| l.registry_timeout.as_deref()) {
            Some((text, at)) => parse_duration(text).map_err(|e| Layers::invalid(at, e))?,
            None => crate::oci::options::DEFAULT_TIMEOUT,
        };
        Ok(RegistryOptions {
            credentials,
            ca: self.path(&REGISTRY_CA, |l| l.registry_ca.as_ref()),
            timeout,
            insecure_http: false,
        })
    }

    fn limits(&self) -> Result<Limits, SettingsError> {
        let mut limits = Limits::default();
        if let Some((text, at)) = self.pick(&TIMEOUT, |l| l.timeout.as_deref()) {
            limits.timeout = parse_duration(text).map_err(|e| Layers::invalid(at, e))?;
        }
        if let Some((text, at)) = self.pick(&MEMORY, |l| l.memory.as_deref()) {
            limits.memory_bytes = parse_size(text).map_err(|e| Layers::invalid(at, e))?;
        }
        if let Some((text, at)) = self.pick(&MAX_MANIFEST_SIZE, |l| l.max_manifest_size.as_deref())
        {
            limits.max_output_bytes = parse_size(text).map_err(|e| Layers::invalid(at, e))?;
        }
        Ok(limits)
    }

    /// The Pod Security level of a template whose namespace has none, and
    /// where it was given.
    fn pod_security(&self) -> Result<Held, SettingsError> {
        match self.pick(&POD_SECURITY, |l| l.pod_security.as_deref()) {
            Some((text, at)) => {
                let policy = Policy::parse(text).map_err(|e| {
                    Layers::invalid(at.clone(), format!("{e} (as LEVEL or LEVEL:VERSION)"))
                })?;
                Ok(Held { policy, from: at })
            }
            None => Ok(Held::default_level()),
        }
    }

    /// The cache directory given (None: the default, if safe), or none at
    /// all with `--no-cache`.
    fn cache_dir(&self) -> Option<PathBuf> {
        let given = self.pick(&CACHE_DIR, |l| l.cache_dir.as_deref());
        choose_cache_dir(self.flags.no_cache, given.map(|(dir, _)| dir))
    }

    fn path(&self, key: &Key, get: impl Fn(&'a Layer) -> Option<&'a PathBuf>) -> Option<PathBuf> {
        self.pick(key, get).map(|(p, _)| p.clone())
    }
}

/// What `podstamp render` resolves.
#[derive(Debug)]
pub struct RenderSettings {
    /// The configuration file (`--config`), or an empty one.
    pub config: ConfigFile,
    pub namespace: String,
    /// `limits.maxManifestSize` is `max_output_bytes`.
    pub limits: Limits,
    pub cache_dir: Option<PathBuf>,
    /// How to reach the registries of `oci:` catalog entries: the
    /// configuration's `daemon.registry` (and its variables), as the daemon
    /// would; a Secret is read through the default kubeconfig.
    pub registry: crate::oci::RegistryOptions,
    /// The Pod Security level every render is held to (offline, no
    /// namespace is read), before the template's annotation.
    pub pod_security: Held,
}

/// Resolves `podstamp render`'s settings. Its configuration file is the
/// one `--config` names only (a `PODSTAMP_CONFIG` meant for the daemon is
/// not read: `render --plugin` has no file).
pub fn render(flags: &Layer, env: &Layer) -> Result<RenderSettings, SettingsError> {
    let config = match &flags.config {
        Some(path) => ConfigFile::read(path)?,
        None => ConfigFile::default(),
    };
    let file = Layer::from_file(&config);
    let layers = Layers {
        flags,
        env,
        file: &file,
        file_name: flags.config.as_deref(),
    };
    let namespace = layers.namespace()?;
    Ok(RenderSettings {
        registry: layers.registry(&namespace, &TemplateSource::Api { kubeconfig: None })?,
        namespace,
        limits: layers.limits()?,
        cache_dir: layers.cache_dir(),
        pod_security: layers.pod_security()?,
        config,
    })
}

/// Where the templates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSource {
    /// The API server, with these credentials (None: kube-rs infers them).
    Api { kubeconfig: Option<PathBuf> },
    /// A directory of PodTemplate files.
    Dir(PathBuf),
}

/// The configuration file the daemon started with.
#[derive(Debug)]
pub struct StartedConfig {
    pub path: PathBuf,
    /// Its content, read before it was parsed: a change in between is seen
    /// as one by the watch.
    pub content: crate::config::Content,
}

/// What `podstamp run` resolves.
#[derive(Debug)]
pub struct DaemonSettings {
    /// The configuration file, as read at start (empty without one).
    pub config: ConfigFile,
    /// Where it is, when there is one.
    pub config_file: Option<StartedConfig>,
    pub source: TemplateSource,
    pub namespace: String,
    pub selector: String,
    pub node_name: String,
    pub node_file: Option<PathBuf>,
    pub manifest_dir: PathBuf,
    pub listen: SocketAddr,
    pub resync: Duration,
    /// Seconds; None: kube-rs's default.
    pub watch_timeout: Option<u32>,
    pub revisions_dir: PathBuf,
    pub revision_history: usize,
    /// The container runtime's CRI socket (local evidence of rollouts).
    pub cri_socket: PathBuf,
    /// Where the rollout Leases are (default: [`DEFAULT_ROLLOUT_NAMESPACE`]).
    pub rollout_namespace: String,
    /// Where the nodes' status records are (default: the rollout
    /// namespace's name and `-status`, [`default_status_namespace`]): apart from the slots, so that no
    /// node's watch of them is handed the records (docs/daemon.md, "Fleets").
    pub status_namespace: String,
    /// `rollout_namespace` and `status_namespace` may be one of [`CONTROL_PLANE_NAMESPACES`], or
    /// hold the control plane's leader-election Leases: said so at start,
    /// not refused.
    pub allow_control_plane_namespace: bool,
    /// A rollout slot's `leaseDurationSeconds`.
    pub slot_lease_duration: Duration,
    /// The sandbox limits; `max_output_bytes` is `limits.maxManifestSize`,
    /// the limit of every manifest written, too.
    pub limits: Limits,
    pub cache_dir: Option<PathBuf>,
    /// How `oci:` catalog components are pulled.
    pub registry: crate::oci::RegistryOptions,
    /// The Pod Security level of a template whose namespace has no
    /// `pod-security.kubernetes.io/enforce` label ([`crate::security_level`]),
    /// resolved at start (a reloaded configuration does not change it).
    pub pod_security: Held,
}

/// Resolves `podstamp run`'s settings, reading the configuration file the
/// flags or the environment name.
pub fn daemon(flags: &Layer, env: &Layer) -> Result<DaemonSettings, SettingsError> {
    let path = flags.config.clone().or_else(|| env.config.clone());
    let (config, config_file) = match path {
        Some(path) => {
            let content = crate::config::content(&path);
            let config = ConfigFile::read(&path)?;
            (config, Some(StartedConfig { path, content }))
        }
        None => (ConfigFile::default(), None),
    };
    let file = Layer::from_file(&config);
    let layers = Layers {
        flags,
        env,
        file: &file,
        file_name: config_file.as_ref().map(|c| c.path.as_path()),
    };
    let source = match layers.pick(&SOURCE, |l| l.source.as_deref()) {
        None => TemplateSource::Api { kubeconfig: None },
        Some(("api", _)) => TemplateSource::Api { kubeconfig: None },
        Some((s, _)) if s.len() > 4 && s.starts_with("dir:") => {
            TemplateSource::Dir(PathBuf::from(&s[4..]))
        }
        Some((other, at)) => {
            return Err(Layers::invalid(
                format!("{at} {other:?}"),
                "expected `api` or `dir:PATH`",
            ));
        }
    };
    let source = match source {
        TemplateSource::Api { .. } => TemplateSource::Api {
            kubeconfig: layers.path(&KUBECONFIG, |l| l.kubeconfig.as_ref()),
        },
        dir => dir,
    };
    let (node_name, at) = layers
        .pick(&NODE_NAME, |l| {
            l.node_name.as_deref().filter(|n| !n.is_empty())
        })
        .ok_or(SettingsError::NoNodeName)?;
    crate::validate::check_dns_subdomain(node_name).map_err(|e| Layers::invalid(at, e))?;
    let listen = match layers.pick(&LISTEN, |l| l.listen.as_deref()) {
        Some((text, at)) => text.parse().map_err(|_| {
            Layers::invalid(
                format!("{at} {text:?}"),
                "expected HOST:PORT, e.g. 127.0.0.1:9464",
            )
        })?,
        None => DEFAULT_LISTEN.parse().expect("the default listen address"),
    };
    let resync = match layers.pick(&RESYNC, |l| l.resync.as_deref()) {
        Some((text, at)) => parse_duration(text).map_err(|e| Layers::invalid(at, e))?,
        None => DEFAULT_RESYNC,
    };
    let watch_timeout = match layers.pick(&WATCH_TIMEOUT, |l| l.watch_timeout.as_deref()) {
        Some((text, at)) => {
            let d = parse_duration(text).map_err(|e| Layers::invalid(at.clone(), e))?;
            match u32::try_from(d.as_secs()) {
                Ok(secs) if secs > 0 && u128::from(secs) * 1000 == d.as_millis() => Some(secs),
                _ => {
                    return Err(Layers::invalid(
                        format!("{at} {text:?}"),
                        "must be a whole number of seconds, at least 1s",
                    ));
                }
            }
        }
        None => None,
    };
    let namespace = layers.namespace()?;
    let allow_control_plane_namespace = layers
        .pick(&ALLOW_CONTROL_PLANE_NAMESPACE, |l| {
            l.allow_control_plane_namespace.as_ref()
        })
        .is_some_and(|(allow, _)| *allow);
    let rollout_namespace = layers
        .lease_namespace(
            &ROLLOUT_NAMESPACE,
            |l| l.rollout_namespace.as_deref(),
            DEFAULT_ROLLOUT_NAMESPACE,
            allow_control_plane_namespace,
        )?
        .unwrap_or_else(|| DEFAULT_ROLLOUT_NAMESPACE.to_string());
    let status_namespace = match layers.lease_namespace(
        &STATUS_NAMESPACE,
        |l| l.status_namespace.as_deref(),
        &default_status_namespace(&rollout_namespace),
        allow_control_plane_namespace,
    )? {
        Some(named) => named,
        None => derived_status_namespace(&rollout_namespace)?,
    };
    let slot_lease_duration = match layers
        .pick(&SLOT_LEASE_DURATION, |l| l.slot_lease_duration.as_deref())
    {
        Some((text, at)) => {
            let d = parse_duration(text).map_err(|e| Layers::invalid(at.clone(), e))?;
            if d.as_secs() < 1 || d.subsec_nanos() != 0 {
                return Err(Layers::invalid(
                    format!("{at} {text:?}"),
                    "must be a whole number of seconds, at least 1s",
                ));
            }
            if d > MAX_SLOT_LEASE_DURATION {
                return Err(Layers::invalid(
                    format!("{at} {text:?}"),
                    "must be at most 5m: deploy/node-identity.yaml refuses a longer leaseDurationSeconds (300)",
                ));
            }
            d
        }
        None => DEFAULT_LEASE_DURATION,
    };
    let registry = layers.registry(&namespace, &source)?;
    Ok(DaemonSettings {
        pod_security: layers.pod_security()?,
        registry,
        source,
        namespace,
        rollout_namespace,
        status_namespace,
        allow_control_plane_namespace,
        slot_lease_duration,
        selector: layers
            .pick(&SELECTOR, |l| l.selector.as_deref())
            .map_or(DEFAULT_SELECTOR, |(s, _)| s)
            .to_string(),
        node_name: node_name.to_string(),
        node_file: layers.path(&NODE_FILE, |l| l.node_file.as_ref()),
        manifest_dir: layers
            .path(&MANIFEST_DIR, |l| l.manifest_dir.as_ref())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MANIFEST_DIR)),
        listen,
        resync,
        watch_timeout,
        revisions_dir: layers
            .path(&REVISIONS_DIR, |l| l.revisions_dir.as_ref())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_REVISIONS_DIR)),
        revision_history: layers
            .pick(&REVISION_HISTORY, |l| l.revision_history.as_ref())
            .map_or(DEFAULT_REVISION_HISTORY, |(n, _)| *n),
        cri_socket: layers
            .path(&CRI_SOCKET, |l| l.cri_socket.as_ref())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CRI_SOCKET)),
        limits: layers.limits()?,
        cache_dir: layers.cache_dir(),
        config_file,
        config,
    })
}

impl DaemonSettings {
    /// Each node-local setting as in use, by its name in the file: what a
    /// change of it in the file, which needs a restart, keeps.
    pub fn in_use(&self) -> BTreeMap<&'static str, String> {
        let limits = &self.limits;
        let budget = self.config.render_budget(limits.timeout).ok();
        let shown =
            |path: Option<&PathBuf>| path.map_or("(none)".into(), |p| p.display().to_string());
        BTreeMap::from([
            ("namespace", self.namespace.clone()),
            (
                "cacheDir",
                self.cache_dir
                    .as_ref()
                    .map_or("no code cache".into(), |d| d.display().to_string()),
            ),
            (
                "daemon.source",
                match &self.source {
                    TemplateSource::Api { .. } => "api".to_string(),
                    TemplateSource::Dir(dir) => format!("dir:{}", dir.display()),
                },
            ),
            (
                "daemon.kubeconfig",
                match &self.source {
                    TemplateSource::Api { kubeconfig } => shown(kubeconfig.as_ref()),
                    TemplateSource::Dir(_) => "(none)".to_string(),
                },
            ),
            ("daemon.selector", self.selector.clone()),
            ("daemon.nodeName", self.node_name.clone()),
            ("daemon.nodeFile", shown(self.node_file.as_ref())),
            (
                "daemon.manifestDir",
                self.manifest_dir.display().to_string(),
            ),
            ("daemon.listen", self.listen.to_string()),
            ("daemon.resync", format!("{:?}", self.resync)),
            (
                "daemon.revisionsDir",
                self.revisions_dir.display().to_string(),
            ),
            ("daemon.revisionHistory", self.revision_history.to_string()),
            ("daemon.criSocket", self.cri_socket.display().to_string()),
            ("daemon.rollouts.namespace", self.rollout_namespace.clone()),
            (
                "daemon.rollouts.statusNamespace",
                self.status_namespace.clone(),
            ),
            (
                "daemon.rollouts.allowControlPlaneNamespace",
                self.allow_control_plane_namespace.to_string(),
            ),
            (
                "daemon.rollouts.leaseDuration",
                format!("{:?}", self.slot_lease_duration),
            ),
            (
                "daemon.registry",
                format!(
                    "{}; CA {}; timeout {:?}",
                    self.registry.credentials,
                    shown(self.registry.ca.as_ref()),
                    self.registry.timeout
                ),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration file holding `text`, and its layer.
    fn file(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("podstamp.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn env(vars: &[(&str, &str)]) -> Layer {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Layer::from_env(|name| vars.get(name).cloned())
    }

    fn flags(config: &Path) -> Layer {
        Layer {
            config: Some(config.to_path_buf()),
            node_name: Some("n1".into()),
            no_cache: true,
            ..Layer::default()
        }
    }

    /// Flag beats environment beats file beats default, for the daemon and
    /// for render alike.
    #[test]
    fn namespace_and_size_limit_flag_then_env_then_file_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let with_file = file(
            dir.path(),
            "namespace: from-file\nlimits: {maxManifestSize: 3Ki}\n",
        );
        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "{}\n").unwrap();
        let env_both = env(&[
            ("PODSTAMP_NAMESPACE", "from-env"),
            ("PODSTAMP_MAX_MANIFEST_SIZE", "2Ki"),
        ]);
        let mut given = flags(&with_file);
        given.namespace = Some("from-flag".into());
        given.max_manifest_size = Some("1Ki".into());
        let cases = [
            (given, env_both.clone(), "from-flag", 1024),
            (flags(&with_file), env_both, "from-env", 2048),
            // An empty variable is unset.
            (
                flags(&with_file),
                env(&[
                    ("PODSTAMP_NAMESPACE", ""),
                    ("PODSTAMP_MAX_MANIFEST_SIZE", ""),
                ]),
                "from-file",
                3072,
            ),
            (flags(&empty), env(&[]), "kube-system", 1 << 20),
        ];
        for (flags, env, namespace, size) in cases {
            let run = daemon(&flags, &env).unwrap();
            assert_eq!(
                (run.namespace.as_str(), run.limits.max_output_bytes),
                (namespace, size)
            );
            assert_eq!(run.in_use()["namespace"], namespace);
            let render = render(&flags, &env).unwrap();
            assert_eq!(
                (render.namespace.as_str(), render.limits.max_output_bytes),
                (namespace, size)
            );
        }
    }

    #[test]
    fn cache_dir_and_daemon_settings_follow_the_same_order() {
        let dir = tempfile::tempdir().unwrap();
        let config = file(
            dir.path(),
            "cacheDir: file-cache\ndaemon: {manifestDir: file-manifests, listen: '127.0.0.1:1', selector: a=file}\n",
        );
        let mut given = flags(&config);
        given.no_cache = false;
        let vars = env(&[
            ("PODSTAMP_CACHE_DIR", "/env-cache"),
            ("PODSTAMP_MANIFEST_DIR", "/env-manifests"),
            ("PODSTAMP_SELECTOR", "a=env"),
        ]);
        let run = daemon(&given, &vars).unwrap();
        assert_eq!(run.cache_dir, Some(PathBuf::from("/env-cache")));
        assert_eq!(run.manifest_dir, PathBuf::from("/env-manifests"));
        assert_eq!(run.selector, "a=env");
        assert_eq!(run.listen.to_string(), "127.0.0.1:1");
        given.cache_dir = Some("/flag-cache".into());
        given.listen = Some("127.0.0.1:2".into());
        let run = daemon(&given, &vars).unwrap();
        assert_eq!(run.cache_dir, Some(PathBuf::from("/flag-cache")));
        assert_eq!(run.listen.to_string(), "127.0.0.1:2");
        let run = daemon(&given, &env(&[])).unwrap();
        assert_eq!(run.manifest_dir, dir.path().join("file-manifests"));
        given.no_cache = true;
        assert_eq!(daemon(&given, &vars).unwrap().cache_dir, None);
    }

    /// A bad value names the layer it came from.
    #[test]
    fn a_bad_value_names_where_it_was_given() {
        let dir = tempfile::tempdir().unwrap();
        let config = file(
            dir.path(),
            "namespace: Bad_NS\nlimits: {maxManifestSize: lots}\n",
        );
        let e = daemon(&flags(&config), &env(&[])).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: ", config.display())), "{e}");
        assert!(e.contains(": namespace: "), "{e}");
        let e = daemon(&flags(&config), &env(&[("PODSTAMP_NAMESPACE", "ok")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(": limits.maxManifestSize: \"lots\""), "{e}");
        let e = daemon(
            &flags(&config),
            &env(&[
                ("PODSTAMP_NAMESPACE", "ok"),
                ("PODSTAMP_MAX_MANIFEST_SIZE", "x"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("PODSTAMP_MAX_MANIFEST_SIZE: \"x\""), "{e}");
        let mut given = flags(&config);
        given.node_name = None;
        assert!(matches!(
            daemon(&given, &env(&[("NODE_NAME", "")])),
            Err(SettingsError::NoNodeName)
        ));
    }

    /// The rollout Leases default to a namespace of their own; a namespace
    /// where the control plane keeps Leases is refused, in one line naming
    /// the setting and the way out, unless explicitly allowed.
    #[test]
    fn rollout_leases_stay_out_of_the_control_planes_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        let empty = file(dir.path(), "{}\n");
        let run = daemon(&flags(&empty), &env(&[])).unwrap();
        assert_eq!(run.rollout_namespace, "podstamp-rollouts");
        assert!(!run.allow_control_plane_namespace);
        for ns in CONTROL_PLANE_NAMESPACES {
            let mut given = flags(&empty);
            given.rollout_namespace = Some(ns.into());
            let e = daemon(&given, &env(&[])).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--rollout-namespace \"{ns}\": ")),
                "{e}"
            );
            assert!(e.contains("--allow-control-plane-namespace"), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
            given.allow_control_plane_namespace = Some(true);
            assert_eq!(daemon(&given, &env(&[])).unwrap().rollout_namespace, ns);
        }
        let e = daemon(
            &flags(&empty),
            &env(&[("PODSTAMP_ROLLOUT_NAMESPACE", "kube-system")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("PODSTAMP_ROLLOUT_NAMESPACE"), "{e}");
        // `file` writes the same path: the file now says it.
        let allowed = file(
            dir.path(),
            "daemon: {rollouts: {namespace: kube-system, allowControlPlaneNamespace: true}}\n",
        );
        let run = daemon(&flags(&allowed), &env(&[])).unwrap();
        assert!(run.allow_control_plane_namespace);
    }

    /// The status records' namespace: the rollout namespace's name and
    /// `-status` unless named (flag, environment, file, low to high as
    /// every setting), held to the same rules, and a derived name too long
    /// for a namespace is said with the way out.
    #[test]
    fn the_status_namespace_follows_the_rollout_one_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = file(dir.path(), "{}\n");
        let run = daemon(&flags(&empty), &env(&[])).unwrap();
        assert_eq!(run.status_namespace, "podstamp-rollouts-status");
        let mut given = flags(&empty);
        given.rollout_namespace = Some("fleet".into());
        assert_eq!(
            daemon(&given, &env(&[])).unwrap().status_namespace,
            "fleet-status"
        );
        let named = daemon(&given, &env(&[("PODSTAMP_STATUS_NAMESPACE", "records")])).unwrap();
        assert_eq!(
            (
                named.rollout_namespace.as_str(),
                named.status_namespace.as_str()
            ),
            ("fleet", "records")
        );
        given.status_namespace = Some("kube-system".into());
        let e = daemon(&given, &env(&[])).unwrap_err().to_string();
        assert!(e.starts_with("--status-namespace \"kube-system\": "), "{e}");
        assert!(e.contains("--allow-control-plane-namespace"), "{e}");
        given.status_namespace = Some("Not_A_Label".into());
        let e = daemon(&given, &env(&[])).unwrap_err().to_string();
        assert!(e.starts_with("--status-namespace"), "{e}");
        let mut long = flags(&empty);
        long.rollout_namespace = Some("r".repeat(60));
        let e = daemon(&long, &env(&[])).unwrap_err().to_string();
        assert!(
            e.contains("name one with --status-namespace (daemon.rollouts.statusNamespace)"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let file_named = file(
            dir.path(),
            "daemon: {rollouts: {statusNamespace: from-file}}\n",
        );
        assert_eq!(
            daemon(&flags(&file_named), &env(&[]))
                .unwrap()
                .status_namespace,
            "from-file"
        );
    }

    /// The longest lease duration is the one deploy/node-identity.yaml
    /// lets a node write: the daemon cannot be configured into writes the
    /// policy refuses.
    #[test]
    fn the_lease_duration_is_bounded_as_the_admission_policy_bounds_it() {
        let policy = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/node-identity.yaml"),
        )
        .unwrap();
        let limit = MAX_SLOT_LEASE_DURATION.as_secs();
        assert!(
            policy.contains(&format!("expression: variables.duration <= {limit}\n")),
            "deploy/node-identity.yaml bounds leaseDurationSeconds otherwise than {limit}"
        );
        let dir = tempfile::tempdir().unwrap();
        let empty = file(dir.path(), "{}\n");
        let mut given = flags(&empty);
        given.slot_lease_duration = Some("5m".into());
        assert_eq!(
            daemon(&given, &env(&[])).unwrap().slot_lease_duration,
            MAX_SLOT_LEASE_DURATION
        );
        given.slot_lease_duration = Some("301s".into());
        let e = daemon(&given, &env(&[])).unwrap_err().to_string();
        assert!(
            e.starts_with("--slot-lease-duration \"301s\": must be at most 5m"),
            "{e}"
        );
    }
}
