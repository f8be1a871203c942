//! The one list-then-watch loop behind every watch the daemon keeps on the
//! API server: the PodTemplates ([`super::source`]), this node's Node, its
//! mirror pods ([`super::mirror`]) and each ConfigMap a catalog names
//! ([`super::configmaps`]). It follows what kube-runtime's watcher does
//! (list, watch from the list's resourceVersion with bookmarks, resume a
//! dropped watch, list again on 410 Gone), with podstamp's decoding,
//! messages, metrics and backoff.
//!
//! Invariants:
//! * A watch starts from a complete list: [`Event::Listing`], one
//!   [`Event::Listed`] per object (pages of [`PAGE`]), [`Event::ListDone`].
//!   A list that fails midway is started over with a new `Listing`; a
//!   consumer replaces what it knows only at `ListDone`.
//! * The resourceVersion seen last (of the list, of an object, or of a
//!   bookmark) is where the next watch call starts: a watch that ends
//!   (renewed every `timeout`) or drops (an unreachable server, a reset
//!   connection, a non-410 error) resumes from it, and nothing is missed or
//!   listed again. After a failure, a resumed watch says so with
//!   [`Event::Resumed`] once the server has accepted it.
//! * Only three things start over with a list: 410 Gone or Expired (the
//!   server no longer has the history from that resourceVersion), an answer
//!   that cannot be decoded (an event may have been lost), and an object
//!   or list without a resourceVersion.
//! * After each failure the consumer hears of it ([`Event::Failed`]), the
//!   log says what failed and what happens next (a 401 or 403 naming what
//!   to fix, the API server's message naming the verb and resource), the
//!   restart is counted, and the next attempt waits for a [`Backoff`] with
//!   random jitter.
//! * Objects are received as [`Raw`] JSON, so no object's content can fail
//!   a list or stop a watch, and none is ever logged.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::{ObjectList, Status};
use kube::{Api, Resource};

use super::backoff::Backoff;
use super::metrics::Metrics;
use super::raw::Raw;

/// Objects per list page (client-go's and kube-rs's default).
pub const PAGE: u32 = 500;
/// kube-rs's watch call duration when none is set.
pub const DEFAULT_TIMEOUT: u32 = 290;
/// How long past its timeout a watch call may stay silent before its
/// connection is taken for dead and the watch renewed (kube-rs's margin).
const IDLE_MARGIN: Duration = Duration::from_secs(5);
/// The longest one list page may take. The API server gives up on a
/// request after 60 s (its handler timeout), and under load does not
/// always answer that it did: the fleet bench saw lists that got no
/// answer at all, and a watch that waits for one waits for good.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(70);

/// What is watched, and how it is named.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The watch in the log: `podtemplates`, `configmap NS/NAME`.
    pub label: String,
    /// The watch in the metrics' `watch` label.
    pub metric: &'static str,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// How long one watch call lasts, in seconds (None: [`DEFAULT_TIMEOUT`]).
    pub timeout: Option<u32>,
    /// Objects per list page: a page is read whole before any of it is
    /// used, so this times the largest object bounds a list's memory.
    pub page: u32,
    /// The longest one list page may take ([`LIST_TIMEOUT`]).
    pub list_timeout: Duration,
}

impl Spec {
    pub fn new(label: impl Into<String>, metric: &'static str, timeout: Option<u32>) -> Spec {
        Spec {
            label: label.into(),
            metric,
            label_selector: None,
            field_selector: None,
            timeout,
            page: PAGE,
            list_timeout: LIST_TIMEOUT,
        }
    }

    /// Gives up on a list page after `limit` (then lists again).
    pub fn list_timeout(mut self, limit: Duration) -> Spec {
        self.list_timeout = limit;
        self
    }

    /// Lists `objects` a page: for objects that others may make large.
    pub fn page(mut self, objects: u32) -> Spec {
        self.page = objects.max(1);
        self
    }

    pub fn labels(mut self, selector: &str) -> Spec {
        self.label_selector = Some(selector.to_string());
        self
    }

    pub fn fields(mut self, selector: &str) -> Spec {
        self.field_selector = Some(selector.to_string());
        self
    }

    fn list_params(&self) -> ListParams {
        ListParams {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            limit: Some(self.page),
            ..ListParams::default()
        }
    }

    fn watch_params(&self) -> WatchParams {
        WatchParams {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            timeout: self.timeout,
            bookmarks: true,
            ..WatchParams::default()
        }
    }

    /// How long a watch call may go without a line before it is renewed.
    fn idle(&self) -> Duration {
        Duration::from_secs(u64::from(self.timeout.unwrap_or(DEFAULT_TIMEOUT))) + IDLE_MARGIN
    }
}

/// What the loop tells its consumer.
pub enum Event<'a, K> {
    /// A complete list begins: the first, or after a 410 Gone.
    Listing,
    /// One object of the list.
    Listed(Raw<K>),
    /// The list is complete: what was known and not listed is gone.
    ListDone,
    /// An object was added or changed.
    Applied(Raw<K>),
    /// An object was deleted (or no longer matches the selectors).
    Deleted(Raw<K>),
    /// After a failure, the API server accepted the watch again from the
    /// last resourceVersion seen: what changed meanwhile follows, without
    /// a list.
    Resumed,
    /// The watch failed; it is tried again after a backoff.
    Failed(&'a WatchError),
}

/// Why a watch stopped, other than at the end of its call.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("list failed: {0}")]
    List(#[source] kube::Error),
    #[error("watch call failed: {0}")]
    Start(#[source] kube::Error),
    #[error("watch stream failed: {0}")]
    Stream(#[source] kube::Error),
    /// An ERROR event: the API server ended the watch.
    #[error("the API server ended the watch: {} {}: {}", .0.code, .0.reason, .0.message)]
    Ended(Box<Status>),
    #[error("no metadata.resourceVersion in the API server's answer")]
    NoResourceVersion,
    #[error("a list page got no answer within {0:?}")]
    ListTimedOut(Duration),
}

impl WatchError {
    /// The client error, unless the API server ended the watch itself.
    pub fn client(&self) -> Option<&kube::Error> {
        match self {
            WatchError::List(e) | WatchError::Start(e) | WatchError::Stream(e) => Some(e),
            WatchError::Ended(_) | WatchError::NoResourceVersion | WatchError::ListTimedOut(_) => {
                None
            }
        }
    }

    /// The API server's status, when it answered with one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            WatchError::Ended(status) => Some(status),
            _ => match self.client() {
                Some(kube::Error::Api(status)) => Some(status),
                _ => None,
            },
        }
    }

    /// 410: the history from the resourceVersion asked for is gone
    /// (compacted, or out of the watch cache), or a list's continue token
    /// expired.
    pub fn gone(&self) -> bool {
        self.status().is_some_and(|s| s.code == 410)
    }

    /// Whether the watch must start over with a list, rather than resume
    /// from the last resourceVersion seen.
    pub fn needs_list(&self) -> bool {
        self.gone()
            || matches!(
                self,
                WatchError::NoResourceVersion | WatchError::ListTimedOut(_)
            )
            || matches!(self.client(), Some(kube::Error::SerdeError(_)))
    }
}

/// Where a watch goes on from after `error`, having last seen `version`:
/// the same resourceVersion (resume), or None (list again).
pub fn recover(version: Option<String>, error: &WatchError) -> Option<String> {
    version.filter(|_| !error.needs_list())
}

/// The two calls the loop makes; an [`Api`] in the daemon, a script in
/// the tests.
pub trait ListWatch<K>: Send + Sync {
    fn list(
        &self,
        params: &ListParams,
    ) -> impl Future<Output = kube::Result<ObjectList<Raw<K>>>> + Send;
    fn watch(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> impl Future<Output = kube::Result<BoxStream<'static, kube::Result<WatchEvent<Raw<K>>>>>> + Send;
}

impl<K: Resource<DynamicType = ()> + 'static> ListWatch<K> for Api<Raw<K>> {
    async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<Raw<K>>> {
        Api::list(self, params).await
    }

    async fn watch(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<Raw<K>>>>> {
        Ok(Api::watch(self, params, version).await?.boxed())
    }
}

/// Why a step of the loop stopped.
enum Halt {
    /// The consumer is gone: the watch ends.
    Done,
    Failed(WatchError),
}

impl From<WatchError> for Halt {
    fn from(e: WatchError) -> Halt {
        Halt::Failed(e)
    }
}

/// Runs one watch until `consume` breaks.
pub async fn run<K, A, F>(api: A, spec: Spec, metrics: Arc<Metrics>, backoff: Backoff, consume: F)
where
    K: Resource<DynamicType = ()>,
    A: ListWatch<K>,
    F: FnMut(Event<'_, K>) -> ControlFlow<()> + Send,
{
    Loop {
        api,
        spec,
        metrics,
        backoff,
        consume,
        kind: std::marker::PhantomData,
    }
    .run()
    .await;
}

struct Loop<K, A, F> {
    api: A,
    spec: Spec,
    metrics: Arc<Metrics>,
    backoff: Backoff,
    consume: F,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K, A, F> Loop<K, A, F>
where
    K: Resource<DynamicType = ()>,
    A: ListWatch<K>,
    F: FnMut(Event<'_, K>) -> ControlFlow<()> + Send,
{
    fn emit(&mut self, event: Event<'_, K>) -> Result<(), Halt> {
        match (self.consume)(event) {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(()) => Err(Halt::Done),
        }
    }

    async fn run(mut self) {
        // The last resourceVersion seen; None: list first.
        let mut version: Option<String> = None;
        // A failure since the watch last ran: say so when it resumes.
        let mut failed = false;
        loop {
            let step = match &mut version {
                None => self.list().await.map(Some),
                Some(at) => self.watch(at, &mut failed).await.map(|()| None),
            };
            let error = match step {
                Ok(Some(listed)) => {
                    version = Some(listed);
                    // The list said all there is: nothing to resume.
                    failed = false;
                    continue;
                }
                // The call ended (its timeout): renewed from where it was.
                Ok(None) => continue,
                Err(Halt::Done) => return,
                Err(Halt::Failed(error)) => error,
            };
            version = recover(version, &error);
            failed = true;
            log(&self.spec.label, &error, version.is_some());
            self.metrics.watch_restart(self.spec.metric);
            if self.emit(Event::Failed(&error)).is_err() {
                return;
            }
            tokio::time::sleep(self.backoff.delay()).await;
        }
    }

    /// One complete list, page by page; its resourceVersion.
    async fn list(&mut self) -> Result<String, Halt> {
        self.metrics.watch_list(self.spec.metric);
        self.emit(Event::Listing)?;
        let mut params = self.spec.list_params();
        loop {
            let limit = self.spec.list_timeout;
            let page = tokio::time::timeout(limit, self.api.list(&params))
                .await
                .map_err(|_| WatchError::ListTimedOut(limit))?
                .map_err(WatchError::List)?;
            for object in page.items {
                self.emit(Event::Listed(object))?;
            }
            let token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                let version = page
                    .metadata
                    .resource_version
                    .filter(|v| !v.is_empty())
                    .ok_or(WatchError::NoResourceVersion)?;
                self.emit(Event::ListDone)?;
                return Ok(version);
            }
            params.continue_token = token;
        }
    }

    /// One watch call from `version`, which follows what it sees, until the
    /// call ends (Ok) or fails.
    async fn watch(&mut self, version: &mut String, failed: &mut bool) -> Result<(), Halt> {
        let params = self.spec.watch_params();
        let mut stream = self
            .api
            .watch(&params, version)
            .await
            .map_err(WatchError::Start)?;
        if std::mem::take(failed) {
            tracing::info!(watch = %self.spec.label, resource_version = %version,
                "watch resumed where it stopped; nothing is listed again");
            self.emit(Event::Resumed)?;
        }
        let idle = self.spec.idle();
        loop {
            let Ok(next) = tokio::time::timeout(idle, stream.next()).await else {
                tracing::debug!(watch = %self.spec.label, "no word from the watch for {idle:?}; renewing it");
                return Ok(());
            };
            let object_version = |object: &Raw<K>| {
                object
                    .meta()
                    .resource_version
                    .clone()
                    .filter(|v| !v.is_empty())
                    .ok_or(WatchError::NoResourceVersion)
            };
            match next {
                None => return Ok(()),
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    *version = object_version(&object)?;
                    self.emit(Event::Applied(object))?;
                }
                Some(Ok(WatchEvent::Deleted(object))) => {
                    *version = object_version(&object)?;
                    self.emit(Event::Deleted(object))?;
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    if !bookmark.metadata.resource_version.is_empty() {
                        *version = bookmark.metadata.resource_version;
                    }
                }
                Some(Ok(WatchEvent::Error(status))) => return Err(WatchError::Ended(status).into()),
                Some(Err(e)) => return Err(WatchError::Stream(e).into()),
            }
        }
    }
}

/// Logs a failed watch and what happens next; a 401 or 403 says what to
/// fix (the API server's message names the verb, the resource and the
/// namespace).
fn log(watch: &str, error: &WatchError, resumes: bool) {
    let next = if resumes {
        "resuming from the last resourceVersion seen"
    } else {
        "listing again"
    };
    if error.gone() {
        let message = error.status().map_or("", |s| s.message.as_str());
        tracing::warn!(
            watch,
            "watch history expired (410 Gone: {message}); listing again (manifests on disk are kept)"
        );
        return;
    }
    match (error, error.client()) {
        (_, Some(kube::Error::Api(status))) if status.code == 401 => tracing::error!(
            watch,
            "unauthorized: the API server does not accept podstamp's credentials ({}); check the bearer token or client certificate of the kubeconfig (--kubeconfig) or the ServiceAccount token",
            status.message
        ),
        (_, Some(kube::Error::Api(status))) if status.is_forbidden() => tracing::error!(
            watch,
            "permission denied: {}; grant it to podstamp's ServiceAccount (see deploy/rbac.yaml)",
            status.message
        ),
        // The API server answered, but not in a form podstamp can read. Not
        // an outage; the error never holds the response body.
        (_, Some(kube::Error::SerdeError(e))) => tracing::error!(
            watch,
            "cannot decode the API server's response ({e}); listing again (manifests on disk are kept)"
        ),
        (_, Some(kube::Error::Api(status))) => tracing::warn!(
            watch,
            "the API server refused the request ({} {}: {}); {next} (manifests on disk are kept)",
            status.code,
            status.reason,
            status.message
        ),
        (WatchError::Ended(_), _) => {
            tracing::warn!(watch, "{error}; {next} (manifests on disk are kept)");
        }
        (WatchError::NoResourceVersion, _) => {
            tracing::warn!(watch, "{error}; {next} (manifests on disk are kept)");
        }
        _ => tracing::warn!(
            watch,
            "watch failed, the API server may be unreachable (manifests on disk are kept): {error}; {next}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    type Line = kube::Result<WatchEvent<Raw<ConfigMap>>>;

    /// What the scripted API server answers, call after call.
    enum Answer {
        /// A list page: its objects' names, its resourceVersion, its
        /// continue token.
        Page(Vec<&'static str>, &'static str, Option<&'static str>),
        ListFails(kube::Error),
        /// A list that never gets an answer.
        ListHangs,
        /// A watch call accepted, whose stream sends these lines and ends.
        Stream(Vec<Line>),
        WatchFails(kube::Error),
    }

    /// The scripted API server. Once the script is over, a watch call
    /// sends the object `end`, at which the consumer stops.
    struct Script {
        answers: Mutex<VecDeque<Answer>>,
        /// `list` (with its continue token) and `watch@VERSION`, in order.
        calls: Mutex<Vec<String>>,
    }

    impl ListWatch<ConfigMap> for &Script {
        async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<Raw<ConfigMap>>> {
            assert_eq!(params.limit, Some(PAGE), "paged");
            assert_eq!(params.field_selector.as_deref(), Some("metadata.name=a"));
            self.calls
                .lock()
                .unwrap()
                .push(match &params.continue_token {
                    Some(token) => format!("list continue={token}"),
                    None => "list".to_string(),
                });
            let answer = self.answers.lock().unwrap().pop_front();
            match answer {
                Some(Answer::Page(names, version, token)) => {
                    let items: Vec<_> = names
                        .iter()
                        .map(|n| json!({"metadata": {"name": n, "resourceVersion": "1"}}))
                        .collect();
                    Ok(serde_json::from_value(json!({
                        "metadata": {"resourceVersion": version, "continue": token},
                        "items": items}))
                    .unwrap())
                }
                Some(Answer::ListFails(e)) => Err(e),
                Some(Answer::ListHangs) => futures::future::pending().await,
                _ => panic!("a list the script did not expect"),
            }
        }

        async fn watch(
            &self,
            params: &WatchParams,
            version: &str,
        ) -> kube::Result<BoxStream<'static, Line>> {
            assert!(params.bookmarks, "bookmarks asked for");
            assert_eq!(params.field_selector.as_deref(), Some("metadata.name=a"));
            self.calls.lock().unwrap().push(format!("watch@{version}"));
            match self.answers.lock().unwrap().pop_front() {
                Some(Answer::Stream(lines)) => Ok(futures::stream::iter(lines).boxed()),
                Some(Answer::WatchFails(e)) => Err(e),
                None => Ok(futures::stream::iter([added("end", "999")])
                    .chain(futures::stream::pending())
                    .boxed()),
                _ => panic!("a watch the script did not expect"),
            }
        }
    }

    fn raw(name: &str, version: &str) -> Raw<ConfigMap> {
        Raw::from_value(json!({"metadata": {"name": name, "resourceVersion": version}}))
    }

    fn added(name: &str, version: &str) -> Line {
        Ok(WatchEvent::Added(raw(name, version)))
    }

    fn deleted(name: &str, version: &str) -> Line {
        Ok(WatchEvent::Deleted(raw(name, version)))
    }

    fn bookmark(version: &str) -> Line {
        Ok(serde_json::from_value(json!({"type": "BOOKMARK",
            "object": {"kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"resourceVersion": version}}}))
        .unwrap())
    }

    fn status(code: u16, reason: &str) -> Box<Status> {
        serde_json::from_value::<Status>(json!({"status": "Failure", "code": code,
            "reason": reason, "message": format!("{reason} here")}))
        .unwrap()
        .boxed()
    }

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(status(code, reason))
    }

    /// A connection reset, refused or cut.
    fn cut() -> kube::Error {
        kube::Error::ReadEvents(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    fn undecodable() -> kube::Error {
        kube::Error::SerdeError(serde_json::from_str::<serde_json::Value>("{").unwrap_err())
    }

    /// Runs the loop through the script: the calls it made, what its
    /// consumer heard, and how many lists and restarts it counted.
    fn drive(answers: Vec<Answer>) -> (Vec<String>, Vec<String>, (u64, u64)) {
        let script = Script {
            answers: Mutex::new(answers.into()),
            calls: Mutex::new(Vec::new()),
        };
        let metrics = Arc::new(Metrics::default());
        let mut heard = Vec::new();
        let spec = Spec::new("configmap a", "configmaps", None)
            .fields("metadata.name=a")
            .list_timeout(Duration::from_millis(50));
        let backoff = Backoff::with_bounds(Duration::from_millis(1), Duration::from_millis(2));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(&script, spec, metrics.clone(), backoff, |event| {
            heard.push(match event {
                Event::Listing => "listing".to_string(),
                Event::Listed(o) => format!("listed {}", o.name()),
                Event::ListDone => "list done".to_string(),
                Event::Applied(o) if o.name() == "end" => return ControlFlow::Break(()),
                Event::Applied(o) => format!("applied {}", o.name()),
                Event::Deleted(o) => format!("deleted {}", o.name()),
                Event::Resumed => "resumed".to_string(),
                Event::Failed(e) if e.needs_list() => "failed: list again".to_string(),
                Event::Failed(_) => "failed".to_string(),
            });
            ControlFlow::Continue(())
        }));
        let counts = (
            metrics.watch_lists("configmaps"),
            metrics.watch_restarts("configmaps"),
        );
        let calls = script.calls.into_inner().unwrap();
        (calls, heard, counts)
    }

    #[test]
    fn a_list_that_gets_no_answer_is_given_up_and_made_again() {
        let (calls, heard, counts) =
            drive(vec![Answer::ListHangs, Answer::Page(vec!["a"], "10", None)]);
        assert_eq!(calls, ["list", "list", "watch@10"]);
        assert_eq!(
            heard,
            [
                "listing",
                "failed: list again",
                "listing",
                "listed a",
                "list done"
            ]
        );
        assert_eq!(counts.0, 2, "two lists");
    }

    #[test]
    fn a_dropped_watch_resumes_from_the_last_resource_version_seen() {
        let (calls, heard, counts) = drive(vec![
            Answer::Page(vec!["a"], "10", None),
            // An object and a bookmark, then the connection is cut.
            Answer::Stream(vec![added("b", "11"), bookmark("15"), Err(cut())]),
            // The server is unreachable for a while.
            Answer::WatchFails(cut()),
            Answer::WatchFails(api(500, "InternalError")),
            // Back: what happened meanwhile comes; the call ends.
            Answer::Stream(vec![deleted("a", "16")]),
            // Renewed (the end of a call is no failure).
            Answer::Stream(vec![bookmark("17")]),
            // A non-410 ERROR event ends the call: resumed too.
            Answer::Stream(vec![Ok(WatchEvent::Error(status(500, "InternalError")))]),
        ]);
        assert_eq!(
            calls,
            [
                "list", "watch@10", "watch@15", "watch@15", "watch@15", "watch@16", "watch@17",
                "watch@17"
            ]
        );
        assert_eq!(
            heard,
            [
                "listing",
                "listed a",
                "list done",
                "applied b",
                "failed",
                "failed",
                "failed",
                "resumed",
                "deleted a",
                "failed",
                "resumed",
            ]
        );
        assert_eq!(counts, (1, 4), "one list; four restarts");
    }

    #[test]
    fn only_410_gone_or_an_undecodable_answer_lists_again() {
        let (calls, heard, counts) = drive(vec![
            Answer::Page(vec!["a"], "10", None),
            // History compacted under a running watch: an ERROR event.
            Answer::Stream(vec![Ok(WatchEvent::Error(status(410, "Expired")))]),
            // Listed again, in two pages.
            Answer::Page(vec!["a"], "20", Some("next")),
            Answer::Page(vec!["b"], "20", None),
            // Out of the watch cache's window: a 410 answer to the call
            // itself (kube-runtime 5 would retry that call forever).
            Answer::WatchFails(api(410, "Gone")),
            Answer::Page(vec![], "30", None),
            // A line that cannot be decoded: an event may be lost.
            Answer::Stream(vec![Err(undecodable())]),
            Answer::Page(vec!["c"], "40", None),
            // An object without a resourceVersion.
            Answer::Stream(vec![Ok(WatchEvent::Modified(Raw::from_value(
                json!({"metadata": {"name": "c"}}),
            )))]),
            Answer::Page(vec!["c"], "50", None),
        ]);
        assert_eq!(
            calls,
            [
                "list",
                "watch@10",
                "list",
                "list continue=next",
                "watch@20",
                "list",
                "watch@30",
                "list",
                "watch@40",
                "list",
                "watch@50",
            ]
        );
        let failures: Vec<_> = heard.iter().filter(|h| h.starts_with("failed")).collect();
        assert_eq!(failures, ["failed: list again"; 4]);
        assert!(!heard.contains(&"resumed".to_string()), "{heard:?}");
        assert_eq!(counts, (5, 4));
    }

    #[test]
    fn a_list_that_fails_midway_starts_over_and_is_done_once_whole() {
        let (calls, heard, counts) = drive(vec![
            Answer::ListFails(api(403, "Forbidden")),
            Answer::Page(vec!["a"], "10", Some("next")),
            Answer::ListFails(cut()),
            // Its continue token expired meanwhile.
            Answer::Page(vec!["a"], "11", Some("later")),
            Answer::ListFails(api(410, "Expired")),
            Answer::Page(vec!["a", "b"], "12", None),
        ]);
        assert_eq!(
            calls,
            [
                "list",
                "list",
                "list continue=next",
                "list",
                "list continue=later",
                "list",
                "watch@12",
            ]
        );
        assert_eq!(
            heard,
            [
                "listing",
                "failed",
                "listing",
                "listed a",
                "failed",
                "listing",
                "listed a",
                "failed: list again",
                "listing",
                "listed a",
                "listed b",
                "list done",
            ]
        );
        assert_eq!(counts, (4, 3));
    }

    #[test]
    fn recovery_resumes_unless_the_history_is_gone() {
        let at = || Some("5".to_string());
        let resume = [
            WatchError::Start(cut()),
            WatchError::Stream(cut()),
            WatchError::Start(api(403, "Forbidden")),
            WatchError::Start(api(500, "InternalError")),
            WatchError::Ended(status(500, "InternalError")),
        ];
        for error in &resume {
            assert_eq!(recover(at(), error), at(), "{error}");
        }
        let list = [
            WatchError::Ended(status(410, "Expired")),
            WatchError::Start(api(410, "Gone")),
            WatchError::Stream(api(410, "Gone")),
            WatchError::Stream(undecodable()),
            WatchError::NoResourceVersion,
        ];
        for error in &list {
            assert_eq!(recover(at(), error), None, "{error}");
        }
        assert_eq!(
            recover(None, &WatchError::List(cut())),
            None,
            "never listed"
        );
    }
}
