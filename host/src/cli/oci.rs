//! `podstamp plugin push FILE REF` and `podstamp plugin pull REF [-o FILE]`:
//! plugins as OCI artifacts (the library side is [`podstamp::oci`]).
//!
//! Exit codes: 0 done; 1 the registry refused or failed, or what it served
//! failed its checks; 2 usage (a reference, a file, the credentials or the
//! CA cannot be used). Errors are one line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use podstamp::config::parse_duration;
use podstamp::oci::{Credentials, OciError, Pinned, Registry, RegistryOptions};
use podstamp::plugin::{Limits, Runtime};

/// How to reach the registry (shared by push and pull).
#[derive(Args)]
pub struct RegistryArgs {
    /// Credentials: a docker config JSON file (the `.dockerconfigjson` of a
    /// `kubernetes.io/dockerconfigjson` Secret) [env: PODSTAMP_REGISTRY_CONFIG].
    #[arg(long, value_name = "FILE", env = "PODSTAMP_REGISTRY_CONFIG")]
    registry_config: Option<PathBuf>,
    /// A PEM file of CA certificates to trust besides the system's [env: PODSTAMP_REGISTRY_CA].
    #[arg(long, value_name = "FILE", env = "PODSTAMP_REGISTRY_CA")]
    registry_ca: Option<PathBuf>,
    /// The most one push or pull may take, e.g. 30s.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    registry_timeout: String,
}

#[derive(Args)]
pub struct PushArgs {
    /// The plugin component (.wasm).
    path: PathBuf,
    /// Where to push it: REGISTRY/REPO[:TAG].
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Args)]
pub struct PullArgs {
    /// What to pull: REGISTRY/REPO@sha256:DIGEST (a tag alone is refused).
    reference: String,
    /// Where to write the component [default: standard output].
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

type Failure = (u8, String);

fn registry(args: &RegistryArgs) -> Result<Registry, Failure> {
    let timeout: Duration = parse_duration(&args.registry_timeout)
        .map_err(|e| (2, format!("--registry-timeout: {e}")))?;
    Ok(Registry::new(RegistryOptions {
        credentials: args
            .registry_config
            .clone()
            .map_or(Credentials::Anonymous, Credentials::File),
        ca: args.registry_ca.clone(),
        timeout,
        insecure_http: false,
    }))
}

fn failure(e: OciError) -> Failure {
    let code = match e {
        OciError::Reference(_) | OciError::Credentials(_) | OciError::Ca { .. } => 2,
        _ => 1,
    };
    (code, e.to_string())
}

/// Checks that the file is a component of this podstamp's WIT, pushes it,
/// and prints `REF@sha256:…`.
pub fn push(args: PushArgs) -> Result<(), Failure> {
    let bytes =
        std::fs::read(&args.path).map_err(|e| (2, format!("{}: {e}", args.path.display())))?;
    // Only plugins podstamp can load go out under its name.
    let runtime = Runtime::new(Limits::default(), None).map_err(|e| (1, e.to_string()))?;
    runtime
        .describe(&bytes)
        .map_err(|e| (2, format!("{}: {e}", args.path.display())))?;
    let pinned = registry(&args.registry)?
        .push(&bytes, &args.reference)
        .map_err(failure)?;
    println!("{pinned}");
    Ok(())
}

/// Pulls a pinned component, checks it, and writes it.
pub fn pull(args: PullArgs) -> Result<(), Failure> {
    let pinned = Pinned::parse(&args.reference).map_err(|e| (2, e.to_string()))?;
    let pulled = registry(&args.registry)?.pull(&pinned).map_err(failure)?;
    match &args.output {
        Some(path) => std::fs::write(path, &pulled.bytes)
            .map_err(|e| (2, format!("{}: {e}", path.display())))?,
        None => {
            use std::io::Write;
            std::io::stdout()
                .write_all(&pulled.bytes)
                .map_err(|e| (1, format!("standard output: {e}")))?;
        }
    }
    Ok(())
}
