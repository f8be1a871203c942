//! `podstamp status`: the rollouts of a namespace's templates across nodes,
//! as the daemons report them (see `podstamp::fleet`). Read-only: it needs
//! `list` on Leases in the rollout namespace; and, to count only the nodes
//! a template with a `podstamp.io/node-selector` is for (and list those
//! that never reported it), `list` on Nodes and on the namespace's
//! PodTemplates (their metadata only, one LIST each). Without those it says
//! so on stderr and counts the nodes that reported.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PodTemplate};
use kube::Api;
use kube::api::ListParams;
use podstamp::daemon::raw::Raw;
use podstamp::fleet::{ROLE_LABEL, ROLE_STATUS, view};
use podstamp::selector::NODE_SELECTOR_ANNOTATION;

#[derive(Args)]
pub struct StatusArgs {
    /// One template's name; default: every template of the namespace.
    template: Option<String>,
    /// The namespace of the PodTemplates [default: kube-system].
    #[arg(long, short, env = "PODSTAMP_NAMESPACE")]
    namespace: Option<String>,
    /// The namespace of the rollout Leases, if the daemons use another one (daemon.rollouts.namespace): names the status records' namespace unless --status-namespace does [default: podstamp-rollouts].
    #[arg(long, env = "PODSTAMP_ROLLOUT_NAMESPACE", value_name = "NAMESPACE")]
    rollout_namespace: Option<String>,
    /// The namespace of the nodes' status records, if the daemons use another one (daemon.rollouts.statusNamespace) [default: the rollout namespace's name and -status].
    #[arg(long, env = "PODSTAMP_STATUS_NAMESPACE", value_name = "NAMESPACE")]
    status_namespace: Option<String>,
    /// A kubeconfig file [default: $KUBECONFIG, ~/.kube/config, else in-cluster credentials].
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Print again whenever the rollout changes, until interrupted.
    #[arg(long, short)]
    watch: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

/// How often `--watch` lists the records.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Exit codes: 0; 1 when the API server cannot be read; 2 for bad usage.
pub fn run(args: StatusArgs) -> Result<(), (u8, String)> {
    let namespace = args
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| podstamp::config::DEFAULT_NAMESPACE.to_string());
    podstamp::validate::check_dns_label(&namespace)
        .map_err(|e| (2, format!("--namespace: {e}")))?;
    let rollouts = args
        .rollout_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| podstamp::config::DEFAULT_ROLLOUT_NAMESPACE.to_string());
    podstamp::validate::check_dns_label(&rollouts)
        .map_err(|e| (2, format!("--rollout-namespace: {e}")))?;
    let leases_ns = match args.status_namespace.clone().filter(|n| !n.is_empty()) {
        Some(ns) => {
            podstamp::validate::check_dns_label(&ns)
                .map_err(|e| (2, format!("--status-namespace: {e}")))?;
            ns
        }
        None => {
            podstamp::config::derived_status_namespace(&rollouts).map_err(|e| (2, e.to_string()))?
        }
    };
    let only = args.template.as_ref().map(|t| format!("{namespace}/{t}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (1, format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        let client = podstamp::kube_client::client(args.kubeconfig.as_deref())
            .await
            .map_err(|e| (2, e.to_string()))?;
        let api: Api<Raw<Lease>> = Api::namespaced(client.clone(), &leases_ns);
        let params = ListParams::default().labels(&format!("{ROLE_LABEL}={ROLE_STATUS}"));
        let mut last = None;
        let mut warned = false;
        loop {
            let listed = api.list(&params).await.map_err(|e| {
                let why = match &e {
                    kube::Error::Api(s) if s.is_forbidden() => format!(
                        "{}; `podstamp status` needs list on leases (coordination.k8s.io) in namespace {leases_ns}",
                        s.message
                    ),
                    other => other.to_string(),
                };
                (1, format!("cannot list the nodes' status records (Leases) in namespace {leases_ns}: {why}"))
            })?;
            let values: Vec<serde_json::Value> =
                listed.items.iter().map(|l| l.value().clone()).collect();
            let targeting = match targeting(&client, &namespace).await {
                Ok(t) => Some(t),
                Err(why) => {
                    if !std::mem::replace(&mut warned, true) {
                        eprintln!("podstamp: warning: {why}; counting the nodes that reported, not the nodes each template's podstamp.io/node-selector selects");
                    }
                    None
                }
            };
            let view = view::targeted(&values, &namespace, only.as_deref(), targeting.as_ref());
            if let Some(one) = &only
                && view.templates.is_empty()
                && !args.watch
            {
                return Err((
                    1,
                    format!("no node has reported PodTemplate {one} (in the Leases of namespace {leases_ns})"),
                ));
            }
            let text = match args.output {
                Output::Table => view::table(&view),
                Output::Json => {
                    serde_json::to_string_pretty(&view).expect("plain data serializes") + "\n"
                }
                Output::Yaml => podstamp::yaml::to_yaml(
                    &serde_json::to_value(&view).expect("plain data serializes"),
                ),
            };
            if last.as_ref() != Some(&text) {
                if last.is_some() {
                    println!();
                }
                print!("{text}");
                last = Some(text);
            }
            if !args.watch {
                return Ok(());
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    })
}

/// Which nodes each template is for: every Node's labels and the node
/// selectors of the namespace's PodTemplates, their metadata only.
async fn targeting(client: &kube::Client, namespace: &str) -> Result<view::Targeting, String> {
    let why = |what: &str, e: kube::Error| match e {
        kube::Error::Api(s) if s.is_forbidden() => {
            format!(
                "cannot list {what}: {}; `podstamp status` needs list on {what}",
                s.message
            )
        }
        other => format!("cannot list {what}: {other}"),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = nodes
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| why("nodes", e))?;
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), namespace);
    let templates = templates
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| why(&format!("podtemplates in namespace {namespace}"), e))?;
    let selector = NODE_SELECTOR_ANNOTATION;
    Ok(view::Targeting {
        nodes: nodes
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
            .collect(),
        selectors: templates
            .items
            .into_iter()
            .filter_map(|t| {
                let text = t.metadata.annotations?.remove(selector)?;
                Some((format!("{namespace}/{}", t.metadata.name?), text))
            })
            .collect(),
    })
}
