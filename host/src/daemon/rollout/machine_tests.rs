//! The rollout rules as tables: a sequence of what happened → the effects
//! decided. No files, no API server, no clock but the one given.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

use super::*;
use crate::daemon::inbox::{Ask, PodState};
use crate::daemon::rollout::{DEADLINE_EXCEEDED, STABLE};

const ID: &str = "ns/web";
const MINUTE: Duration = Duration::from_secs(60);
const ONE: Policy = Policy::NodeByNode { max_unavailable: 1 };

fn at() -> String {
    "2026-01-01T00:00:00Z".into()
}

fn machine(coordinated: bool) -> Machine {
    let mut m = Machine::new("n1", coordinated).with_clock(at);
    m.load_state(ID, RolloutState::default());
    m
}

fn placed(revision: &str, written: bool) -> InPlace {
    InPlace {
        id: ID.into(),
        revision: revision.into(),
        written,
        deadline: MINUTE,
        held: false,
        gated: None,
        target: None,
        change: None,
        generation: Some(1),
        quorum: false,
    }
}

fn seen(revision: &str, state: PodState) -> Observation {
    Observation {
        source: ID.into(),
        revision: revision.into(),
        state,
        pod: ObjectReference {
            name: Some(format!("web-{revision}")),
            ..ObjectReference::default()
        },
    }
}

fn crash() -> PodState {
    PodState::Failed {
        reason: "CrashLoopBackOff".into(),
        message: "back-off".into(),
    }
}

/// The Events among `effects`: (reason, note).
fn events(effects: &[Effect]) -> Vec<(Reason, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event { reason, note, .. } => Some((*reason, note.clone())),
            _ => None,
        })
        .collect()
}

fn results(effects: &[Effect]) -> Vec<&'static str> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Result(r) => Some(*r),
            _ => None,
        })
        .collect()
}

fn saved(effects: &[Effect]) -> Vec<RolloutState> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SaveState { state, .. } => Some(state.clone()),
            _ => None,
        })
        .collect()
}

fn asks(effects: &[Effect]) -> Vec<Ask> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Ask(a) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

/// `r1` written and confirmed Ready on a machine that follows rollouts.
fn with_good(m: &mut Machine, now: Instant) {
    m.mirror_synced();
    m.in_place(placed("r1", true), || None, now);
    m.observe(seen("r1", PodState::Ready), now);
    m.tick(now + STABLE);
    m.take_effects();
}

#[test]
fn a_written_revision_ready_for_a_while_succeeds_and_is_remembered_as_good() {
    let mut m = machine(false);
    let now = Instant::now();
    assert!(m.mirror_synced());
    assert!(!m.mirror_synced(), "news once");
    m.writing(ID, "r1", MINUTE);
    assert_eq!(
        saved(&m.take_effects()),
        vec![RolloutState {
            pending: Some("r1".into()),
            deadline: Some(60),
            ..RolloutState::default()
        }]
    );
    m.in_place(placed("r1", true), || None, now);
    m.observe(seen("r1", PodState::Running), now);
    m.observe(seen("r1", PodState::Ready), now);
    let effects = m.take_effects();
    assert!(results(&effects).is_empty(), "{effects:?}");
    assert_eq!(m.next_deadline(), Some(now + STABLE));
    m.tick(now + STABLE / 2);
    assert!(m.take_effects().is_empty());
    m.tick(now + STABLE);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["succeeded"]);
    assert_eq!(
        saved(&effects),
        vec![RolloutState {
            good: Some("r1".into()),
            ..RolloutState::default()
        }],
        "good, and no longer pending"
    );
    let events = events(&effects);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, Reason::RolloutSucceeded);
    assert!(
        events[0]
            .1
            .starts_with("node n1: revision r1 Ready after 10.0s"),
        "{events:?}"
    );
}

#[test]
fn a_revision_found_in_place_succeeds_without_an_event() {
    let mut m = machine(false);
    let now = Instant::now();
    m.mirror_synced();
    m.in_place(placed("r1", false), || None, now);
    m.observe(seen("r1", PodState::Ready), now);
    m.tick(now + STABLE);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["succeeded"]);
    assert!(events(&effects).is_empty(), "{effects:?}");
}

#[test]
fn a_failed_revision_is_rolled_back_then_held_and_the_event_says_so() {
    let mut m = machine(false);
    let now = Instant::now();
    with_good(&mut m, now);
    m.writing(ID, "r2", MINUTE);
    m.in_place(placed("r2", true), || None, now);
    m.take_effects();
    // The old pod's status never fails the new revision.
    m.observe(seen("r1", crash()), now);
    assert!(m.take_effects().is_empty());
    m.observe(seen("r2", crash()), now);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["failed"]);
    assert_eq!(
        effects.last(),
        Some(&Effect::RollBack {
            id: ID.into(),
            revision: "r1".into(),
            failed: "r2".into()
        })
    );
    assert!(
        events(&effects).is_empty(),
        "the Event waits for the rollback"
    );
    assert!(!m.is_held(ID, "r2"), "held only once r1 is back in place");

    m.rolled_back(ID, "r1", Ok(()), now);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["rolled_back"]);
    assert_eq!(
        saved(&effects),
        vec![
            RolloutState {
                good: Some("r1".into()),
                held: Some("r2".into()),
                pending: Some("r2".into()),
                deadline: Some(60),
                failed: None,
            },
            RolloutState {
                good: Some("r1".into()),
                held: Some("r2".into()),
                pending: None,
                deadline: None,
                failed: None,
            },
        ]
    );
    let events = events(&effects);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, Reason::RolloutFailed);
    assert_eq!(
        events[0].1,
        "node n1: revision r2: CrashLoopBackOff: back-off; rolled back to revision r1; revision r2 is not written again until the template changes"
    );
    assert!(m.is_held(ID, "r2"));
    // The rollback is followed itself, with nothing to fall back to.
    assert_eq!(m.following(ID), Some(("r1", true)));
    m.observe(seen("r1", crash()), now);
    m.tick(now + MINUTE);
    let effects = m.take_effects();
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::RollBack { .. })),
        "{effects:?}"
    );
}

#[test]
fn a_rollback_that_cannot_be_written_keeps_the_failed_revision_and_holds_nothing() {
    let mut m = machine(false);
    let now = Instant::now();
    with_good(&mut m, now);
    m.in_place(placed("r2", true), || None, now);
    m.observe(seen("r2", crash()), now);
    m.take_effects();
    m.rolled_back(ID, "r1", Err("it is no longer in /var/lib/x".into()), now);
    let effects = m.take_effects();
    assert!(results(&effects).is_empty(), "{effects:?}");
    assert!(
        events(&effects)[0]
            .1
            .ends_with("cannot roll back to revision r1: it is no longer in /var/lib/x; it stays")
    );
    assert!(!m.is_held(ID, "r2"));
}

#[test]
fn a_first_revision_has_nothing_to_fall_back_to_and_a_deadline_fails_it() {
    let mut m = machine(false);
    let now = Instant::now();
    m.mirror_synced();
    m.in_place(placed("r1", true), || None, now);
    m.observe(seen("r1", PodState::Running), now);
    m.tick(now + MINUTE - Duration::from_millis(1));
    assert!(results(&m.take_effects()).is_empty());
    m.tick(now + MINUTE);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["failed"]);
    assert!(!effects.iter().any(|e| matches!(e, Effect::RollBack { .. })));
    let events = events(&effects);
    assert!(events[0].1.contains(DEADLINE_EXCEEDED), "{events:?}");
    assert!(events[0].1.ends_with("nothing to fall back to: it stays"));
}

#[test]
fn the_history_gives_the_fallback_only_when_no_revision_succeeded() {
    let mut m = machine(false);
    let now = Instant::now();
    m.mirror_synced();
    m.in_place(placed("r2", true), || Some("r0".into()), now);
    m.observe(seen("r2", crash()), now);
    let effects = m.take_effects();
    assert!(effects.contains(&Effect::RollBack {
        id: ID.into(),
        revision: "r0".into(),
        failed: "r2".into()
    }));

    let mut m = machine(false);
    with_good(&mut m, now);
    m.in_place(
        placed("r2", true),
        || panic!("the good revision is known"),
        now,
    );
}

#[test]
fn nothing_is_judged_while_the_pods_watch_does_not_follow_and_own_writes_stay_own() {
    let mut m = machine(false);
    let now = Instant::now();
    m.in_place(placed("r1", true), || None, now);
    assert_eq!(m.following(ID), None);
    m.tick(now + MINUTE * 10);
    assert!(m.take_effects().is_empty());
    m.mirror_synced();
    // Rendered again once followed: found in place, but written by this run.
    m.in_place(placed("r1", false), || None, now);
    assert_eq!(m.following(ID), Some(("r1", true)));
    m.mirror_lost();
    assert_eq!(m.following(ID), None);
    m.mirror_synced();
    m.in_place(placed("r1", false), || None, now);
    assert_eq!(m.following(ID), Some(("r1", true)));
    // A revision pending from before a restart is this daemon's too.
    let mut m = machine(false);
    m.load_state(
        ID,
        RolloutState {
            pending: Some("r1".into()),
            ..RolloutState::default()
        },
    );
    m.mirror_synced();
    m.in_place(placed("r1", false), || None, now);
    assert_eq!(m.following(ID), Some(("r1", true)));
}

#[test]
fn another_revision_releases_the_held_one() {
    let mut m = machine(false);
    m.load_state(
        ID,
        RolloutState {
            held: Some("r2".into()),
            ..RolloutState::default()
        },
    );
    let now = Instant::now();
    let mut held = placed("r2", false);
    held.held = true;
    m.in_place(held, || None, now);
    assert!(saved(&m.take_effects()).is_empty(), "still held");
    assert!(m.is_held(ID, "r2"));
    m.in_place(placed("r3", true), || None, now);
    assert_eq!(saved(&m.take_effects()), vec![RolloutState::default()]);
    assert!(!m.is_held(ID, "r2"));
}

#[test]
fn an_update_waits_for_a_slot_reports_before_releasing_and_never_releases_unfollowed() {
    let mut m = machine(true);
    let now = Instant::now();
    let waiting = m.gate(ID, "t2", None, ONE, "");
    assert_eq!(
        waiting,
        Some(Gated::Waiting {
            target: "t2".into(),
            slots: 1
        })
    );
    assert_eq!(
        asks(&m.take_effects()),
        vec![Ask::Acquire {
            id: ID.into(),
            target: "t2".into(),
            slots: 1,
            expires: true,
        }]
    );
    let mut gated = placed("r1", false);
    gated.gated = waiting;
    gated.target = Some("t1".into());
    m.in_place(gated, || None, now);
    let effects = m.take_effects();
    match &asks(&effects)[..] {
        [
            Ask::Report {
                status: Some(s), ..
            },
        ] => {
            assert_eq!(s.phase, "waiting");
            assert_eq!(s.wanted.as_deref(), Some("t2"));
        }
        other => panic!("{other:?}"),
    }
    m.fleet(Answer::Granted {
        id: ID.into(),
        target: "t2".into(),
    });
    assert_eq!(m.take_effects(), vec![Effect::Render { id: ID.into() }]);
    assert_eq!(m.gate(ID, "t2", None, ONE, ""), None, "the slot is held");
    let mut written = placed("r2", true);
    written.target = Some("t2".into());
    m.in_place(written, || None, now);
    m.take_effects();
    // Not following: the slot stays, whatever the verdict.
    m.after_pass();
    assert!(asks(&m.take_effects()).is_empty());
    m.mirror_synced();
    m.in_place(placed("r2", false), || None, now);
    m.after_pass();
    assert!(
        !asks(&m.take_effects()).contains(&Ask::Release { id: ID.into() }),
        "its rollout has no verdict yet"
    );
    // A first revision here (nothing succeeded, no history): it fails
    // without a rollback, and the other nodes hear it before the slot goes.
    m.observe(seen("r2", crash()), now);
    let asked = asks(&m.take_effects());
    let report = asked
        .iter()
        .position(|a| matches!(a, Ask::Report { status: Some(s), .. } if s.failed.is_some()))
        .expect("the failure is reported");
    let release = asked
        .iter()
        .position(|a| *a == Ask::Release { id: ID.into() })
        .expect("the slot is released");
    assert!(report < release, "{asked:?}");
    match &asked[report] {
        Ask::Report {
            status: Some(s), ..
        } => {
            let failed = s.failed.as_ref().unwrap();
            assert_eq!(
                (failed.target.as_str(), failed.revision.as_str()),
                ("t2", "r2")
            );
            assert_eq!(failed.at, at());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_target_failed_elsewhere_halts_with_an_event_and_withdraws_the_ask() {
    let mut m = machine(true);
    let now = Instant::now();
    assert!(m.gate(ID, "t2", None, ONE, "").is_some());
    m.take_effects();
    m.fleet(Answer::Failed(BTreeMap::from([(
        ID.to_string(),
        fleet::Halts {
            targets: BTreeMap::from([("t2".to_string(), "node n2: CrashLoopBackOff".to_string())]),
            ..fleet::Halts::default()
        },
    )])));
    assert_eq!(m.take_effects(), vec![Effect::Render { id: ID.into() }]);
    let halted = m.gate(ID, "t2", None, ONE, "");
    assert!(
        matches!(&halted, Some(Gated::Halted { why, .. }) if why.contains("n2")),
        "{halted:?}"
    );
    assert_eq!(asks(&m.take_effects()), vec![Ask::Cancel { id: ID.into() }]);
    let mut gated = placed("r1", false);
    gated.gated = halted.clone();
    m.in_place(gated.clone(), || None, now);
    let effects = m.take_effects();
    let events = events(&effects);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, Reason::RolloutHalted);
    assert!(
        events[0]
            .1
            .starts_with("node n1: target t2 failed on node n2")
    );
    // Once per change, not per render.
    m.in_place(gated, || None, now);
    assert!(m.take_effects().is_empty());
}

#[test]
fn an_unchanged_manifest_withdraws_an_ask_and_nothing_coordinates_without_slots() {
    let mut m = machine(true);
    m.gate(ID, "t2", None, ONE, "");
    m.take_effects();
    m.unchanged(ID);
    assert_eq!(asks(&m.take_effects()), vec![Ask::Cancel { id: ID.into() }]);

    let mut m = machine(false);
    assert!(!m.coordinated());
    assert_eq!(m.gate(ID, "t2", None, ONE, ""), None);
    m.fleet(Answer::Lost { id: ID.into() });
    assert!(m.take_effects().is_empty());
}

/// A daemon restarted while the API server is down cannot read the
/// template's `podstamp.io/progress-deadline`: the one recorded at the
/// write judges the pending revision, not the default.
#[test]
fn the_deadline_recorded_at_the_write_is_the_pending_revisions_after_a_restart() {
    let mut m = machine(false);
    m.writing(ID, "r2", Duration::from_secs(90));
    let state = saved(&m.take_effects()).pop().unwrap();
    assert_eq!(state.deadline, Some(90));
    // As a restarted daemon reads it back from rollout-states.jsonl.
    let text = serde_json::to_string(&state).unwrap();
    assert_eq!(text, r#"{"pending":"r2","deadline":90}"#);
    let mut restarted = Machine::new("n1", false).with_clock(at);
    restarted.load_state(ID, serde_json::from_str(&text).unwrap());
    assert_eq!(
        restarted.recorded_deadline(ID, "r2"),
        Some(Duration::from_secs(90))
    );
    // Only for the pending revision; a file of before has none.
    assert_eq!(restarted.recorded_deadline(ID, "r1"), None);
    let old: RolloutState = serde_json::from_str(r#"{"pending":"r2"}"#).unwrap();
    assert_eq!(old.deadline_of("r2"), None);
    // Judged by it: failed at 90 s, not at the default 5 min.
    let now = Instant::now();
    restarted.local_available(true);
    let deadline = restarted.recorded_deadline(ID, "r2").unwrap();
    restarted.in_place(
        InPlace {
            deadline,
            ..placed("r2", false)
        },
        || Some("r1".into()),
        now,
    );
    restarted.take_effects();
    assert_eq!(restarted.next_deadline(), Some(now + deadline));
    // Its verdict settles it: no longer pending, no deadline kept.
    restarted.tick(now + deadline);
    restarted.rolled_back(ID, "r1", Ok(()), now + deadline);
    let last = saved(&restarted.take_effects()).pop().unwrap();
    assert_eq!((last.pending, last.deadline), (None, None));
}

#[test]
fn a_template_gone_forgets_its_state_metrics_and_record() {
    let mut m = machine(true);
    let now = Instant::now();
    let mut p = placed("r1", true);
    p.target = Some("t1".into());
    m.in_place(p, || None, now);
    m.take_effects();
    m.forget(ID);
    let effects = m.take_effects();
    assert!(effects.contains(&Effect::ForgetState { id: ID.into() }));
    assert!(effects.contains(&Effect::ForgetMetrics { id: ID.into() }));
    assert!(asks(&effects).contains(&Ask::Report {
        id: ID.into(),
        status: None
    }));
    assert!(!m.knows_state(ID));
}

#[test]
fn a_status_seen_before_the_rollout_applies_to_it() {
    let mut m = machine(false);
    let now = Instant::now();
    m.mirror_synced();
    m.observe(seen("r1", PodState::Ready), now);
    m.in_place(placed("r1", false), || None, now);
    m.tick(now + STABLE);
    assert_eq!(results(&m.take_effects()), vec!["succeeded"]);
}

mod local_evidence {
    //! Local evidence (issue 27, Deliver 2's groundwork): the verdict
    //! rules of [`crate::daemon::rollout::local`] as a table, and the
    //! machine following a rollout through them without the pods watch.

    use super::*;
    use crate::daemon::rollout::local::{
        CRASH_LOOP_RESTARTS, ContainerState, LocalContainer, LocalPodState, LocalProbe, judge,
    };

    fn container(state: ContainerState, restarts: u32) -> LocalContainer {
        LocalContainer {
            name: "main".into(),
            state,
            restart_count: restarts,
            image_missing: None,
        }
    }

    fn pod(containers: Vec<LocalContainer>, probes: Vec<LocalProbe>) -> LocalPodState {
        LocalPodState {
            sandbox: true,
            containers,
            probes,
        }
    }

    fn probe(passing: bool, failures: u32) -> LocalProbe {
        LocalProbe {
            what: "readiness probe of main".into(),
            passing,
            failures,
            failure_threshold: 3,
            message: "GET https://127.0.0.1:6443/readyz: 500".into(),
        }
    }

    fn running() -> LocalPodState {
        pod(vec![container(ContainerState::Running, 0)], vec![])
    }

    /// The phase (and failure reason) of a judged state.
    fn phase(state: &PodState) -> &str {
        match state {
            PodState::Pending => "written",
            PodState::Running => "running",
            PodState::Ready => "ready",
            PodState::Failed { reason, .. } => reason,
        }
    }

    #[test]
    fn the_rules_judge_what_the_node_shows() {
        use ContainerState::*;
        let missing = LocalContainer {
            image_missing: Some("ErrImageNeverPull: image \"api:9\" is not present".into()),
            ..container(Created, 0)
        };
        let exited = |code, restarts| container(Exited { code }, restarts);
        let n = CRASH_LOOP_RESTARTS;
        let table: Vec<(&str, LocalPodState, &str)> = vec![
            (
                "no sandbox: the kubelet did not act",
                LocalPodState::default(),
                "written",
            ),
            (
                "no sandbox, whatever else is said",
                LocalPodState {
                    sandbox: false,
                    ..running()
                },
                "written",
            ),
            (
                "a sandbox, no container yet",
                pod(vec![], vec![]),
                "running",
            ),
            (
                "created",
                pod(vec![container(Created, 0)], vec![]),
                "running",
            ),
            (
                "running without probes: Ready, as the kubelet says",
                running(),
                "ready",
            ),
            (
                "the image not present",
                pod(vec![missing.clone()], vec![]),
                "ImageNotPresent",
            ),
            (
                "the image not present, beside a running container",
                pod(vec![container(Running, 0), missing], vec![]),
                "ImageNotPresent",
            ),
            (
                "exited 1 once: not yet a loop",
                pod(vec![exited(1, n - 1)], vec![]),
                "running",
            ),
            (
                "exited 1, restarted enough: a crash loop",
                pod(vec![exited(1, n)], vec![]),
                "CrashLoopBackOff",
            ),
            (
                "exited 0, restarted: not a crash",
                pod(vec![exited(0, n + 3)], vec![]),
                "running",
            ),
            (
                "a probe passing",
                pod(vec![container(Running, 0)], vec![probe(true, 0)]),
                "ready",
            ),
            (
                "a probe failing, under its threshold",
                pod(vec![container(Running, 0)], vec![probe(false, 2)]),
                "running",
            ),
            (
                "a probe failing its threshold",
                pod(vec![container(Running, 0)], vec![probe(false, 3)]),
                "ProbeFailed",
            ),
            (
                "one probe of two passing",
                pod(
                    vec![container(Running, 0)],
                    vec![probe(true, 0), probe(false, 1)],
                ),
                "running",
            ),
            (
                "one container of two running",
                pod(vec![container(Running, 0), container(Created, 0)], vec![]),
                "running",
            ),
        ];
        for (what, state, want) in table {
            assert_eq!(phase(&judge(&state)), want, "{what}: {state:?}");
        }
        let PodState::Failed { message, .. } = judge(&pod(vec![exited(137, 4)], vec![])) else {
            panic!("a crash loop");
        };
        assert_eq!(
            message,
            "container main exited with code 137, restarted 4 times (seen on the node)"
        );
        let PodState::Failed { message, .. } =
            judge(&pod(vec![container(Running, 0)], vec![probe(false, 3)]))
        else {
            panic!("a failed probe");
        };
        assert!(message.contains("failureThreshold 3") && message.contains("/readyz: 500"));
    }

    /// `r1` good, then `r2` written while the pods watch is down and only
    /// local evidence is available.
    fn r2_with_the_api_down(now: Instant) -> Machine {
        let mut m = machine(false);
        with_good(&mut m, now);
        m.mirror_lost();
        assert!(m.local_available(true), "news: rollouts followed again");
        m.writing(ID, "r2", MINUTE);
        m.in_place(placed("r2", true), || None, now);
        m.take_effects();
        m
    }

    #[test]
    fn a_crash_loop_seen_on_the_node_is_rolled_back_without_the_api() {
        let now = Instant::now();
        let mut m = r2_with_the_api_down(now);
        // What the old revision shows never judges the new one.
        let crashing = pod(
            vec![container(
                ContainerState::Exited { code: 1 },
                CRASH_LOOP_RESTARTS,
            )],
            vec![],
        );
        m.local(ID, "r1", &crashing, now);
        assert!(m.take_effects().is_empty());
        m.local(ID, "r2", &LocalPodState::default(), now);
        m.local(ID, "r2", &crashing, now);
        let effects = m.take_effects();
        assert_eq!(results(&effects), vec!["failed"]);
        assert_eq!(
            effects.last(),
            Some(&Effect::RollBack {
                id: ID.into(),
                revision: "r1".into(),
                failed: "r2".into()
            })
        );
        m.rolled_back(ID, "r1", Ok(()), now);
        let effects = m.take_effects();
        assert_eq!(results(&effects), vec!["rolled_back"]);
        let events = events(&effects);
        assert_eq!(events[0].0, Reason::RolloutFailed, "{events:?}");
        assert!(events[0].1.contains("CrashLoopBackOff"), "{events:?}");
        assert!(m.is_held(ID, "r2"));
    }

    #[test]
    fn ready_on_the_node_for_a_while_succeeds_and_not_ready_by_the_deadline_fails() {
        let now = Instant::now();
        let mut m = r2_with_the_api_down(now);
        m.local(ID, "r2", &running(), now);
        m.tick(now + STABLE);
        let effects = m.take_effects();
        assert_eq!(results(&effects), vec!["succeeded"]);

        let mut m = r2_with_the_api_down(now);
        let starting = pod(
            vec![container(ContainerState::Running, 0)],
            vec![probe(false, 1)],
        );
        m.local(ID, "r2", &starting, now);
        m.tick(now + MINUTE);
        let effects = m.take_effects();
        assert_eq!(results(&effects), vec!["failed"]);
        assert_eq!(
            effects.last(),
            Some(&Effect::RollBack {
                id: ID.into(),
                revision: "r1".into(),
                failed: "r2".into()
            })
        );
        m.rolled_back(ID, "r1", Ok(()), now + MINUTE);
        let effects = m.take_effects();
        assert!(
            events(&effects)
                .iter()
                .any(|(r, note)| *r == Reason::RolloutFailed && note.contains(DEADLINE_EXCEEDED)),
            "{effects:?}"
        );
    }

    fn stalled(effects: &[Effect]) -> Vec<bool> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Stalled { stalled, .. } => Some(*stalled),
                _ => None,
            })
            .collect()
    }

    /// kubernetes/kubernetes#105543, as seen with the real kubelet
    /// restarted while its API server was down: the bad revision crashes,
    /// is rolled back, and the kubelet never makes a sandbox for the
    /// revision rolled back to. Not that revision's failure: a stall,
    /// reported once (log, Event, metric, status message), judged anew
    /// once the kubelet starts it.
    #[test]
    fn a_revision_rolled_back_to_that_the_kubelet_never_starts_is_its_stall_not_a_failure() {
        let now = Instant::now();
        let mut m = r2_with_the_api_down(now);
        let crashing = pod(
            vec![container(
                ContainerState::Exited { code: 2 },
                CRASH_LOOP_RESTARTS,
            )],
            vec![],
        );
        m.local(ID, "r2", &crashing, now);
        m.take_effects();
        m.rolled_back(ID, "r1", Ok(()), now);
        m.take_effects();
        // No ready sandbox of r1 (its old one was stopped).
        m.local(ID, "r1", &LocalPodState::default(), now);
        m.tick(now + MINUTE / 2);
        assert!(
            m.take_effects()
                .iter()
                .all(|e| matches!(e, Effect::Phase { .. }))
        );
        m.tick(now + MINUTE);
        let effects = m.take_effects();
        assert!(results(&effects).is_empty(), "no verdict: {effects:?}");
        assert_eq!(stalled(&effects), vec![true]);
        assert_eq!(
            events(&effects),
            vec![(
                Reason::KubeletNotStarted,
                "node n1: the kubelet has not started revision r1: no sandbox after 60 s; kubernetes/kubernetes#105543".to_string()
            )]
        );
        // Once: nothing more is due while the kubelet does nothing.
        assert_eq!(m.next_deadline(), None);
        m.tick(now + 10 * MINUTE);
        assert!(m.take_effects().is_empty());
        // The kubelet starts it (say, restarted again): judged from then.
        let later = now + 10 * MINUTE;
        m.local(ID, "r1", &running(), later);
        let effects = m.take_effects();
        assert_eq!(stalled(&effects), vec![false]);
        assert_eq!(m.next_deadline(), Some(later + STABLE));
        m.tick(later + STABLE);
        let effects = m.take_effects();
        assert_eq!(results(&effects), vec!["succeeded"]);
        assert!(m.is_held(ID, "r2"));

        // Started, but never ready: its deadline counts from the start.
        let mut m = r2_with_the_api_down(now);
        m.local(ID, "r2", &crashing, now);
        m.rolled_back(ID, "r1", Ok(()), now);
        m.local(ID, "r1", &LocalPodState::default(), now);
        m.tick(now + MINUTE);
        m.take_effects();
        let starting = pod(
            vec![container(ContainerState::Running, 0)],
            vec![probe(false, 1)],
        );
        m.local(ID, "r1", &starting, later);
        m.tick(later + MINUTE / 2);
        assert!(results(&m.take_effects()).is_empty());
        m.tick(later + MINUTE);
        assert_eq!(results(&m.take_effects()), vec!["failed"]);
    }

    /// A new revision the kubelet never starts still fails (what is in place
    /// when the kubelet acts again must be the good one), said as the
    /// kubelet's doing.
    #[test]
    fn a_new_revision_the_kubelet_never_starts_fails_as_kubelet_not_started_and_is_rolled_back() {
        let now = Instant::now();
        let mut m = r2_with_the_api_down(now);
        m.local(ID, "r2", &LocalPodState::default(), now);
        m.tick(now + MINUTE);
        let effects = m.take_effects();
        assert_eq!(results(&effects), vec!["failed"]);
        assert!(stalled(&effects).is_empty());
        m.rolled_back(ID, "r1", Ok(()), now + MINUTE);
        let said = events(&m.take_effects());
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(said[0].0, Reason::RolloutFailed);
        assert!(
            said[0].1.contains("KubeletNotStarted: the kubelet has not started revision r2: no sandbox after 60 s; kubernetes/kubernetes#105543"),
            "{said:?}"
        );
        // Through the mirror pod, a pending pod is not the kubelet's stall.
        let mut m = machine(false);
        with_good(&mut m, now);
        m.in_place(placed("r2", true), || None, now);
        m.observe(seen("r2", PodState::Pending), now);
        m.tick(now + MINUTE);
        m.rolled_back(ID, "r1", Ok(()), now + MINUTE);
        let events = events(&m.take_effects());
        assert!(events[0].1.contains(DEADLINE_EXCEEDED), "{events:?}");
    }

    #[test]
    fn without_local_evidence_or_with_the_mirror_pod_followed_it_judges_nothing() {
        let now = Instant::now();
        let crashing = pod(
            vec![container(ContainerState::Exited { code: 1 }, 5)],
            vec![],
        );
        // The pods watch down, no local evidence: nothing is followed.
        let mut m = machine(false);
        with_good(&mut m, now);
        m.mirror_lost();
        m.in_place(placed("r2", true), || None, now);
        m.take_effects();
        m.local(ID, "r2", &crashing, now);
        m.tick(now + 10 * MINUTE);
        assert!(results(&m.take_effects()).is_empty());

        // The mirror pod followed: it decides, the node's word is ignored.
        let mut m = machine(false);
        with_good(&mut m, now);
        m.local_available(true);
        m.in_place(placed("r2", true), || None, now);
        m.take_effects();
        m.local(ID, "r2", &crashing, now);
        assert!(results(&m.take_effects()).is_empty());
        m.observe(seen("r2", PodState::Ready), now);
        m.tick(now + STABLE);
        assert_eq!(results(&m.take_effects()), vec!["succeeded"]);

        // Local evidence lost too: the rollout without a verdict is
        // followed anew once either is back.
        let mut m = r2_with_the_api_down(now);
        assert!(!m.local_available(false));
        m.tick(now + 10 * MINUTE);
        assert!(results(&m.take_effects()).is_empty());
    }
}

/// While both can be read, the mirror pod and the node are cross-checked:
/// a disagreement that lasts is said once and counted; the mirror pod
/// still decides.
#[test]
fn a_lasting_disagreement_of_the_mirror_pod_and_the_node_is_said_once_and_the_mirror_pod_decides() {
    use crate::daemon::rollout::DISAGREE_AFTER;
    let disagreed = |effects: &[Effect]| {
        effects
            .iter()
            .filter(|e| matches!(e, Effect::Disagreed { .. }))
            .count()
    };
    let node = |revision: &str, state: PodState| Observation {
        pod: ObjectReference::default(),
        ..seen(revision, state)
    };
    let now = Instant::now();
    let mut m = machine(false);
    m.local_available(true);
    with_good(&mut m, now);
    m.in_place(placed("r2", true), || None, now);
    m.observe(seen("r2", PodState::Ready), now);
    // The node shows no running container of r2.
    m.local_observed(node("r2", PodState::Pending), now);
    assert_eq!(m.next_deadline(), Some(now + DISAGREE_AFTER));
    m.tick(now + DISAGREE_AFTER / 2);
    assert_eq!(
        disagreed(&m.take_effects()),
        0,
        "a moment is no disagreement"
    );
    m.tick(now + DISAGREE_AFTER);
    let effects = m.take_effects();
    assert_eq!(disagreed(&effects), 1);
    // The mirror pod decides: Ready for 10 s is a success.
    m.tick(now + STABLE);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["succeeded"]);
    assert_eq!(disagreed(&effects), 0, "said once");
    // They agree again, then the reverse: the mirror pod says failed, the
    // node shows it all running.
    m.local_observed(node("r2", PodState::Ready), now + STABLE);
    m.in_place(placed("r3", true), || None, now);
    m.observe(seen("r3", crash()), now);
    m.take_effects();
    m.local_observed(node("r3", PodState::Ready), now);
    m.tick(now + DISAGREE_AFTER);
    assert_eq!(disagreed(&m.take_effects()), 1);
    // Without local evidence there is nothing to cross-check.
    let mut m = machine(false);
    with_good(&mut m, now);
    m.local_observed(node("r1", PodState::Pending), now);
    m.tick(now + MINUTE);
    assert_eq!(disagreed(&m.take_effects()), 0);
}

/// A quorum member (`podstamp.io/quorum: "true"`): `r2` granted its one
/// slot and written over a good `r1`, on a machine that follows rollouts.
fn quorum_member_writing_r2(now: Instant) -> Machine {
    let mut m = machine(true);
    with_good(&mut m, now);
    assert!(m.gate(ID, "t2", None, Policy::Quorum, "").is_some());
    assert_eq!(
        asks(&m.take_effects()),
        vec![Ask::Acquire {
            id: ID.into(),
            target: "t2".into(),
            slots: 1,
            expires: false,
        }]
    );
    m.fleet(Answer::Granted {
        id: ID.into(),
        target: "t2".into(),
    });
    assert_eq!(
        m.gate(ID, "t2", None, Policy::Quorum, ""),
        None,
        "the slot is held"
    );
    let mut written = placed("r2", true);
    written.target = Some("t2".into());
    written.quorum = true;
    m.in_place(written, || None, now);
    m.take_effects();
    m
}

fn released(m: &mut Machine) -> bool {
    asks(&m.take_effects()).contains(&Ask::Release { id: ID.into() })
}

#[test]
fn a_quorum_members_slot_is_kept_through_a_failure_until_the_revision_rolled_back_to_is_ready() {
    let now = Instant::now();
    let mut m = quorum_member_writing_r2(now);
    m.observe(seen("r2", crash()), now);
    let effects = m.take_effects();
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::RollBack { revision, .. } if revision == "r1")),
        "{effects:?}"
    );
    m.rolled_back(ID, "r1", Ok(()), now);
    let asked = asks(&m.take_effects());
    assert!(
        asked
            .iter()
            .any(|a| matches!(a, Ask::Report { status: Some(s), .. } if s.failed.is_some())),
        "the failure is reported at once: {asked:?}"
    );
    assert!(
        !asked.contains(&Ask::Release { id: ID.into() }),
        "the member is still down: {asked:?}"
    );
    m.after_pass();
    assert!(!released(&mut m), "r1 is not back yet");
    m.observe(seen("r1", PodState::Ready), now);
    m.after_pass();
    assert!(!released(&mut m), "Ready, not yet for long enough");
    m.tick(now + STABLE);
    m.after_pass();
    assert!(released(&mut m), "r1 Ready again: the next member may go");
}

#[test]
fn a_quorum_member_whose_rollback_fails_too_keeps_its_slot() {
    let now = Instant::now();
    let mut m = quorum_member_writing_r2(now);
    m.observe(seen("r2", crash()), now);
    m.rolled_back(ID, "r1", Ok(()), now);
    m.take_effects();
    m.observe(seen("r1", crash()), now);
    m.tick(now + MINUTE * 2);
    m.after_pass();
    assert!(
        !released(&mut m),
        "no member of the quorum may follow it down"
    );
}

#[test]
fn a_quorum_members_success_frees_its_slot_as_any_other() {
    let now = Instant::now();
    let mut m = quorum_member_writing_r2(now);
    m.observe(seen("r2", PodState::Ready), now);
    m.tick(now + STABLE);
    assert!(released(&mut m));
}

/// The failure this node reports last in `effects`, if any.
fn reported_failure(effects: &[Effect]) -> Option<fleet::Failed> {
    asks(effects)
        .into_iter()
        .filter_map(|a| match a {
            Ask::Report {
                status: Some(s), ..
            } => Some(s.failed),
            _ => None,
        })
        .next_back()
        .flatten()
}

/// `revision` of target `target`, change `change`, placed by this node's
/// render (`written`: by this render).
fn placed_for(revision: &str, written: bool, target: &str, change: &str) -> InPlace {
    InPlace {
        target: Some(target.into()),
        change: Some(change.into()),
        ..placed(revision, written)
    }
}

/// Another node's per-node settings make another target of one change:
/// the change failed there halts this node's update to its own target,
/// with the same Event as a target halt; another change rolls.
#[test]
fn a_change_that_failed_on_another_node_halts_this_nodes_target_of_it() {
    let mut m = machine(true);
    let now = Instant::now();
    assert!(m.gate(ID, "t2-n1", Some("c2"), ONE, "").is_some());
    m.take_effects();
    m.fleet(Answer::Failed(BTreeMap::from([(
        ID.to_string(),
        fleet::Halts {
            changes: BTreeMap::from([(
                "c2".to_string(),
                "node n2 (its target t2-n2): CrashLoopBackOff: exit 2".to_string(),
            )]),
            ..fleet::Halts::default()
        },
    )])));
    assert_eq!(m.take_effects(), vec![Effect::Render { id: ID.into() }]);
    let halted = m.gate(ID, "t2-n1", Some("c2"), ONE, "");
    assert_eq!(
        halted,
        Some(Gated::Halted {
            target: "t2-n1".into(),
            why: "change c2 (target t2-n1 here) failed on node n2 (its target t2-n2): CrashLoopBackOff: exit 2".into()
        })
    );
    assert_eq!(asks(&m.take_effects()), vec![Ask::Cancel { id: ID.into() }]);
    let mut gated = placed_for("r1", false, "t1-n1", "c1");
    gated.gated = halted;
    m.in_place(gated, || None, now);
    let effects = m.take_effects();
    let events = events(&effects);
    assert_eq!(events.len(), 1, "{effects:?}");
    assert_eq!(events[0].0, Reason::RolloutHalted);
    assert!(events[0].1.starts_with("node n1: change c2"), "{events:?}");
    // A target whose change is not known (nothing to compare) is not
    // halted by a change; a new change (the template fixed) rolls.
    assert!(matches!(
        m.gate(ID, "t2-n1", None, ONE, ""),
        Some(Gated::Waiting { .. })
    ));
    assert!(matches!(
        m.gate(ID, "t3-n1", Some("c3"), ONE, ""),
        Some(Gated::Waiting { .. })
    ));
}

/// This node's failure names its change while it halts the others: the
/// rollback it confirms (a target of the same change, when only settings
/// changed) lifts nothing; a written update to another target of the
/// change, rendered once its own settings are fixed, does — its failed
/// target is still named.
#[test]
fn a_failure_stops_naming_its_change_once_this_node_confirms_a_fixed_target_of_it() {
    let mut m = machine(true);
    let now = Instant::now();
    m.mirror_synced();
    m.in_place(placed_for("r1", true, "t1", "c"), || None, now);
    m.observe(seen("r1", PodState::Ready), now);
    m.tick(now + STABLE);
    m.take_effects();
    // Settings only (the same change c) make target t2: it fails here.
    assert!(m.gate(ID, "t2", Some("c"), ONE, "").is_some());
    m.fleet(Answer::Granted {
        id: ID.into(),
        target: "t2".into(),
    });
    assert_eq!(m.gate(ID, "t2", Some("c"), ONE, ""), None);
    m.writing(ID, "r2", MINUTE);
    m.in_place(placed_for("r2", true, "t2", "c"), || None, now);
    m.observe(seen("r2", crash()), now);
    m.take_effects();
    m.rolled_back(ID, "r1", Ok(()), now);
    let effects = m.take_effects();
    let failed = reported_failure(&effects).expect("reported");
    assert_eq!(
        (failed.target.as_str(), failed.change.as_deref()),
        ("t2", Some("c"))
    );
    let state = saved(&effects).pop().expect("saved");
    assert_eq!(state.failed, Some(failed), "kept for a restart");
    // The rollback to r1 (target t1, change c) is confirmed: r2 is held,
    // the change still halts the others.
    let later = now + MINUTE;
    let held = InPlace {
        held: true,
        ..placed_for("r2", false, "t2", "c")
    };
    m.in_place(held, || None, later);
    m.observe(seen("r1", PodState::Ready), later);
    m.tick(later + STABLE);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["succeeded"], "{effects:?}");
    if let Some(failed) = reported_failure(&effects) {
        assert_eq!(failed.change.as_deref(), Some("c"), "still named");
    }
    assert!(m.is_held(ID, "r2"));
    // The daemon restarts (its state as saved), then its settings are
    // fixed: the template renders r3 (target t3, change c), written,
    // Ready for STABLE, and the failure stops naming c.
    let state = saved(&effects).pop().unwrap_or(state);
    let mut m = Machine::new("n1", true).with_clock(at);
    m.load_state(ID, state);
    m.mirror_synced();
    m.in_place(
        InPlace {
            held: true,
            ..placed_for("r2", false, "t2", "c")
        },
        || None,
        later,
    );
    m.take_effects();
    let fixed = later + 2 * MINUTE;
    assert!(m.gate(ID, "t3", Some("c"), ONE, "").is_some());
    m.fleet(Answer::Granted {
        id: ID.into(),
        target: "t3".into(),
    });
    m.writing(ID, "r3", MINUTE);
    m.in_place(placed_for("r3", true, "t3", "c"), || None, fixed);
    assert!(!m.is_held(ID, "r2"), "another revision renders");
    m.observe(seen("r3", PodState::Ready), fixed);
    m.take_effects();
    m.tick(fixed + STABLE);
    let effects = m.take_effects();
    assert_eq!(results(&effects), vec!["succeeded"]);
    let failed = reported_failure(&effects).expect("the lifted failure is reported");
    assert_eq!(
        (failed.target.as_str(), failed.change.as_deref()),
        ("t2", None)
    );
    assert_eq!(saved(&effects).pop().and_then(|s| s.failed), Some(failed));
}
