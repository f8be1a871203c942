//! `podstamp render`: one template, one node, one chain, offline; and the
//! render itself ([`render_job`]), which `podstamp test` runs for each of
//! its cases, so that a case passes exactly when `render` prints its
//! expected manifest or error line.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use podstamp::catalog::{self, Catalog, CatalogError};
use podstamp::catalog::{
    ComponentError, ConfigMapError, ConfigMapSet, ConfigMaps, NoConfigMaps, PluginError,
    check_settings,
};
use podstamp::chain::{Step, StepChanges};
use podstamp::config::ConfigFile;
use podstamp::node::{NodeAddress, NodeContext};
use podstamp::plugin::{Limits, Runtime};
use podstamp::render::{RenderError, Stage, check_size, render_explained, render_unverified};
use podstamp::scope::Scope;
use podstamp::security_level::{self, Held};
use podstamp::settings::Layer;
use podstamp::template::{Template, parse_document};

use crate::Failure;

#[derive(Args)]
pub(crate) struct RenderArgs {
    /// The PodTemplate, YAML or JSON; `-` for stdin.
    #[arg(default_value = "-")]
    template: String,
    /// A Node object (YAML or JSON) to render for; the --node-* flags override its fields.
    #[arg(long, value_name = "FILE")]
    node: Option<PathBuf>,
    /// The node's name.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// A node label (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    node_label: Vec<String>,
    /// A node annotation (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    node_annotation: Vec<String>,
    /// A node address, e.g. InternalIP=10.0.0.5 (repeatable).
    #[arg(long, value_name = "TYPE=ADDRESS")]
    node_address: Vec<String>,
    /// The node's architecture (Go naming: amd64, arm64...); default: the Node's, else this machine's.
    #[arg(long, value_name = "ARCH")]
    node_arch: Option<String>,
    /// The node's operating system; default: the Node's, else this machine's.
    #[arg(long, value_name = "OS")]
    node_os: Option<String>,
    /// The node's kubelet version, e.g. v1.34.2.
    #[arg(long, value_name = "VERSION")]
    kubelet_version: Option<String>,
    /// A configuration file (the daemon's format): plugin catalog, chain, limits.
    #[arg(long, short, value_name = "FILE", conflicts_with = "plugin")]
    config: Option<PathBuf>,
    /// A plugin to run, in order (repeatable): PATH or PATH,settings=FILE.
    #[arg(long, value_name = "PATH[,settings=FILE]")]
    plugin: Vec<String>,
    /// A ConfigMap (YAML or JSON; repeatable) holding a plugin or the catalog
    /// that --config names, as the daemon would read it from its namespace.
    #[arg(long, value_name = "FILE", requires = "config")]
    configmap: Vec<PathBuf>,
    /// Namespace written into the manifest [env: PODSTAMP_NAMESPACE] [default: the config's, else kube-system].
    #[arg(long)]
    namespace: Option<String>,
    /// Write the manifest to this file (atomically) instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Time limit per plugin call, e.g. 100ms [default: the config's, else 100ms].
    #[arg(long)]
    timeout: Option<String>,
    /// Memory limit per plugin instance, e.g. 64Mi [default: the config's, else 64Mi].
    #[arg(long)]
    memory: Option<String>,
    /// The largest manifest, and pod a plugin may return, e.g. 1Mi [env: PODSTAMP_MAX_MANIFEST_SIZE] [default: the config's limits.maxManifestSize, else 1Mi].
    #[arg(long, value_name = "SIZE")]
    max_manifest_size: Option<String>,
    /// Where compiled plugin code is cached [env: PODSTAMP_CACHE_DIR] [default: the config's cacheDir, else $XDG_CACHE_HOME/podstamp, else ~/.cache/podstamp].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile plugins every time instead of using the cache.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// The Pod Security level the rendered pod is held to, LEVEL or LEVEL:VERSION (privileged, baseline, restricted; latest or v1.N); the template's podstamp.io/pod-security annotation may only make it stricter [env: PODSTAMP_POD_SECURITY] [default: the config's podSecurity, else baseline].
    #[arg(long, value_name = "LEVEL")]
    pod_security: Option<String>,
    /// Print on stderr, plugin by plugin, the fields each one changed
    /// (path: added, removed or changed), also when the render fails.
    #[arg(long)]
    explain: bool,
}

/// What one render is given, by the command line or by a test case.
pub(crate) struct Job<'a> {
    /// The settings' top layer: the flags, or a case's configuration file.
    pub flags: Layer,
    /// The environment's layer (a test case gives only what cannot change
    /// the manifest, such as the code cache).
    pub env: Layer,
    pub node: NodeContext,
    /// The template's text and where it came from, for messages.
    pub template: (&'a [u8], &'a str),
    /// `--plugin` specs (PATH or PATH,settings=FILE), when there is no configuration file.
    pub plugins: &'a [String],
    /// `--configmap` files.
    pub configmaps: &'a [PathBuf],
    /// Where to add what each plugin changed ([`explain_lines`]), as far
    /// as the chain ran.
    pub explain: Option<&'a mut Vec<String>>,
}

/// A rendered manifest, and the warnings to print with it.
pub(crate) struct Output {
    pub bytes: Vec<u8>,
    pub warnings: Vec<String>,
    /// The Pod Security level the pod was checked against.
    pub pod_security: Held,
}

pub(crate) fn run_render(args: RenderArgs) -> Result<(), Failure> {
    let usage = Failure::Usage;
    let flags = Layer {
        config: args.config.clone(),
        namespace: args.namespace.clone(),
        timeout: args.timeout.clone(),
        memory: args.memory.clone(),
        max_manifest_size: args.max_manifest_size.clone(),
        cache_dir: args.cache_dir.clone(),
        no_cache: args.no_cache,
        pod_security: args.pod_security.clone(),
        ..Layer::default()
    };
    let node = node_context(&args)?;
    let (template_text, origin) = read_input(&args.template).map_err(usage)?;
    let mut explain = Vec::new();
    let output = render_job(Job {
        flags,
        env: Layer::from_process_env(),
        node,
        template: (&template_text, &origin),
        plugins: &args.plugin,
        configmaps: &args.configmap,
        explain: args.explain.then_some(&mut explain),
    });
    // Before the error line, so that the line stays last.
    for line in &explain {
        eprintln!("{line}");
    }
    let output = output?;
    for warning in &output.warnings {
        eprintln!("podstamp: warning: {warning}");
    }
    // Static pods bypass Pod Security Admission: say which level this one
    // met, so that the author knows what was checked.
    eprintln!(
        "podstamp: checked against Pod Security level {}",
        output.pod_security
    );
    let manifest = output.bytes;

    match &args.output {
        Some(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| usage(format!("--output {}: not a file name", path.display())))?;
            podstamp::write::write_atomic(dir, name, &manifest)
                .map_err(|e| Failure::Render(format!("{}: {e}", path.display())))?;
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(&manifest)
                .and_then(|()| stdout.flush())
                .map_err(|e| Failure::Render(format!("stdout: {e}")))?;
        }
    }
    Ok(())
}

/// One render: settings, template, catalog, chain, manifest.
pub(crate) fn render_job(job: Job<'_>) -> Result<Output, Failure> {
    let usage = Failure::Usage;
    let podstamp::settings::RenderSettings {
        config,
        namespace,
        limits,
        cache_dir,
        registry,
        pod_security,
    } = podstamp::settings::render(&job.flags, &job.env).map_err(|e| usage(e.to_string()))?;
    let (template_text, origin) = job.template;
    let template = parse_document(template_text, origin)
        .map_err(|e| Failure::Render(e.to_string()))
        .and_then(|value| {
            Template::from_value(&value).map_err(|e| Failure::Render(format!("{origin}: {e}")))
        })?;
    let warnings = template.ignored(&namespace).into_iter().collect();
    // As the daemon: a template not for this node renders nothing here.
    let selector = podstamp::selector::from_annotations(&template.annotations)
        .map_err(|e| Failure::Render(format!("PodTemplate {}: {e}", template.id())))?;
    if let Some(selector) = selector
        && !selector.matches(&job.node.labels)
    {
        return Err(Failure::NotForNode(format!(
            "PodTemplate {} is not for node {}: its {} {:?} does not select the node's labels; nothing is rendered (exit code 3). Give the node's labels with --node or --node-label",
            template.id(),
            job.node.name,
            podstamp::selector::NODE_SELECTOR_ANNOTATION,
            template.annotations[podstamp::selector::NODE_SELECTOR_ANNOTATION],
        )));
    }

    let max_manifest = limits.max_output_bytes;
    // Without --configmap, a ConfigMap source says where it would come from.
    let config_maps: Box<dyn ConfigMaps> = if job.configmaps.is_empty() {
        Box::new(NoConfigMaps {
            namespace: namespace.clone(),
        })
    } else {
        Box::new(read_config_maps(job.configmaps, &namespace)?)
    };
    let catalog = load_catalog(
        job.plugins,
        job.flags.config.is_some(),
        &config,
        &*config_maps,
        limits,
        cache_dir.as_deref(),
        registry,
    )?;
    let chain = catalog
        .chain_for(&template.annotations)
        .map_err(|e| Failure::Render(format!("PodTemplate {}: {e}", template.id())))?;
    // Offline, no Namespace is read: the configured level, then the
    // template's annotation (which may only make it stricter).
    let held = security_level::resolve(&pod_security, None, &template.id(), &template.annotations)
        .map_err(|e| {
            Failure::Render(
                RenderError {
                    template: template.id(),
                    stage: Stage::Level(e),
                }
                .to_string(),
            )
        })?;
    // What each plugin changed is worked out only when asked for.
    let mut changes = Vec::new();
    let manifest = check_size(&template, max_manifest)
        .and_then(|()| match job.explain {
            Some(_) => render_explained(&template, &job.node, &chain, &namespace, &mut changes),
            None => render_unverified(&template, &job.node, &chain, &namespace, &mut |_, _, _| {}),
        })
        .and_then(|rendered| rendered.held_to(held.clone()).verify());
    if let Some(explain) = job.explain {
        explain.extend(explain_lines(&changes));
    }
    let manifest = manifest.map_err(|e| Failure::Render(e.to_string()))?;
    // The plugins' output limit alone would let a template without plugins through.
    if manifest.bytes.len() > max_manifest {
        return Err(Failure::Render(format!(
            "PodTemplate {}: the manifest is {} bytes, over the limit of {max_manifest} (limits.maxManifestSize)",
            template.id(),
            manifest.bytes.len()
        )));
    }
    Ok(Output {
        bytes: manifest.bytes,
        warnings,
        pod_security: held,
    })
}

/// What each plugin changed, a few lines per plugin:
/// `plugin 1 of 3 arch-image (arch-image 0.1.0): 1 change` then
/// `  spec.containers[0].image: changed`.
pub(crate) fn explain_lines(changes: &[StepChanges]) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, step) in changes.iter().enumerate() {
        let count = step.changes.len() + step.more;
        lines.push(format!(
            "plugin {} `{}` ({}): {}",
            i + 1,
            step.step,
            step.plugin,
            match count {
                0 => "no change".to_string(),
                1 => "1 change".to_string(),
                n => format!("{n} changes"),
            }
        ));
        if let Some(declared) = &step.declared {
            let list = |l: &[String]| {
                if l.is_empty() {
                    "nothing".to_string()
                } else {
                    l.join(", ")
                }
            };
            lines.push(format!(
                "  declares: {}; granted: {}",
                list(declared),
                step.granted
            ));
            if !step.not_granted.is_empty() {
                lines.push(format!(
                    "  declared, not granted: {}",
                    step.not_granted.join(", ")
                ));
            }
        }
        for change in &step.changes {
            lines.push(format!("  {change}"));
        }
        if step.more > 0 {
            lines.push(format!("  … and {} more", step.more));
        }
    }
    lines
}

/// The ConfigMaps given with --configmap: each file one ConfigMap, or a v1
/// List of them.
fn read_config_maps(files: &[PathBuf], namespace: &str) -> Result<ConfigMapSet, Failure> {
    let usage = Failure::Usage;
    let mut set = ConfigMapSet::new(namespace);
    for file in files {
        let origin = format!("--configmap {}", file.display());
        let bytes = std::fs::read(file).map_err(|e| usage(format!("{origin}: {e}")))?;
        let value = parse_document(&bytes, &origin).map_err(|e| usage(e.to_string()))?;
        let objects = match (
            value.get("kind").and_then(|k| k.as_str()),
            value.get("items"),
        ) {
            (Some("List"), Some(serde_json::Value::Array(items))) => items.clone(),
            _ => vec![value],
        };
        for object in objects {
            set.insert(object, &origin).map_err(usage)?;
        }
    }
    Ok(set)
}

fn load_catalog(
    plugin_specs: &[String],
    has_config: bool,
    config: &ConfigFile,
    config_maps: &dyn ConfigMaps,
    limits: Limits,
    cache_dir: Option<&Path>,
    registry: podstamp::oci::RegistryOptions,
) -> Result<Catalog, Failure> {
    if plugin_specs.is_empty() && !has_config {
        return Ok(Catalog::from_steps(Vec::new()));
    }
    let runtime = Runtime::new(limits, cache_dir)
        .map_err(|e| Failure::Render(e.to_string()))?
        .with_registry(podstamp::oci::Registry::new(registry));
    if has_config {
        return config
            .load_catalog_with(&runtime, config_maps, None)
            .map_err(|e| match e {
                e @ (CatalogError::Invalid(_)
                | CatalogError::Parse(_)
                | CatalogError::ConfigMap { .. }
                | CatalogError::SettingsFile { .. }) => Failure::Usage(e.to_string()),
                // No --configmap for a ConfigMap source: the command line lacks it.
                CatalogError::Plugin(
                    e @ PluginError {
                        source: ComponentError::ConfigMap(ConfigMapError::Unavailable { .. }),
                        ..
                    },
                ) => Failure::Usage(e.to_string()),
                // Settings are the configuration's: refusing them is a usage error.
                CatalogError::Plugin(e) if e.source.is_settings_refusal() => {
                    Failure::Usage(e.to_string())
                }
                CatalogError::Plugin(e) => Failure::Render(e.to_string()),
            });
    }
    let mut steps = Vec::new();
    for spec in plugin_specs {
        let (path, settings_file) = match spec.split_once(",settings=") {
            Some((path, file)) => (path, Some(file)),
            None => (spec.as_str(), None),
        };
        if path.contains(',') {
            return Err(Failure::Usage(format!(
                "--plugin {spec}: expected PATH or PATH,settings=FILE"
            )));
        }
        let settings = match settings_file {
            Some(file) => catalog::read_settings(Path::new(file))
                .map_err(|e| Failure::Usage(e.to_string()))?,
            None => serde_json::json!({}),
        };
        let plugin = runtime
            .load(Path::new(path))
            .map_err(|e| Failure::Render(e.to_string()))?;
        let name = plugin.info().name.clone();
        // A plugin tried out on the command line has no catalog entry to
        // grant it a scope: it may change anything (`--explain` shows
        // what), as nothing reaches a node but through a catalog.
        let step = Step::new(name, plugin, &settings).with_scope(Scope::unrestricted());
        // As a catalog's entries: bad settings are refused before rendering.
        if let Err(e) = check_settings(&step) {
            let message = format!("--plugin {spec}: {e}");
            return Err(if e.is_settings_refusal() {
                Failure::Usage(message)
            } else {
                Failure::Render(message)
            });
        }
        steps.push(step);
    }
    Ok(Catalog::from_steps(steps)
        .with_render_budget(catalog::default_render_budget(limits.timeout)))
}

pub(crate) fn read_input(name: &str) -> Result<(Vec<u8>, String), String> {
    if name == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| format!("stdin: {e}"))?;
        Ok((bytes, "<stdin>".to_string()))
    } else {
        let bytes = std::fs::read(name).map_err(|e| format!("{name}: {e}"))?;
        Ok((bytes, name.to_string()))
    }
}

fn key_value<'a>(flag: &str, text: &'a str) -> Result<(&'a str, &'a str), Failure> {
    text.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| Failure::Usage(format!("{flag} {text:?}: expected KEY=VALUE")))
}

fn node_context(args: &RenderArgs) -> Result<NodeContext, Failure> {
    let usage = Failure::Usage;
    let mut node = match (&args.node, &args.node_name) {
        (Some(path), _) => {
            podstamp::node::read_node_file(path).map_err(|e| usage(e.to_string()))?
        }
        (None, Some(name)) => NodeContext::named(name.clone()),
        (None, None) => {
            return Err(usage(
                "say which node to render for: --node FILE or --node-name NAME".into(),
            ));
        }
    };
    if let Some(name) = &args.node_name {
        node.name = name.clone();
    }
    for label in &args.node_label {
        let (k, v) = key_value("--node-label", label)?;
        node.labels.insert(k.to_string(), v.to_string());
    }
    for annotation in &args.node_annotation {
        let (k, v) = key_value("--node-annotation", annotation)?;
        node.annotations.insert(k.to_string(), v.to_string());
    }
    for address in &args.node_address {
        let (kind, address) = key_value("--node-address", address)?;
        node.addresses.push(NodeAddress {
            kind: kind.to_string(),
            address: address.to_string(),
        });
    }
    if let Some(arch) = &args.node_arch {
        node.architecture = arch.clone();
    }
    if let Some(os) = &args.node_os {
        node.operating_system = os.clone();
    }
    if let Some(version) = &args.kubelet_version {
        node.kubelet_version = Some(version.clone());
    }
    Ok(node)
}
