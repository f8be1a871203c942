//! The file of what the templates' rollouts leave for the next start of the
//! daemon ([`super::rollout::RolloutState`]): for each template, the last
//! revision that succeeded on this node, the failed revision that is held
//! (not written again while the template renders it), and the revision this
//! daemon wrote whose rollout has no verdict yet. Without it a restart would
//! write a held revision again (and the kubelet would run a broken pod once
//! more), roll back to a revision never confirmed, or take its own write for
//! one found in place.
//!
//! Layout: `<revisions dir>/rollout-states.jsonl`, one line per template
//! that has a state, `{"template":"<namespace>/<name>","state":{…}}`, in
//! the templates' order. One file for all templates, not one each: the
//! first sync of a thousand templates saves a thousand states before any
//! manifest is renamed, and a file each cost a thousand file fsyncs and a
//! thousand directory fsyncs (about 150 ms on an idle disk, three times
//! that on a busy one: docs/performance.md §3.3); one file costs one of
//! each per commit of a pass. One line each, so that a line edited by hand
//! into nonsense loses its own template's state, not the others'.
//!
//! Earlier podstamps kept a `rollout.json` in each template's directory
//! ([`LEGACY_FILE`]): it is still read for a template the file has no line
//! for, and removed once that template's state is in the file (or
//! forgotten), so an upgrade keeps every hold.
//!
//! Invariants:
//! * Outside the kubelet's directory, written like the manifests
//!   ([`crate::write`]): a dot-temp file (which
//!   [`super::revisions::Store::open`] removes at start should a crash leave
//!   one), fsynced, renamed into place, the directory fsynced; mode 0600.
//!   Identical bytes are not written again.
//! * Read once per run, then kept in memory: written only when a state
//!   changes; the file always holds every state this run knows (a failed
//!   write leaves the change in force for this run, and the next write
//!   carries it).
//! * A line that cannot be read is reported (naming the file and the line)
//!   and read as empty for its template: the daemon then behaves for that
//!   template as before it kept one (the failed revision may be written once
//!   more, and rolled back once more), never worse. The next write leaves
//!   the line out: what it held was read as nothing already.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::rollout::RolloutState as State;
use crate::write;

/// The file's name in the revisions directory.
pub const FILE: &str = "rollout-states.jsonl";

/// The file of one template's state in its own directory, as earlier
/// podstamps kept it.
pub const LEGACY_FILE: &str = "rollout.json";

/// Why a state was read as empty.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: {source}; delete it (the failed revision it holds may then be written once more)"
    )]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path} line {line}: {source}; delete the line (the failed revision it holds may then be written once more)"
    )]
    Line {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// One line of the file.
#[derive(serde::Serialize, serde::Deserialize)]
struct Line<T, S> {
    template: T,
    state: S,
}

/// Every template's state, as the file holds it (with this run's changes).
#[derive(Debug)]
pub struct States {
    dir: PathBuf,
    /// Boxed: a state is over 200 bytes, and a map's nodes are about half
    /// full when keys come in order (docs/performance.md §3.6).
    states: BTreeMap<String, Box<State>>,
    /// Templates whose line names them but does not read as a state: asked
    /// for, each is reported once and read as empty.
    damaged: BTreeMap<String, LoadError>,
    /// Templates whose own legacy file was found: removed once the file
    /// holds their state.
    legacy: BTreeSet<String>,
}

impl States {
    /// Reads the file in the revisions directory `dir` (none: no states).
    /// Returned beside: what could not be read and names no template, for
    /// the caller to report.
    pub fn load(dir: &Path) -> (States, Vec<LoadError>) {
        let mut states = States {
            dir: dir.to_path_buf(),
            states: BTreeMap::new(),
            damaged: BTreeMap::new(),
            legacy: BTreeSet::new(),
        };
        let path = dir.join(FILE);
        let text = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (states, Vec::new()),
            Err(source) => {
                let path = path.display().to_string();
                return (states, vec![LoadError::Io { path, source }]);
            }
        };
        let mut unnamed = Vec::new();
        for (i, line) in text.split(|b| *b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let error = |source| LoadError::Line {
                path: path.display().to_string(),
                line: i + 1,
                source,
            };
            match serde_json::from_slice::<Line<String, serde_json::Value>>(line) {
                Err(e) => unnamed.push(error(e)),
                Ok(Line { template, state }) => match serde_json::from_value::<State>(state) {
                    Ok(state) => {
                        states.states.insert(template, Box::new(state));
                    }
                    Err(e) => {
                        states.damaged.insert(template, error(e));
                    }
                },
            }
        }
        (states, unnamed)
    }

    /// Template `id`'s state; `template_dir` is its directory, where an
    /// earlier podstamp kept it. Empty when there is none.
    pub fn get(&mut self, id: &str, template_dir: &Path) -> Result<State, LoadError> {
        if let Some(state) = self.states.get(id) {
            return Ok(State::clone(state));
        }
        if let Some(e) = self.damaged.remove(id) {
            return Err(e);
        }
        let path = template_dir.join(LEGACY_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
            Err(source) => {
                return Err(LoadError::Io {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        // Removed once this template's state is in the file, read or not.
        self.legacy.insert(id.to_string());
        serde_json::from_slice(&bytes).map_err(|source| LoadError::Parse {
            path: path.display().to_string(),
            source,
        })
    }

    /// Sets these templates' states (an empty one removes the template's
    /// line) and writes the file once. Then removes the legacy files the
    /// file now stands for; `template_dir` names a template's directory.
    pub fn set_many(
        &mut self,
        states: &[(String, State)],
        template_dir: impl Fn(&str) -> PathBuf,
    ) -> io::Result<()> {
        for (id, state) in states {
            self.damaged.remove(id);
            if *state == State::default() {
                self.states.remove(id);
            } else {
                self.states.insert(id.clone(), Box::new(state.clone()));
            }
        }
        self.write()?;
        for (id, _) in states {
            if self.legacy.remove(id) {
                remove_legacy(&template_dir(id))?;
            }
        }
        Ok(())
    }

    /// Template `id` is gone: its state goes, from the file and from its
    /// own legacy file.
    pub fn forget(&mut self, id: &str, template_dir: &Path) -> io::Result<()> {
        self.damaged.remove(id);
        self.legacy.remove(id);
        if self.states.remove(id).is_some() {
            self.write()?;
        }
        remove_legacy(template_dir)
    }

    fn write(&self) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(self.states.len() * 160);
        for (template, state) in &self.states {
            let line = Line { template, state };
            serde_json::to_writer(&mut bytes, &line).map_err(io::Error::other)?;
            bytes.push(b'\n');
        }
        write::write_atomic(&self.dir, FILE, &bytes).map(|_| ())
    }
}

/// Removes a template's legacy file, durably: come back after a crash, it
/// would stand for a template whose line the file no longer has.
fn remove_legacy(template_dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(template_dir.join(LEGACY_FILE)) {
        Ok(()) => write::sync_dir(template_dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn full() -> State {
        State {
            good: Some("aaaa".into()),
            held: Some("bbbb".into()),
            pending: Some("cccc".into()),
            deadline: Some(90),
            failed: Some(crate::fleet::Failed {
                target: "t1".into(),
                change: Some("c1".into()),
                ..crate::fleet::Failed::default()
            }),
        }
    }

    fn dirs(root: &Path) -> impl Fn(&str) -> PathBuf + '_ {
        move |id| root.join(id.replacen('/', "_", 1))
    }

    #[test]
    fn saved_states_read_back_in_one_file_and_nothing_reads_as_empty() {
        let root = tempfile::tempdir().unwrap();
        let dir = dirs(root.path());
        let (mut states, errors) = States::load(root.path());
        assert!(errors.is_empty());
        assert_eq!(states.get("ns/a", &dir("ns/a")).unwrap(), State::default());
        let other = State {
            good: Some("dddd".into()),
            ..State::default()
        };
        states
            .set_many(
                &[("ns/a".into(), full()), ("ns/b".into(), other.clone())],
                &dir,
            )
            .unwrap();
        let (mut again, errors) = States::load(root.path());
        assert!(errors.is_empty());
        assert_eq!(again.get("ns/a", &dir("ns/a")).unwrap(), full());
        assert_eq!(again.get("ns/b", &dir("ns/b")).unwrap(), other);
        let meta = fs::metadata(root.path().join(FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Only the file: no temp file, no directory per template.
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 1);
        // An empty state removes the line; a forgotten template too.
        again
            .set_many(&[("ns/a".into(), State::default())], &dir)
            .unwrap();
        again.forget("ns/b", &dir("ns/b")).unwrap();
        assert_eq!(fs::read_to_string(root.path().join(FILE)).unwrap(), "");
    }

    #[test]
    fn a_field_of_a_later_version_leaves_the_rest_read() {
        let root = tempfile::tempdir().unwrap();
        fs::write(
            root.path().join(FILE),
            "{\"template\":\"ns/a\",\"state\":{\"good\":\"aaaa\",\"held\":\"bbbb\",\"fromLater\":{\"x\":1}},\"more\":1}\n",
        )
        .unwrap();
        let (mut states, errors) = States::load(root.path());
        assert!(errors.is_empty());
        let state = states.get("ns/a", root.path()).unwrap();
        assert_eq!(state.held.as_deref(), Some("bbbb"));
        assert_eq!(state.good.as_deref(), Some("aaaa"));
    }

    #[test]
    fn a_damaged_line_is_named_and_loses_only_its_own_template() {
        let root = tempfile::tempdir().unwrap();
        let dir = dirs(root.path());
        fs::write(
            root.path().join(FILE),
            "{\"template\":\"ns/a\",\"state\":{\"held\":3}}\n\
             not json\n\
             {\"template\":\"ns/c\",\"state\":{\"held\":\"cccc\"}}\n",
        )
        .unwrap();
        let (mut states, errors) = States::load(root.path());
        let unnamed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(unnamed.len(), 1, "{unnamed:?}");
        assert!(
            unnamed[0].contains("rollout-states.jsonl line 2")
                && unnamed[0].contains("delete the line"),
            "{unnamed:?}"
        );
        let e = states.get("ns/a", &dir("ns/a")).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("delete the line"), "{e}");
        // Reported once; then read as empty.
        assert_eq!(states.get("ns/a", &dir("ns/a")).unwrap(), State::default());
        assert_eq!(
            states.get("ns/c", &dir("ns/c")).unwrap().held.as_deref(),
            Some("cccc")
        );
        // The next write keeps what was read, and drops what was not.
        states.set_many(&[("ns/b".into(), full())], &dir).unwrap();
        let text = fs::read_to_string(root.path().join(FILE)).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains("ns/b") && text.contains("cccc"), "{text}");
    }

    #[test]
    fn an_earlier_podstamps_file_is_read_then_moved_into_the_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = dirs(root.path());
        fs::create_dir(dir("ns/a")).unwrap();
        fs::create_dir(dir("ns/b")).unwrap();
        fs::write(dir("ns/a").join(LEGACY_FILE), "{\"held\":\"aaaa\"}").unwrap();
        fs::write(dir("ns/b").join(LEGACY_FILE), "{\"held\": 3}").unwrap();
        let (mut states, _) = States::load(root.path());
        let held = states.get("ns/a", &dir("ns/a")).unwrap();
        assert_eq!(held.held.as_deref(), Some("aaaa"));
        let e = states.get("ns/b", &dir("ns/b")).unwrap_err().to_string();
        assert!(e.contains("rollout.json") && e.contains("delete it"), "{e}");
        // Another template's save leaves them where they are...
        states.set_many(&[("ns/c".into(), full())], &dir).unwrap();
        assert!(dir("ns/a").join(LEGACY_FILE).exists());
        // ...their own moves them into the file (or forgets them).
        states
            .set_many(&[("ns/a".into(), held.clone())], &dir)
            .unwrap();
        assert!(!dir("ns/a").join(LEGACY_FILE).exists());
        states.forget("ns/b", &dir("ns/b")).unwrap();
        assert!(!dir("ns/b").join(LEGACY_FILE).exists());
        let (mut again, _) = States::load(root.path());
        assert_eq!(again.get("ns/a", &dir("ns/a")).unwrap(), held);
        assert_eq!(again.get("ns/b", &dir("ns/b")).unwrap(), State::default());
    }
}
