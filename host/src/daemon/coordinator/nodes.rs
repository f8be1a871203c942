//! How many nodes a template is for: the count a share of them
//! (`podstamp.io/max-unavailable: 10%`) is taken of, asked by the rollout
//! machine once per target a node waits for ([`super::Ask::Count`]).
//!
//! Every node counts for itself, without a controller. Every node: one
//! list of one object — the count is that object plus the API's
//! `remainingItemCount` — so a count costs the same at 5 or 5,000 nodes. A
//! label selector: the API leaves `remainingItemCount` unset for a
//! selected list, so the nodes it selects are listed as metadata only, in
//! pages of [`PAGE`]: a cost in the count of selected nodes, once per node
//! per rollout (docs/daemon.md gives the arithmetic).
//!
//! Invariants: a count never takes longer than [`CALL_TIMEOUT`] a call, and
//! one that fails is None (the share stays of the last count, or of one
//! node: never more nodes at once than asked).

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use super::CALL_TIMEOUT;

/// Nodes a page of a selected list: the API server's default page size for
/// kubectl, small enough that a page of node metadata stays well under a
/// MiB.
const PAGE: u32 = 500;

/// The most pages one count reads: 50,000 nodes, beyond any cluster
/// Kubernetes supports; a bound on a list that would not end.
const MAX_PAGES: u32 = 100;

/// How many nodes `selector` selects (empty: every node).
pub(super) async fn count(client: kube::Client, selector: &str) -> Result<u32, String> {
    let api: Api<Node> = Api::all(client);
    let mut params = ListParams::default().limit(if selector.is_empty() { 1 } else { PAGE });
    if !selector.is_empty() {
        params = params.labels(selector);
    }
    let mut counted: u64 = 0;
    for _ in 0..MAX_PAGES {
        let page = tokio::time::timeout(CALL_TIMEOUT, api.list_metadata(&params))
            .await
            .map_err(|_| format!("no answer within {CALL_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        counted += page.items.len() as u64;
        let next = page.metadata.continue_.filter(|c| !c.is_empty());
        match (page.metadata.remaining_item_count, next) {
            (_, None) => return Ok(counted.min(u64::from(u32::MAX)) as u32),
            // Known without reading further (every node, from etcd).
            (Some(remaining), Some(_)) if remaining >= 0 => {
                return Ok((counted + remaining as u64).min(u64::from(u32::MAX)) as u32);
            }
            (_, Some(token)) => {
                params = params.continue_token(&token).limit(PAGE);
            }
        }
    }
    Err(format!(
        "more than {} nodes listed for {selector:?}",
        u64::from(PAGE) * u64::from(MAX_PAGES)
    ))
}
