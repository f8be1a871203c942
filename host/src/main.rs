//! The `podstamp` command line.
//!
//! Exit codes: 0 success; 1 the render failed (the template, a plugin or the
//! rendered pod is wrong); 2 usage error (the command line, configuration,
//! settings or node description is wrong). Every error is one line on stderr.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use podstamp::chain::Step;
use podstamp::config::{self, Catalog, CatalogError, ConfigFile};
use podstamp::node::{NodeAddress, NodeContext};
use podstamp::plugin::{Limits, Runtime, WIT_PACKAGE};
use podstamp::render::{check_size, render};
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
    Run(podstamp::daemon::RunArgs),
    /// Work with plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Print a plugin's name, version, imports and exports, and whether it matches this podstamp's WIT.
    Inspect {
        /// The plugin component (.wasm).
        path: PathBuf,
    },
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
    /// Namespace written into the manifest [default: the config's, else kube-system].
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
    /// Where compiled plugin code is cached [default: $PODSTAMP_CACHE_DIR, else $XDG_CACHE_HOME/podstamp, else ~/.cache/podstamp].
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log_level);
    let result = match cli.command {
        Command::Render(args) => run_render(args),
        Command::Plugin(PluginCommand::Inspect { path }) => run_inspect(&path),
        Command::Run(args) => return podstamp::daemon::main(args),
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
    let config = match &args.config {
        Some(path) => ConfigFile::read(path).map_err(|e| usage(e.to_string()))?,
        None => ConfigFile::default(),
    };
    let mut limits = config.sandbox_limits().map_err(|e| usage(e.to_string()))?;
    if let Some(t) = &args.timeout {
        limits.timeout = config::parse_duration(t).map_err(|e| usage(format!("--timeout: {e}")))?;
    }
    if let Some(m) = &args.memory {
        limits.memory_bytes = config::parse_size(m).map_err(|e| usage(format!("--memory: {e}")))?;
    }
    let namespace = args
        .namespace
        .clone()
        .or_else(|| config.namespace.clone())
        .unwrap_or_else(|| config::DEFAULT_NAMESPACE.to_string());
    podstamp::validate::check_dns_label(&namespace)
        .map_err(|e| usage(format!("namespace: {e}")))?;
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

    let cache_dir = podstamp::plugin::choose_cache_dir(
        args.no_cache,
        args.cache_dir.as_deref(),
        config.cache_dir.as_deref(),
    );
    let max_manifest = limits.max_output_bytes;
    let catalog = load_catalog(&args, &config, limits, cache_dir.as_deref())?;
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

fn load_catalog(
    args: &RenderArgs,
    config: &ConfigFile,
    limits: Limits,
    cache_dir: Option<&Path>,
) -> Result<Catalog, Failure> {
    if args.plugin.is_empty() && args.config.is_none() {
        return Ok(Catalog::from_steps(Vec::new()));
    }
    let runtime = Runtime::new(limits, cache_dir).map_err(|e| Failure::Render(e.to_string()))?;
    if args.config.is_some() {
        return Catalog::load(config, &runtime).map_err(|e| match e {
            CatalogError::Config(e) => Failure::Usage(e.to_string()),
            CatalogError::Plugin(e) => Failure::Render(e),
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
        (Some(path), _) => podstamp::node::read_node_file(path).map_err(usage)?,
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

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}
