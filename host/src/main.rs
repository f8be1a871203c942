//! The `podstamp` command line.
//!
//! Exit codes: 0 success; 1 the render failed (the template, a plugin or the
//! rendered pod is wrong); 2 usage error (the command line, configuration,
//! settings or node description is wrong). Every error is one line on stderr.
//! `podstamp run`: 2 when it cannot start (a usage or configuration error,
//! or what it needs is unusable), 0 after SIGTERM or SIGINT, 70 when its
//! reconciler panicked (better restarted by the kubelet than alive and
//! doing nothing).
//!
//! The flags are the top layer of the settings; [`podstamp::settings`]
//! resolves them with the environment, the configuration file and the
//! defaults.

mod run_args;

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod oci_command;
mod status_command;

use podstamp::catalog::{
    ComponentError, ConfigMapError, ConfigMapSet, ConfigMaps, NoConfigMaps, PluginError, gzip,
};
use podstamp::chain::Step;
use podstamp::config::{self, Catalog, CatalogError, ConfigFile};
use podstamp::node::{NodeAddress, NodeContext};
use podstamp::plugin::{Limits, Runtime, WIT_PACKAGE};
use podstamp::render::{check_size, render};
use podstamp::settings::Layer;
use podstamp::template::{Template, parse_document};

#[derive(Parser)]
#[command(
    name = "podstamp",
    version,
    about = "Renders Kubernetes static pod manifests from PodTemplates through WebAssembly plugins"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `podstamp=debug` (also RUST_LOG).
    #[arg(long, global = true, env = "RUST_LOG", default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Render one PodTemplate for one node, offline, and print the manifest.
    Render(RenderArgs),
    /// Run the node daemon: keep this node's static pod manifests in step with its PodTemplates.
    Run(run_args::RunArgs),
    /// Work with plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Show how each template's update rolls across the nodes, as their daemons report it.
    Status(status_command::StatusArgs),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Print a plugin's name, version, imports and exports, and whether it matches this podstamp's WIT.
    Inspect {
        /// The plugin component (.wasm).
        path: PathBuf,
    },
    /// Print a ConfigMap holding the plugin (gzip, pinned by sha256), for `kubectl apply --server-side -f -`, and the catalog entry that uses it.
    Configmap(ConfigMapArgs),
    /// Push a plugin to an OCI registry as a Wasm artifact; prints REF@sha256:DIGEST.
    Push(oci_command::PushArgs),
    /// Pull a plugin from an OCI registry by digest, checked against it.
    Pull(oci_command::PullArgs),
}

#[derive(Args)]
struct ConfigMapArgs {
    /// The plugin component (.wasm).
    path: PathBuf,
    /// The ConfigMap's name.
    #[arg(long)]
    name: String,
    /// The ConfigMap's namespace: the one the daemon serves.
    #[arg(long, default_value = config::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The binaryData key holding the component.
    #[arg(long, default_value = podstamp::catalog::DEFAULT_COMPONENT_KEY)]
    key: String,
    /// The plugin's name in the catalog [default: the name the plugin gives itself].
    #[arg(long, value_name = "PLUGIN_NAME")]
    plugin: Option<String>,
}

#[derive(Args)]
struct RenderArgs {
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
}

/// A failure, and which exit code it earns.
enum Failure {
    Usage(String),
    Render(String),
}

impl From<(u8, String)> for Failure {
    fn from((code, message): (u8, String)) -> Failure {
        if code == 2 {
            Failure::Usage(message)
        } else {
            Failure::Render(message)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log_level);
    let result = match cli.command {
        Command::Render(args) => run_render(args),
        Command::Plugin(PluginCommand::Inspect { path }) => run_inspect(&path),
        Command::Plugin(PluginCommand::Configmap(args)) => run_configmap(&args),
        Command::Plugin(PluginCommand::Push(args)) => {
            oci_command::push(args).map_err(Failure::from)
        }
        Command::Plugin(PluginCommand::Pull(args)) => {
            oci_command::pull(args).map_err(Failure::from)
        }
        Command::Run(args) => return run_daemon(&args),
        Command::Status(args) => {
            return match status_command::run(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err((code, message)) => {
                    eprintln!("podstamp: error: {}", message.replace('\n', " "));
                    ExitCode::from(code)
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let (code, message) = match failure {
                Failure::Usage(m) => (2, m),
                Failure::Render(m) => (1, m),
            };
            // One line per error, whatever a library put in its message.
            eprintln!("podstamp: error: {}", message.replace('\n', " "));
            ExitCode::from(code)
        }
    }
}

/// `podstamp run`: the settings resolved, then the daemon until it stops.
fn run_daemon(args: &run_args::RunArgs) -> ExitCode {
    let fail = |code: u8, message: &dyn std::fmt::Display| {
        eprintln!(
            "podstamp: error: {}",
            message.to_string().replace('\n', " ")
        );
        ExitCode::from(code)
    };
    let settings = match podstamp::settings::daemon(&args.layer(), &Layer::from_process_env()) {
        Ok(s) => s,
        Err(e) => return fail(2, &e),
    };
    match podstamp::daemon::run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ podstamp::daemon::DaemonError::ReconcilerPanicked) => fail(70, &e),
        Err(e) => fail(2, &e),
    }
}

fn init_logging(format: LogFormat, filter: &str) {
    let mut parsed = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // kube-client logs a whole response body (every object of a list, with
    // whatever the objects hold) at warn when it cannot decode it. Its HTTP
    // logs are kept to errors unless the filter asks for them by name.
    if !filter.contains("kube_client")
        && let Ok(directive) = "kube_client::client=error".parse()
    {
        parsed = parsed.add_directive(directive);
    }
    let filter = parsed;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run_render(args: RenderArgs) -> Result<(), Failure> {
    let usage = Failure::Usage;
    let flags = Layer {
        config: args.config.clone(),
        namespace: args.namespace.clone(),
        timeout: args.timeout.clone(),
        memory: args.memory.clone(),
        max_manifest_size: args.max_manifest_size.clone(),
        cache_dir: args.cache_dir.clone(),
        no_cache: args.no_cache,
        ..Layer::default()
    };
    let podstamp::settings::RenderSettings {
        config,
        namespace,
        limits,
        cache_dir,
    } = podstamp::settings::render(&flags, &Layer::from_process_env())
        .map_err(|e| usage(e.to_string()))?;
    let node = node_context(&args)?;

    let (template_text, origin) = read_input(&args.template).map_err(usage)?;
    let template = parse_document(&template_text, &origin)
        .map_err(|e| Failure::Render(e.to_string()))
        .and_then(|value| {
            Template::from_value(&value).map_err(|e| Failure::Render(format!("{origin}: {e}")))
        })?;
    if let Some(warning) = template.ignored(&namespace) {
        eprintln!("podstamp: warning: {warning}");
    }

    let max_manifest = limits.max_output_bytes;
    // Without --configmap, a ConfigMap source says where it would come from.
    let config_maps: Box<dyn ConfigMaps> = if args.configmap.is_empty() {
        Box::new(NoConfigMaps {
            namespace: namespace.clone(),
        })
    } else {
        Box::new(read_config_maps(&args.configmap, &namespace)?)
    };
    let catalog = load_catalog(&args, &config, &*config_maps, limits, cache_dir.as_deref())?;
    let chain = catalog
        .chain_for(&template.annotations)
        .map_err(|e| Failure::Render(format!("PodTemplate {}: {e}", template.id())))?;
    let manifest = check_size(&template, max_manifest)
        .and_then(|()| render(&template, &node, &chain, &namespace))
        .map_err(|e| Failure::Render(e.to_string()))?;
    // The plugins' output limit alone would let a template without plugins through.
    if manifest.bytes.len() > max_manifest {
        return Err(Failure::Render(format!(
            "PodTemplate {}: the manifest is {} bytes, over the limit of {max_manifest} (limits.maxManifestSize)",
            template.id(),
            manifest.bytes.len()
        )));
    }

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
            podstamp::write::write_atomic(dir, name, &manifest.bytes)
                .map_err(|e| Failure::Render(format!("{}: {e}", path.display())))?;
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(&manifest.bytes)
                .and_then(|()| stdout.flush())
                .map_err(|e| Failure::Render(format!("stdout: {e}")))?;
        }
    }
    Ok(())
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
    args: &RenderArgs,
    config: &ConfigFile,
    config_maps: &dyn ConfigMaps,
    limits: Limits,
    cache_dir: Option<&Path>,
) -> Result<Catalog, Failure> {
    if args.plugin.is_empty() && args.config.is_none() {
        return Ok(Catalog::from_steps(Vec::new()));
    }
    let runtime = Runtime::new(limits, cache_dir).map_err(|e| Failure::Render(e.to_string()))?;
    if args.config.is_some() {
        return Catalog::load_config(config, &runtime, config_maps, None).map_err(|e| match e {
            CatalogError::Config(e) => Failure::Usage(e.to_string()),
            // No --configmap for a ConfigMap source: the command line lacks it.
            CatalogError::Plugin(
                e @ PluginError {
                    source: ComponentError::ConfigMap(ConfigMapError::Unavailable { .. }),
                    ..
                },
            ) => Failure::Usage(e.to_string()),
            CatalogError::Plugin(e) => Failure::Render(e.to_string()),
        });
    }
    let mut steps = Vec::new();
    for spec in &args.plugin {
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
            Some(file) => {
                config::read_settings(Path::new(file)).map_err(|e| Failure::Usage(e.to_string()))?
            }
            None => serde_json::json!({}),
        };
        let plugin = runtime
            .load(Path::new(path))
            .map_err(|e| Failure::Render(e.to_string()))?;
        let name = plugin.info().name.clone();
        steps.push(Step::new(name, plugin, &settings));
    }
    Ok(
        Catalog::from_steps(steps)
            .with_render_budget(config::default_render_budget(limits.timeout)),
    )
}

fn read_input(name: &str) -> Result<(Vec<u8>, String), String> {
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

fn run_inspect(path: &Path) -> Result<(), Failure> {
    let runtime =
        Runtime::new(Limits::default(), None).map_err(|e| Failure::Render(e.to_string()))?;
    let bytes =
        std::fs::read(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    let interface = runtime
        .describe(&bytes)
        .map_err(|e| Failure::Render(format!("{}: {e}", path.display())))?;
    println!("file:    {}", path.display());
    println!("sha256:  {}", interface.sha256);
    println!("imports: {}", list_or_none(&interface.imports));
    println!("exports: {}", list_or_none(&interface.exports));
    let plugin = runtime
        .load_bytes(&bytes, &path.display().to_string())
        .map_err(|e| Failure::Render(e.to_string()))?;
    println!("plugin:  {}", plugin.info());
    println!("wit:     {WIT_PACKAGE} (matches this podstamp)");
    Ok(())
}

/// What a ConfigMap may hold: the values of its data and binaryData
/// together, in bytes (the API server's limit, as for a Secret; keys are not
/// counted).
const CONFIG_MAP_MAX_BYTES: usize = 1 << 20;

fn run_configmap(args: &ConfigMapArgs) -> Result<(), Failure> {
    let usage = Failure::Usage;
    podstamp::validate::check_dns_subdomain(&args.name)
        .map_err(|e| usage(format!("--name {:?}: {e}", args.name)))?;
    podstamp::validate::check_dns_label(&args.namespace)
        .map_err(|e| usage(format!("--namespace {:?}: {e}", args.namespace)))?;
    podstamp::catalog::check_config_map_key(&args.key).map_err(|e| usage(format!("--key: {e}")))?;
    let path = &args.path;
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| usage(format!("{origin}: {e}")))?;
    // The same check as `plugin inspect`: a component of this podstamp's WIT
    // that loads and says who it is.
    let runtime =
        Runtime::new(Limits::default(), None).map_err(|e| Failure::Render(e.to_string()))?;
    let interface = runtime
        .describe(&bytes)
        .map_err(|e| Failure::Render(format!("{origin}: {e}")))?;
    let plugin = runtime
        .load_bytes(&bytes, &origin)
        .map_err(|e| Failure::Render(e.to_string()))?;
    let entry = args
        .plugin
        .clone()
        .unwrap_or_else(|| plugin.info().name.clone());
    check_label_value(&entry).map_err(|e| {
        usage(format!(
            "{} {entry:?}: {e}; name the catalog entry with --plugin NAME",
            if args.plugin.is_some() {
                "--plugin"
            } else {
                "the plugin's own name"
            }
        ))
    })?;
    let compressed = gzip::compress(&bytes);
    if compressed.len() > CONFIG_MAP_MAX_BYTES {
        return Err(Failure::Render(format!(
            "{origin}: gzip-compressed, the component is {} bytes ({} uncompressed), over the {CONFIG_MAP_MAX_BYTES} bytes (1 MiB) a ConfigMap holds: make the plugin smaller (e.g. opt-level = \"s\", strip = true), or ship it by path on the node",
            compressed.len(),
            bytes.len()
        )));
    }
    let compressed_len = compressed.len();
    let encoded = match serde_json::to_value(k8s_openapi::ByteString(compressed)) {
        Ok(serde_json::Value::String(text)) => text,
        _ => return Err(Failure::Render("base64: cannot encode".into())),
    };
    let sha256 = &interface.sha256;
    let info = plugin.info().to_string().replace(['\n', '\r'], " ");
    let key_field = if args.key == podstamp::catalog::DEFAULT_COMPONENT_KEY {
        String::new()
    } else {
        format!(", key: \"{}\"", args.key)
    };
    // Hand-written so that the order reads well. Every string is quoted:
    // valid names such as `null`, `yes` or `1.0` are not strings to YAML.
    // None holds a quote or a backslash (checked above), nor does base64.
    let text = format!(
        "# podstamp plugin configmap: {info}, {} bytes, {} gzip-compressed\n\
         # Apply with `kubectl apply --server-side -f -` (client-side apply copies the\n\
         # object into an annotation, which is capped at 256 KiB), or `kubectl create -f -`.\n\
         apiVersion: v1\n\
         kind: ConfigMap\n\
         metadata:\n\
         \x20 name: \"{name}\"\n\
         \x20 namespace: \"{namespace}\"\n\
         \x20 labels:\n\
         \x20   app.kubernetes.io/part-of: podstamp\n\
         \x20   podstamp.io/plugin: \"{entry}\"\n\
         \x20 annotations:\n\
         \x20   podstamp.io/sha256: \"{sha256}\"\n\
         binaryData:\n\
         \x20 \"{key}\": {encoded}\n\
         # The catalog entry that uses it (under plugins: in the catalog):\n\
         #   \"{entry}\":\n\
         #     configMap: {{name: \"{name}\"{key_field}}}\n\
         #     sha256: {sha256}\n",
        bytes.len(),
        compressed_len,
        name = args.name,
        namespace = args.namespace,
        key = args.key,
    );
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::Render(format!("stdout: {e}")))
}

/// A Kubernetes label value: at most 63 characters, alphanumeric at both
/// ends, `-`, `_`, `.` between.
fn check_label_value(value: &str) -> Result<(), String> {
    let bytes = value.as_bytes();
    let ok = !value.is_empty()
        && value.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err("not a valid label value (at most 63 letters, digits, '-', '_', '.', alphanumeric at both ends)".into())
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}
