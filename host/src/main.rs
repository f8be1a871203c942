//! The `podstamp` command line.
//!
//! Exit codes: 0 success; 1 the render failed (the template, a plugin or the
//! rendered pod is wrong); 2 usage error (the command line, configuration,
//! settings or node description is wrong); 3 (`podstamp render`) the
//! template is not for this node: its `podstamp.io/node-selector` does not
//! select the node's labels, and nothing is printed or written. Every error
//! is one line on stderr.
//! `podstamp run`: 2 when it cannot start (a usage or configuration error,
//! or what it needs is unusable), 0 after SIGTERM or SIGINT, 70 when its
//! reconciler panicked (better restarted by the kubelet than alive and
//! doing nothing).
//!
//! The flags are the top layer of the settings; [`podstamp::settings`]
//! resolves them with the environment, the configuration file and the
//! defaults.

mod cli;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use cli::{completion, examples, oci, plugin_new, render, run, status, test};

use podstamp::catalog::gzip;
use podstamp::config;
use podstamp::plugin::{Limits, Runtime, WIT_PACKAGE};
use podstamp::settings::Layer;

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
    #[command(after_help = examples::RENDER)]
    Render(render::RenderArgs),
    /// Run the node daemon: keep this node's static pod manifests in step with its PodTemplates.
    #[command(after_help = examples::RUN)]
    Run(run::RunArgs),
    /// Work with plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Run golden test cases: render each case's template for its node through its chain and compare with its expected manifest or error.
    #[command(after_help = examples::TEST)]
    Test(test::TestArgs),
    /// Show how each template's update rolls across the nodes, as their daemons report it.
    #[command(after_help = examples::STATUS)]
    Status(status::StatusArgs),
    /// Print the shell completion script for bash, zsh or fish.
    Completion(completion::CompletionArgs),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Create a plugin project, in Rust, Python or JavaScript, with a unit test, golden cases and its build script.
    New(plugin_new::NewArgs),
    /// Print a plugin's name, version, imports and exports, and whether it matches this podstamp's WIT.
    Inspect {
        /// The plugin component (.wasm).
        path: PathBuf,
    },
    /// Print a ConfigMap holding the plugin (gzip, pinned by sha256), for `kubectl apply --server-side -f -`, and the catalog entry that uses it.
    Configmap(ConfigMapArgs),
    /// Push a plugin to an OCI registry as a Wasm artifact; prints REF@sha256:DIGEST.
    Push(oci::PushArgs),
    /// Pull a plugin from an OCI registry by digest, checked against it.
    Pull(oci::PullArgs),
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

/// A failure, and which exit code it earns.
enum Failure {
    Usage(String),
    Render(String),
    /// The template's node selector does not select the node (exit 3).
    NotForNode(String),
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
    let cli = parse();
    init_logging(cli.log_format, &cli.log_level);
    let result = match cli.command {
        Command::Render(args) => render::run_render(args),
        Command::Plugin(PluginCommand::New(args)) => plugin_new::run(args),
        Command::Plugin(PluginCommand::Inspect { path }) => run_inspect(&path),
        Command::Plugin(PluginCommand::Configmap(args)) => run_configmap(&args),
        Command::Plugin(PluginCommand::Push(args)) => oci::push(args).map_err(Failure::from),
        Command::Plugin(PluginCommand::Pull(args)) => oci::pull(args).map_err(Failure::from),
        Command::Test(args) => test::run(args),
        Command::Run(args) => return run_daemon(&args),
        Command::Completion(args) => {
            let script = completion::script(&args, &mut Cli::command());
            match std::io::stdout().write_all(&script) {
                Ok(()) => Ok(()),
                // Whoever reads it stopped reading: nothing to say.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(e) => Err(Failure::Render(format!(
                    "cannot write the completion script: {e}"
                ))),
            }
        }
        Command::Status(args) => {
            return match status::run(args) {
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
                Failure::NotForNode(m) => (3, m),
            };
            // One line per error, whatever a library put in its message.
            eprintln!("podstamp: error: {}", message.replace('\n', " "));
            ExitCode::from(code)
        }
    }
}

/// The command line. Run as `kubectl-podstamp` (kubectl's plugin, as
/// `kubectl podstamp …` runs it), the same commands, with usage and help
/// saying `kubectl podstamp`.
fn parse() -> Cli {
    let name = completion::bin_name(std::env::args_os().next().as_deref());
    let matches = Cli::command().bin_name(name).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `podstamp run`: the settings resolved, then the daemon until it stops.
fn run_daemon(args: &run::RunArgs) -> ExitCode {
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
    // rustls' platform verifier logs every certificate it refuses at error
    // level; the refusal reaches the user once, in podstamp's own line.
    if !filter.contains("rustls_platform_verifier")
        && let Ok(directive) = "rustls_platform_verifier=off".parse()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example of `--help` that runs podstamp parses: its flags and
    /// arguments are the command line's.
    #[test]
    fn the_help_examples_are_commands_podstamp_takes() {
        let mut parsed = 0;
        for text in [
            examples::RENDER,
            examples::RUN,
            examples::STATUS,
            examples::TEST,
        ] {
            assert!(text.starts_with("Examples:\n"), "{text}");
            for line in text.lines().map(str::trim) {
                // The podstamp part of a pipeline; kubectl's plugin name.
                let line = line.rsplit("| ").next().unwrap();
                let line = line.replace("kubectl podstamp ", "podstamp ");
                if !line.starts_with("podstamp ") {
                    continue;
                }
                let words: Vec<&str> = line.split_whitespace().collect();
                if let Err(e) = Cli::try_parse_from(&words) {
                    panic!("the example `{line}` does not parse: {e}");
                }
                parsed += 1;
            }
        }
        assert!(parsed >= 12, "{parsed}");
    }

    /// The examples are in the help of their command.
    #[test]
    fn each_command_shows_its_examples() {
        let mut command = Cli::command();
        for (name, text) in [
            ("render", examples::RENDER),
            ("run", examples::RUN),
            ("status", examples::STATUS),
            ("test", examples::TEST),
        ] {
            let help = command
                .find_subcommand_mut(name)
                .unwrap()
                .render_help()
                .to_string();
            assert!(help.trim_end().ends_with(text), "{name}: {help}");
        }
    }

    /// Run as kubectl's plugin, the usage says `kubectl podstamp`.
    #[test]
    fn the_kubectl_plugin_name_shows_in_usage() {
        use std::ffi::OsStr;
        assert_eq!(
            completion::bin_name(Some(OsStr::new("/usr/local/bin/kubectl-podstamp"))),
            "kubectl podstamp"
        );
        assert_eq!(
            completion::bin_name(Some(OsStr::new("podstamp"))),
            "podstamp"
        );
        assert_eq!(completion::bin_name(None), "podstamp");
    }
}
