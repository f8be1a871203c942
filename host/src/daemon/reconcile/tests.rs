//! The reconciler's own rules, on a real directory, without an API server.

use std::fs;
use std::path::Path;

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::json;

use super::*;
use crate::daemon::inbox::Observation;

fn incoming(key: &str, name: &str, image: &str) -> Incoming {
    let value = json!({"apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": "kube-system"},
        "template": {"spec": {"containers": [{"name": "c", "image": image}]}}});
    Incoming {
        key: key.to_string(),
        id: Some(format!("kube-system/{name}")),
        template: Template::from_value(&value).map_err(|e| SourceError::Invalid(e.to_string())),
        reference: None,
    }
}

fn empty_catalog() -> Input {
    Input::Catalog(Arc::new(Catalog::from_steps(Vec::new())))
}

/// A reconciler that knows neither the node nor a catalog yet.
fn bare_reconciler(dir: &Path) -> Reconciler {
    Reconciler::new(
        dir.to_path_buf(),
        "kube-system".into(),
        crate::plugin::Limits::default().max_output_bytes,
        Arc::new(Metrics::default()),
        None,
    )
    .unwrap()
}

fn reconciler(dir: &Path) -> Reconciler {
    let mut r = bare_reconciler(dir);
    r.apply(Input::Node(NodeContext::named("n1")));
    r.apply(empty_catalog());
    r
}

fn list(r: &mut Reconciler, items: Vec<Incoming>) {
    r.apply(Input::ListStarted);
    for item in items {
        r.apply(Input::Listed(item));
    }
    r.apply(Input::ListDone);
    r.reconcile();
}

#[test]
fn nothing_is_deleted_before_a_complete_list() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(dir.path());
    list(
        &mut r,
        vec![incoming("a", "a", "x:1"), incoming("b", "b", "x:1")],
    );
    assert!(dir.path().join("a.yaml").exists() && dir.path().join("b.yaml").exists());

    // A restarted daemon, and a relist that has not finished.
    let mut r = reconciler(dir.path());
    assert_eq!(r.owned.len(), 2);
    r.reconcile();
    r.apply(Input::ListStarted);
    r.apply(Input::Listed(incoming("a", "a", "x:1")));
    r.reconcile();
    assert!(
        dir.path().join("b.yaml").exists(),
        "a partial list deletes nothing"
    );
    r.apply(Input::ListDone);
    r.reconcile();
    assert!(
        !dir.path().join("b.yaml").exists(),
        "gone after the complete list"
    );
    assert!(dir.path().join("a.yaml").exists());
}

#[test]
fn a_file_never_read_holds_garbage_collection() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(dir.path());
    list(&mut r, vec![incoming("a.yaml", "a", "x:1")]);
    // A restart, and this time the file cannot be read.
    let mut r = reconciler(dir.path());
    let unreadable = Incoming {
        key: "a.yaml".into(),
        id: None,
        template: Err(SourceError::Unreadable("a.yaml: cannot read".into())),
        reference: None,
    };
    list(&mut r, vec![unreadable]);
    assert!(
        dir.path().join("a.yaml").exists(),
        "the manifest may be that template's"
    );
    assert_eq!(
        r.entries["a.yaml"].last_error.as_deref(),
        Some("a.yaml: cannot read")
    );
    // Read at last.
    r.apply(Input::Applied(incoming("a.yaml", "a", "x:2")));
    r.reconcile();
    let text = fs::read_to_string(dir.path().join("a.yaml")).unwrap();
    assert!(text.contains("x:2"), "{text}");
}

#[test]
fn the_first_template_keeps_a_pod_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(dir.path());
    list(&mut r, vec![incoming("1.yaml", "web", "first:1")]);
    r.apply(Input::Applied(incoming("2.yaml", "web", "second:1")));
    r.reconcile();
    let text = fs::read_to_string(dir.path().join("web.yaml")).unwrap();
    assert!(text.contains("first:1"), "{text}");
    assert!(
        r.entries["2.yaml"]
            .last_error
            .as_deref()
            .unwrap()
            .contains("already produced")
    );
    // A change to the first one is still written.
    r.apply(Input::Applied(incoming("1.yaml", "web", "first:2")));
    r.reconcile();
    let text = fs::read_to_string(dir.path().join("web.yaml")).unwrap();
    assert!(text.contains("first:2"), "{text}");
}

#[test]
fn foreign_files_and_symlinks_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("web.yaml"), "apiVersion: v1\nkind: Pod\n").unwrap();
    let outside = dir.path().join(".outside");
    fs::write(&outside, "keep").unwrap();
    std::os::unix::fs::symlink(&outside, dir.path().join("db.yaml")).unwrap();
    let mut r = reconciler(dir.path());
    list(
        &mut r,
        vec![incoming("web", "web", "x:1"), incoming("db", "db", "x:1")],
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("web.yaml")).unwrap(),
        "apiVersion: v1\nkind: Pod\n"
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
    assert!(
        r.entries["web"]
            .last_error
            .as_deref()
            .unwrap()
            .contains("not podstamp's")
    );
    assert!(r.entries["db"].last_error.is_some());
    // Deleting the templates does not delete what was never ours.
    list(&mut r, vec![]);
    assert!(dir.path().join("web.yaml").exists() && dir.path().join("db.yaml").exists());
}

#[test]
fn a_huge_failure_message_is_kept_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(dir.path());
    let mut huge = incoming("a", "a", "x:1");
    huge.template = Err(SourceError::Invalid(format!(
        "PodTemplate a: {}",
        "é".repeat(1 << 20)
    )));
    list(&mut r, vec![huge]);
    let kept = r.entries["a"].last_error.as_deref().unwrap();
    assert!(
        kept.len() < outcome::MAX_FAILURE_MESSAGE + 64,
        "{}",
        kept.len()
    );
    assert!(
        kept.ends_with(&format!("… (cut: {} bytes in all)", 15 + (2 << 20))),
        "{}",
        &kept[kept.len() - 40..]
    );
}

#[test]
fn without_the_node_nothing_is_rendered() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = bare_reconciler(dir.path());
    r.apply(empty_catalog());
    list(&mut r, vec![incoming("a", "a", "x:1")]);
    assert!(!dir.path().join("a.yaml").exists());
    assert!(!r.metrics.is_ready());
    r.apply(Input::Node(NodeContext::named("n1")));
    r.reconcile();
    assert!(dir.path().join("a.yaml").exists());
    assert!(r.metrics.is_ready());
}

#[test]
fn without_a_catalog_nothing_is_rendered() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = bare_reconciler(dir.path());
    r.apply(Input::Node(NodeContext::named("n1")));
    list(&mut r, vec![incoming("a", "a", "x:1")]);
    assert!(!dir.path().join("a.yaml").exists());
    assert!(!r.metrics.is_ready());
    r.apply(empty_catalog());
    r.reconcile();
    assert!(dir.path().join("a.yaml").exists());
    assert!(r.metrics.is_ready());
}

#[test]
fn a_new_catalog_renders_only_the_templates_whose_chain_changed() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(dir.path());
    let mut own = incoming("b", "b", "x:1");
    if let Ok(t) = &mut own.template {
        // An unknown plugin: the chain is an error, which a catalog
        // that knows no more plugins does not change.
        t.annotations
            .insert(crate::catalog::PLUGINS_ANNOTATION.into(), "nope".into());
    }
    list(&mut r, vec![incoming("a", "a", "x:1"), own]);
    assert!(r.entries["b"].last_error.is_some());
    // The same chains: nothing to render.
    r.apply(empty_catalog());
    assert!(r.dirty.is_empty(), "{:?}", r.dirty);
    // Another render budget changes the default chain only.
    let budget = Duration::from_millis(1234);
    r.apply(Input::Catalog(Arc::new(
        Catalog::from_steps(Vec::new()).with_render_budget(budget),
    )));
    assert_eq!(r.dirty, BTreeSet::from(["a".to_string()]));
    r.reconcile();
    assert!(r.dirty.is_empty());
}

/// The first render and the pods watch's first list race; a revision
/// this daemon wrote is followed as its own (with its Events) whichever
/// comes first, and also when the pods watch was lost in between.
#[test]
fn a_revision_written_before_pods_are_followed_is_still_our_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = reconciler(dir.path());
    list(&mut r, vec![incoming("a", "a", "x:1")]);
    assert!(dir.path().join("a.yaml").exists());
    assert!(r.rollouts.following("kube-system/a").is_none());
    r.apply(Input::MirrorSynced);
    r.reconcile();
    let (revision, written) = r.rollouts.following("kube-system/a").expect("followed");
    assert!(written, "written by this daemon: {revision}");
    let first = revision.to_string();

    // Lost before a verdict, then listed again: still ours.
    r.apply(Input::MirrorLost);
    assert!(r.rollouts.following("kube-system/a").is_none());
    r.apply(Input::MirrorSynced);
    r.reconcile();
    let (revision, written) = r
        .rollouts
        .following("kube-system/a")
        .expect("followed again");
    assert!(written && revision == first, "{revision} {written}");

    // A manifest found in place by a restarted daemon is not.
    let mut r = reconciler(dir.path());
    list(&mut r, vec![incoming("a", "a", "x:1")]);
    r.apply(Input::MirrorSynced);
    r.reconcile();
    let (revision, written) = r.rollouts.following("kube-system/a").expect("followed");
    assert!(!written, "found in place: {revision}");
}

/// The revision label of `file` in `dir`.
fn revision_in(dir: &Path, file: &str) -> String {
    let text = fs::read_to_string(dir.join(file)).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("podstamp.io/revision: "))
        .unwrap()
        .trim_matches('"')
        .to_string()
}

/// A failed revision rolled back stays held after a restart: the
/// template still renders it, and it is not written again.
#[test]
fn a_held_revision_is_not_written_again_after_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    fs::create_dir(&dir).unwrap();
    let history = root.path().join("revisions");
    let with_history = || {
        let mut r = reconciler(&dir);
        r.set_revisions(Store::open(history.clone(), 3, &dir).unwrap());
        r
    };
    let mut r = with_history();
    list(&mut r, vec![incoming("a", "a", "x:1")]);
    let good = revision_in(&dir, "a.yaml");
    r.apply(Input::Applied(incoming("a", "a", "x:2")));
    r.reconcile();
    let failing = revision_in(&dir, "a.yaml");
    assert_ne!(good, failing);
    r.apply(Input::MirrorSynced);
    r.apply(Input::Mirror(Observation {
        source: "kube-system/a".into(),
        revision: failing.clone(),
        state: crate::daemon::inbox::PodState::Failed {
            reason: "CrashLoopBackOff".into(),
            message: "back-off".into(),
        },
        pod: ObjectReference::default(),
    }));
    r.reconcile();
    assert_eq!(revision_in(&dir, "a.yaml"), good, "rolled back");
    let before = fs::metadata(dir.join("a.yaml"))
        .unwrap()
        .modified()
        .unwrap();

    // Restarted: the template still renders the failed revision.
    let mut r = with_history();
    list(&mut r, vec![incoming("a", "a", "x:2")]);
    r.apply(Input::MirrorSynced);
    r.reconcile();
    assert_eq!(revision_in(&dir, "a.yaml"), good, "still held");
    assert_eq!(
        fs::metadata(dir.join("a.yaml"))
            .unwrap()
            .modified()
            .unwrap(),
        before
    );
    // Its fallback gone from the directory: the template's pod is
    // written rather than held out for good.
    fs::remove_file(dir.join("a.yaml")).unwrap();
    r.apply(Input::Applied(incoming("a", "a", "x:2")));
    r.reconcile();
    assert_eq!(revision_in(&dir, "a.yaml"), failing);
    // Another revision is written, and releases it.
    r.apply(Input::Applied(incoming("a", "a", "x:3")));
    r.reconcile();
    let next = revision_in(&dir, "a.yaml");
    assert!(next != good && next != failing);
    let state = r
        .revisions
        .as_mut()
        .unwrap()
        .state("kube-system/a")
        .unwrap();
    assert_eq!(state.held, None);
    assert_eq!(state.pending, Some(next));
}

fn with_selector(mut incoming: Incoming, selector: &str) -> Incoming {
    if let Ok(template) = &mut incoming.template {
        template.annotations.insert(
            crate::selector::NODE_SELECTOR_ANNOTATION.into(),
            selector.into(),
        );
    }
    incoming
}

fn node(labels: &[(&str, &str)]) -> Input {
    let mut node = NodeContext::named("n1");
    node.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Input::Node(node)
}

/// A template is written only on the nodes its selector selects; a node
/// that leaves the set removes the manifest and the rollout state, one
/// that joins installs it; a bad selector is the template's error and
/// changes nothing on disk.
#[test]
fn a_template_is_kept_only_where_its_node_selector_selects() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    fs::create_dir(&dir).unwrap();
    let mut r = reconciler(&dir);
    r.set_revisions(Store::open(root.path().join("revisions"), 3, &dir).unwrap());
    r.apply(node(&[("zone", "b")]));
    let cp = || with_selector(incoming("cp", "cp", "x:1"), "zone in (a),!drain");
    list(&mut r, vec![cp(), incoming("any", "any", "x:1")]);
    assert!(!dir.join("cp.yaml").exists(), "zone b is not selected");
    assert!(dir.join("any.yaml").exists(), "no selector: every node");

    // Joins: installed, its rollout state kept.
    r.apply(node(&[("zone", "a")]));
    r.reconcile();
    assert!(dir.join("cp.yaml").exists(), "zone a is selected");
    let store = r.revisions.as_mut().unwrap();
    assert!(store.state("kube-system/cp").unwrap().pending.is_some());

    // Leaves: its manifest and its rollout state go; the other stays.
    r.apply(node(&[("zone", "a"), ("drain", "")]));
    r.reconcile();
    assert!(!dir.join("cp.yaml").exists(), "drain is not selected");
    assert!(dir.join("any.yaml").exists());
    let store = r.revisions.as_mut().unwrap();
    assert_eq!(
        store.state("kube-system/cp").unwrap(),
        RolloutState::default()
    );

    // Back in the set, then a bad selector: the last good manifest stays,
    // and the error names the template, the annotation and the fix.
    r.apply(node(&[("zone", "a")]));
    r.reconcile();
    let before = fs::read(dir.join("cp.yaml")).unwrap();
    r.apply(Input::Applied(with_selector(
        incoming("cp", "cp", "x:2"),
        "zone in (a",
    )));
    r.reconcile();
    assert_eq!(fs::read(dir.join("cp.yaml")).unwrap(), before);
    let error = r.entries["cp"].last_error.clone().unwrap();
    assert!(
        error.starts_with("PodTemplate kube-system/cp: metadata.annotations.podstamp.io/node-selector: \"zone in (a\" at character 11")
            && error.contains("give a label selector"),
        "{error}"
    );
    // A node outside a bad selector's set is not judged either: nothing
    // is removed for a selector nobody can read.
    r.apply(node(&[("zone", "b")]));
    r.reconcile();
    assert_eq!(fs::read(dir.join("cp.yaml")).unwrap(), before);
}

/// A pass of more templates than a commit holds ([`batch::MAX_STAGED`]):
/// every manifest and revision lands, two templates producing one pod name
/// in the same pass leave it to the first, and no temp file stays.
#[test]
fn a_large_pass_lands_whole_in_commits_and_keeps_its_rules() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    fs::create_dir(&dir).unwrap();
    let mut r = reconciler(&dir);
    let store = Store::open(root.path().join("revisions"), 3, &dir).unwrap();
    r.set_revisions(store);
    let n = 2 * batch::MAX_STAGED + 5;
    let mut items: Vec<Incoming> = (0..n)
        .map(|i| incoming(&format!("t{i:04}"), &format!("t{i:04}"), "x:1"))
        .collect();
    // Arrives after t0000 (sequence), renders in the same pass.
    items.push(incoming("zz-dup", "t0000", "dup:1"));
    list(&mut r, items);
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), n, "one manifest per template, no temp file");
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    let first = fs::read_to_string(dir.join("t0000.yaml")).unwrap();
    assert!(first.contains("x:1"), "{first}");
    assert!(
        r.entries["zz-dup"]
            .last_error
            .as_deref()
            .unwrap()
            .contains("already produced")
    );
    let store = r.revisions.as_ref().unwrap();
    for i in [0, batch::MAX_STAGED, n - 1] {
        let id = format!("kube-system/t{i:04}");
        assert_eq!(store.kept(&id).unwrap().len(), 1, "{id}");
    }
    assert_eq!(r.owned.len(), n);
}
