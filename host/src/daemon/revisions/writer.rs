//! The revision history's disk work, on a thread of its own behind the
//! reconciler: a pass's manifests are in place, and the kubelet runs them,
//! without waiting for a thousand history files and their directories to
//! be created and fsynced (the initial sync's largest write after the
//! manifests themselves, docs/performance.md §3.4).
//!
//! [`super::Store`] decides, from its index of what each template keeps,
//! which file to write, rename or prune; the decision is sent here as a
//! [`Job`], and this thread does it as a pass did before: new files staged,
//! fsynced in parallel, renamed; old ones pruned; each template's directory
//! fsynced, and the revisions directory once when it gained one.
//!
//! Invariants:
//! * Jobs are done in the order they were sent. A batch never holds two
//!   jobs of one template (the second waits for the next batch) nor more
//!   than [`write::MAX_STAGED`] jobs (a staged file is open until its
//!   fsync).
//! * Nothing reads a history file while a job is queued: readers
//!   [`Writer::flush`] first.
//! * A job that fails is logged with its template, revision and error, and
//!   marks the template stale: the store reads its directory again, from
//!   disk, before it decides anything more for it.
//! * Dropped, the writer finishes what it was sent; a stopping daemon waits
//!   for it too ([`Drain`]), for a bounded time.
//!
//! Why this weakens no crash guarantee: a manifest's revision was already
//! kept after the manifest was renamed into place (a crash between the two
//! left the manifest without its revision in the history, and still
//! does); the window is now until this thread's batch is done instead of
//! until the pass's step 4. A rollback reads the history only after a
//! flush, and the revision it goes back to is an earlier one, long kept.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::write;

/// What one template's history needs done.
pub(super) struct Job {
    pub(super) id: String,
    pub(super) revision: String,
    /// The template's directory (created if missing).
    pub(super) dir: PathBuf,
    pub(super) change: Change,
    /// Files of the template's history to remove: the oldest, beyond the
    /// number kept.
    pub(super) prune: Vec<String>,
}

pub(super) enum Change {
    /// A revision not kept yet: its file, written.
    Write { file: String, bytes: Vec<u8> },
    /// A revision kept under an older `seq`: renamed to the newest.
    Rename { from: String, to: String },
    /// Already the newest (only pruning, if anything).
    Keep,
}

/// How a job ended: whether a file was written.
pub(super) type Outcome = io::Result<bool>;

enum Message {
    /// Jobs, and where to send their outcomes (else they are logged).
    Jobs(Vec<Job>, Option<mpsc::Sender<Vec<Outcome>>>),
    /// Answered once everything sent before is done.
    Flush(mpsc::Sender<()>),
}

/// What the thread and the store both see.
#[derive(Default)]
struct Shared {
    /// Templates whose last job failed: their index is not to be trusted.
    stale: Mutex<BTreeSet<String>>,
    counts: Arc<Counts>,
}

/// The writer's work as `/metrics` shows it
/// (`podstamp_revision_history_*`, [`crate::daemon::metrics`]).
#[derive(Debug, Default)]
pub struct Counts {
    /// Jobs sent and not done.
    pub queued: AtomicUsize,
    /// Jobs done, by outcome.
    pub done: AtomicU64,
    pub failed: AtomicU64,
}

/// The queue's sending end, shared with [`Drain`]s; taken (None) when the
/// writer is dropped, so that the thread ends whoever else holds it.
type Sending = Arc<Mutex<Option<mpsc::Sender<Message>>>>;

/// The sending side; owned by the store.
pub(super) struct Writer {
    sender: Sending,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// A handle that lets the daemon, stopping, wait for the history's writes.
#[derive(Clone)]
pub struct Drain {
    sender: Sending,
}

impl Drain {
    /// Waits until everything sent so far is on disk, at most `limit`;
    /// whether it was (true too if the writer is gone: it finished first).
    pub fn wait(&self, limit: Duration) -> bool {
        let (done, answer) = mpsc::channel();
        if !send(&self.sender, Message::Flush(done)) {
            return true;
        }
        answer.recv_timeout(limit).is_ok()
    }
}

/// Sends `message` unless the writer is gone; whether it was sent.
fn send(sender: &Sending, message: Message) -> bool {
    let sender = sender.lock().expect("not poisoned").clone();
    sender.is_some_and(|s| s.send(message).is_ok())
}

impl Writer {
    /// Starts the thread that writes under `root` (the revisions
    /// directory).
    pub(super) fn start(root: PathBuf) -> Writer {
        let (sender, receiver) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("podstamp-history".into())
                .spawn(move || run(&root, &receiver, &shared))
                .expect("a thread can be started")
        };
        Writer {
            sender: Arc::new(Mutex::new(Some(sender))),
            thread: Some(thread),
            shared,
        }
    }

    /// Queues `jobs`; their outcomes are logged by the thread.
    pub(super) fn send(&self, jobs: Vec<Job>) -> io::Result<()> {
        self.send_message(jobs, None)
    }

    /// Does `jobs` and waits for their outcomes, in order.
    pub(super) fn run_now(&self, jobs: Vec<Job>) -> Vec<Outcome> {
        let n = jobs.len();
        let (reply, answer) = mpsc::channel();
        match self.send_message(jobs, Some(reply)) {
            Ok(()) => answer.recv().unwrap_or_else(|_| stopped_all(n)),
            Err(_) => stopped_all(n),
        }
    }

    fn send_message(
        &self,
        jobs: Vec<Job>,
        reply: Option<mpsc::Sender<Vec<Outcome>>>,
    ) -> io::Result<()> {
        let n = jobs.len();
        self.shared.counts.queued.fetch_add(n, Ordering::SeqCst);
        if send(&self.sender, Message::Jobs(jobs, reply)) {
            Ok(())
        } else {
            self.shared.counts.queued.fetch_sub(n, Ordering::SeqCst);
            Err(stopped())
        }
    }

    /// Waits until every job sent so far is done.
    pub(super) fn flush(&self) {
        let (done, answer) = mpsc::channel();
        if send(&self.sender, Message::Flush(done)) {
            let _ = answer.recv();
        }
    }

    /// Whether template `id`'s last job failed; the mark is taken if `take`.
    pub(super) fn stale(&self, id: &str, take: bool) -> bool {
        let mut stale = self.shared.stale.lock().expect("not poisoned");
        if take {
            stale.remove(id)
        } else {
            stale.contains(id)
        }
    }

    /// What it has done and has still to do.
    pub(super) fn counts(&self) -> Arc<Counts> {
        self.shared.counts.clone()
    }

    pub(super) fn drain(&self) -> Drain {
        Drain {
            sender: self.sender.clone(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The thread ends once the queue is done and no Drain is waiting.
        self.sender.lock().expect("not poisoned").take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn stopped() -> io::Error {
    io::Error::other("the revision history's writer has stopped")
}

fn stopped_all(n: usize) -> Vec<Outcome> {
    (0..n).map(|_| Err(stopped())).collect()
}

/// The thread: batches of jobs until every sender is gone.
fn run(root: &Path, receiver: &mpsc::Receiver<Message>, shared: &Shared) {
    // A message taken from the queue that did not fit the last batch.
    let mut held: Option<Message> = None;
    loop {
        let first = match held.take() {
            Some(m) => m,
            None => match receiver.recv() {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        let mut batch: Vec<Job> = Vec::new();
        let mut replies: Vec<(usize, Option<mpsc::Sender<Vec<Outcome>>>)> = Vec::new();
        let mut flushes = Vec::new();
        let mut ids = BTreeSet::new();
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Flush(done) => {
                    // Answered after this batch: everything before it is in.
                    flushes.push(done);
                    break;
                }
                Message::Jobs(jobs, reply) => {
                    let fits = batch.is_empty()
                        || (batch.len() + jobs.len() <= write::MAX_STAGED
                            && jobs.iter().all(|j| !ids.contains(&j.id)));
                    if !fits {
                        held = Some(Message::Jobs(jobs, reply));
                        break;
                    }
                    ids.extend(jobs.iter().map(|j| j.id.clone()));
                    replies.push((jobs.len(), reply));
                    batch.extend(jobs);
                }
            }
            next = receiver.try_recv().ok();
        }
        let n = batch.len();
        let outcomes = do_batch(root, &batch);
        for (job, outcome) in batch.iter().zip(&outcomes) {
            if outcome.is_err() {
                shared
                    .stale
                    .lock()
                    .expect("not poisoned")
                    .insert(job.id.clone());
            }
            let count = if outcome.is_ok() {
                &shared.counts.done
            } else {
                &shared.counts.failed
            };
            count.fetch_add(1, Ordering::SeqCst);
        }
        let mut outcomes = outcomes.into_iter();
        let mut jobs = batch.iter();
        for (count, reply) in replies {
            let mine: Vec<Outcome> = outcomes.by_ref().take(count).collect();
            let these: Vec<&Job> = jobs.by_ref().take(count).collect();
            match reply {
                Some(reply) => {
                    let _ = reply.send(mine);
                }
                None => {
                    for (job, outcome) in these.into_iter().zip(mine) {
                        log(job, &outcome);
                    }
                }
            }
        }
        shared.counts.queued.fetch_sub(n, Ordering::SeqCst);
        for done in flushes {
            let _ = done.send(());
        }
    }
}

fn log(job: &Job, outcome: &Outcome) {
    match outcome {
        Ok(true) => tracing::info!(template = %job.id, revision = %job.revision,
            dir = %job.dir.display(), "kept revision"),
        Ok(false) => {}
        Err(e) => log_failure(&job.id, &job.revision, &job.dir, e),
    }
}

/// Logs a revision of template `id` that could not be kept, whether the
/// store could not decide it or this thread could not write it.
pub(super) fn log_failure(id: &str, revision: &str, dir: &Path, e: &io::Error) {
    tracing::error!(template = %id, revision = %revision, dir = %dir.display(),
        "cannot keep the revision: {e}; the manifest is in place, but it cannot be rolled back to");
}

/// Does a batch's disk work, each step for every job before the next; the
/// outcome of each job, in order.
fn do_batch(root: &Path, batch: &[Job]) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(batch.len());
    let mut created = false;
    // 1. Directories made, new files staged (not synced).
    let mut staged: Vec<(usize, write::Staged)> = Vec::new();
    for (i, job) in batch.iter().enumerate() {
        let result = (|| {
            created |= make_dir(&job.dir)?;
            if let Change::Write { file, bytes } = &job.change
                && let Some(s) = write::stage(&job.dir, file, bytes)?
            {
                staged.push((i, s));
            }
            Ok(false)
        })();
        outcomes.push(result);
    }
    // 2. Synced in parallel, renamed.
    let (indices, mut files): (Vec<usize>, Vec<write::Staged>) = staged.into_iter().unzip();
    let synced = write::sync_staged(&mut files);
    for ((i, file), synced) in indices.into_iter().zip(files).zip(synced) {
        outcomes[i] = synced.and_then(|()| file.commit()).map(|()| true);
    }
    // 3. Older revisions renamed to the newest, the oldest pruned.
    let mut dirs = Vec::new();
    for (job, outcome) in batch.iter().zip(outcomes.iter_mut()) {
        if outcome.is_err() {
            continue;
        }
        let moved = match &job.change {
            Change::Rename { from, to } => fs::rename(job.dir.join(from), job.dir.join(to)),
            _ => Ok(()),
        };
        let pruned = moved.and_then(|()| {
            job.prune
                .iter()
                .try_for_each(|old| match fs::remove_file(job.dir.join(old)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
        });
        match pruned {
            Ok(()) => dirs.push(job.dir.clone()),
            Err(e) => *outcome = Err(e),
        }
    }
    // 4. Each directory synced once, in parallel; the root if it gained one.
    let mut synced = write::sync_dirs(&dirs).into_iter();
    for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
        if let Some(Err(e)) = synced.next() {
            *outcome = Err(e);
        }
    }
    if created && let Err(e) = write::sync_dir(root) {
        for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
            *outcome = Err(io::Error::new(e.kind(), format!("{}: {e}", root.display())));
        }
    }
    outcomes
}

/// Creates (0700) a template's directory if missing; whether it was.
fn make_dir(dir: &Path) -> io::Result<bool> {
    let created = match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    if !fs::symlink_metadata(dir)?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory; remove it",
            dir.display()
        )));
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::atomic::Ordering::SeqCst;

    use super::super::Store;
    use super::super::tests::{names, on_disk};

    /// A write that fails behind the pass is logged and marks its template:
    /// what it keeps is read from disk again before anything more is
    /// decided for it.
    #[test]
    fn a_write_that_fails_behind_is_read_again_from_disk() {
        let root = tempfile::tempdir().unwrap();
        let manifests = root.path().join("manifests");
        fs::create_dir(&manifests).unwrap();
        let mut store = Store::open(root.path().join("revisions"), 3, &manifests).unwrap();
        let id = "ns/t";
        assert!(store.record(id, "a1", b"a1").unwrap());
        let dir = store.template_dir(id);
        fs::remove_dir_all(&dir).unwrap();
        fs::write(&dir, b"in the way").unwrap();
        // In one batch with another template's, which lands.
        let results = store.record_many(&[(id, "b2", b"b2"), ("ns/other", "o1", b"o1")]);
        assert!(
            results.iter().all(Result::is_ok),
            "decided from the index: {results:?}"
        );
        store.flush();
        assert_eq!(store.counts().failed.load(SeqCst), 1);
        assert_eq!(on_disk(&store, "ns/other"), ["00000001-o1.yaml"]);
        let e = store.kept(id).unwrap_err();
        assert!(
            e.to_string().contains("is not a directory; remove it"),
            "{e}"
        );
        fs::remove_file(&dir).unwrap();
        assert!(store.record(id, "c3", b"c3").unwrap());
        assert_eq!(names(&store, id), ["00000001-c3.yaml"]);
        assert_eq!(on_disk(&store, id), ["00000001-c3.yaml"]);
    }
}
