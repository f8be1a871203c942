//! The plugin chain: each plugin's output is the next one's input.
//!
//! Between plugins the pod travels as the JSON text the previous plugin
//! returned. After each step the host scans that text, to blame the right
//! plugin for invalid JSON or a renamed pod, but builds nothing from it but
//! the metadata; only the last step's output is parsed into a value.
//!
//! Each step has a [`Scope`]: the fields its plugin may change. When a
//! step's output differs from its input (as text: an unchanged text is an
//! unchanged pod, and costs no parse), the two texts are compared
//! ([`Scope::check_text`]: a part with the same bytes on both sides is not
//! read, and nothing is built whole) and a change outside the scope fails
//! the step, naming the first such field; only a step with no scope at all
//! (`podstamp render --plugin`) is merely probed. `render --explain` and the
//! debug log, which list what each plugin changed, compare the two as
//! values instead, with the same verdict. A step remembers the (input, output) pairs
//! that passed, by keyed hashes of the texts, so that rendering a template
//! again the same way costs two hashes, not a parse and a walk.
//!
//! A chain may carry a time budget for the whole of one render: each call's
//! deadline is then the earlier of the plugin's own timeout and what is left
//! of the budget, so no call runs past it, and a step that finds none left is
//! not called. Running out is a failure of the step where it happened.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::plugin::{CallFailure, Plugin, PluginInfo, WitNode};
use crate::scope::{self, Change, Scope};
use crate::template::{self, Template};

/// The most changes `render --explain` lists for one plugin.
pub const EXPLAIN_LIMIT: usize = 40;

/// One configured plugin: a catalog name, the loaded component and its settings.
#[derive(Debug)]
pub struct Step {
    pub name: String,
    pub plugin: Plugin,
    /// The settings as compact JSON, made once at load time.
    pub settings_json: String,
    /// What the plugin may change; the default scope unless granted more.
    pub scope: Scope,
    /// The (input, output) text pairs whose scope check passed, by a keyed
    /// hash of each text: the same pair passes again without a parse or a
    /// walk (a resync renders every template the same way).
    passed: Mutex<HashSet<(u64, u64)>>,
}

/// The most pairs one step remembers; past it, it starts again (a bound on
/// memory, 16 bytes a pair, whatever the number of templates).
const PASSED_LIMIT: usize = 4096;

/// A hash of `text` keyed once per process, so that no plugin can aim at
/// a pair the memo holds without knowing the key.
fn text_hash(text: &str) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(text)
}

impl Step {
    /// A step with the default scope ([`scope::DEFAULT_GRANTS`]).
    pub fn new(name: String, plugin: Plugin, settings: &Value) -> Step {
        Step {
            name,
            plugin,
            settings_json: settings.to_string(),
            scope: Scope::default(),
            passed: Mutex::default(),
        }
    }

    /// This step, with `scope` granted instead.
    pub fn with_scope(mut self, scope: Scope) -> Step {
        self.scope = scope;
        self.passed = Mutex::default();
        self
    }

    /// `pair` passed this step's scope check.
    fn remember(&self, pair: (u64, u64)) {
        let mut passed = self.lock_passed();
        if passed.len() >= PASSED_LIMIT {
            passed.clear();
        }
        passed.insert(pair);
    }

    fn lock_passed(&self) -> std::sync::MutexGuard<'_, HashSet<(u64, u64)>> {
        self.passed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a plugin's declared scope `declared` says of a change it made at
/// `needed` that its catalog entry does not grant: whether it declared it.
fn declaration_note(declared: &[String], needed: &str) -> String {
    let list = if declared.is_empty() {
        "nothing".to_string()
    } else {
        declared.join(", ")
    };
    if Scope::declares(declared, needed) {
        format!(
            "the plugin declares this change (it declares: {list}), which its catalog entry does not grant"
        )
    } else {
        format!("the plugin did not declare this change (it declares: {list})")
    }
}

/// What one step changed, for `podstamp render --explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepChanges {
    pub step: String,
    pub plugin: PluginInfo,
    /// What the plugin declares it changes (None: nothing declared), and
    /// the declared grants its scope does not cover.
    pub declared: Option<Vec<String>>,
    pub not_granted: Vec<String>,
    /// Its scope as the catalog gave it.
    pub granted: String,
    /// At most [`EXPLAIN_LIMIT`] changes, and how many more there were.
    pub changes: Vec<Change>,
    pub more: usize,
}

/// An ordered list of steps; empty is a passthrough.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    steps: Vec<Arc<Step>>,
    /// The most one [`Chain::apply`] may take; None: only each call's timeout.
    budget: Option<Duration>,
}

/// Which step failed, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainFailure {
    /// 1-based position in the chain.
    pub position: usize,
    pub chain_length: usize,
    /// The step's catalog name.
    pub step: String,
    pub plugin: PluginInfo,
    pub failure: StepFailure,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepFailure {
    Call(CallFailure),
    InvalidJson(String),
    NotAnObject,
    Renamed {
        from: String,
        to: String,
    },
    /// The render's time budget ran out during this step's call, or before it.
    OutOfTime {
        budget: Duration,
    },
    /// The plugin changed a field its scope does not grant.
    OutOfScope {
        change: Change,
        /// The grant that would allow the change.
        needed: String,
        /// The step's scope, as written.
        scope: String,
        /// The component's sha256: which build of the plugin did it.
        sha256: String,
        /// What the plugin's own declaration says of the change
        /// ([`declaration_note`]); None: it declares nothing.
        declared: Option<Box<str>>,
    },
}

impl fmt::Display for ChainFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin {} of {} `{}` ({}): ",
            self.position, self.chain_length, self.step, self.plugin
        )?;
        match &self.failure {
            StepFailure::Call(failure) => write!(f, "{failure}"),
            StepFailure::InvalidJson(e) => write!(f, "returned invalid JSON: {e}"),
            StepFailure::NotAnObject => f.write_str("returned JSON that is not an object"),
            StepFailure::Renamed { from, to } => write!(
                f,
                "metadata.name: changed the pod's name from {from:?} to {to:?}; a pod keeps its PodTemplate's name"
            ),
            // No time spent in the message: an unchanged failure must read the
            // same at every resync, to be reported once.
            StepFailure::OutOfTime { budget } => write!(
                f,
                "the render's time budget of {} ms (limits.renderTimeout) ran out at this plugin; the render was stopped",
                budget.as_millis()
            ),
            StepFailure::OutOfScope {
                change,
                needed,
                scope,
                sha256,
                declared,
            } => {
                write!(
                    f,
                    "{change}, outside the plugin's scope: {scope}; the change is refused (plugin sha256 {sha256}); if this plugin may change it, grant it in its catalog entry: scope: [{needed}]"
                )?;
                match declared {
                    Some(note) => write!(f, "; {note}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl Chain {
    /// A chain with no budget but each call's own timeout.
    pub fn new(steps: Vec<Arc<Step>>) -> Chain {
        Chain {
            steps,
            budget: None,
        }
    }

    /// This chain, with one render through it limited to `budget` in all.
    pub fn with_budget(mut self, budget: Duration) -> Chain {
        self.budget = Some(budget);
        self
    }

    pub fn steps(&self) -> &[Arc<Step>] {
        &self.steps
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The identity of what this chain does: sha256 over each step's name,
    /// component sha256 and settings JSON, in order, and the render budget.
    /// Two chains that render the same way have the same fingerprint, so a
    /// new catalog re-renders only the templates whose fingerprint changed.
    /// Every field is length-prefixed: no two different chains hash the same
    /// bytes.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(&(self.steps.len() as u64).to_le_bytes());
        for step in &self.steps {
            field(step.name.as_bytes());
            field(step.plugin.sha256().as_bytes());
            field(step.settings_json.as_bytes());
            // A new scope may refuse what rendered before, or allow it.
            field(step.scope.to_string().as_bytes());
        }
        match self.budget {
            Some(budget) => field(&budget.as_nanos().to_le_bytes()),
            None => field(b"no budget"),
        }
        hash.finalize().into()
    }

    /// What this chain is without its settings: sha256 over each step's
    /// name, component sha256 and scope, in order (no settings, no budget:
    /// both are the node's configuration and may differ per node). Nodes
    /// whose chains differ only by settings have one shape: a rollout's
    /// change ([`crate::fleet::change`]) is the same on all of them, where
    /// its target ([`Chain::fingerprint`]) is not.
    pub fn shape(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(b"shape");
        field(&(self.steps.len() as u64).to_le_bytes());
        for step in &self.steps {
            field(step.name.as_bytes());
            field(step.plugin.sha256().as_bytes());
            field(step.scope.to_string().as_bytes());
        }
        hash.finalize().into()
    }

    /// Runs every step over `pod`. `subject` names the render in plugin logs.
    pub fn apply(
        &self,
        pod: &Value,
        node: &WitNode,
        subject: &str,
    ) -> Result<Value, Box<ChainFailure>> {
        self.run(Start::parsed(pod), node, subject, &mut |_, _, _| {}, None)
    }

    /// Runs every step over `template`'s pod, telling `observe` about every
    /// plugin call: the step, whether the call succeeded, and how long it
    /// took. The pod starts as the template's text; it is parsed only when
    /// a step's changes must be compared as values.
    pub fn apply_observed(
        &self,
        template: &Template,
        node: &WitNode,
        subject: &str,
        observe: &mut dyn FnMut(&Step, bool, Duration),
    ) -> Result<Value, Box<ChainFailure>> {
        self.run(Start::template(template), node, subject, observe, None)
    }

    /// [`Chain::apply_observed`], adding to `explain` what each step that
    /// ran to its end changed (a failed step has no entry).
    pub fn apply_explained(
        &self,
        template: &Template,
        node: &WitNode,
        subject: &str,
        observe: &mut dyn FnMut(&Step, bool, Duration),
        explain: &mut Vec<StepChanges>,
    ) -> Result<Value, Box<ChainFailure>> {
        self.run(
            Start::template(template),
            node,
            subject,
            observe,
            Some(explain),
        )
    }

    fn run(
        &self,
        start: Start<'_>,
        node: &WitNode,
        subject: &str,
        observe: &mut dyn FnMut(&Step, bool, Duration),
        mut explain: Option<&mut Vec<StepChanges>>,
    ) -> Result<Value, Box<ChainFailure>> {
        let Start {
            mut text,
            name,
            parsed,
        } = start;
        if self.steps.is_empty() {
            return Ok(match parsed {
                Some(pod) => pod.clone(),
                None => template::parse_pod(&text),
            });
        }
        let debug = tracing::enabled!(tracing::Level::DEBUG);
        // A budget too large to add to the clock is no budget.
        let deadline = self
            .budget
            .and_then(|budget| Some((budget, Instant::now().checked_add(budget)?)));
        // The pod `text` holds, when it is parsed (the caller's, or a
        // step's output built for a check): the "before" of the next step's
        // scope check. Otherwise the text is parsed when a check needs it.
        let mut known: Option<Cow<'_, Value>> = parsed.map(Cow::Borrowed);
        // The memo's hash of `text`, when the step that made it hashed it:
        // one step's output is the next one's input, hashed once.
        let mut text_key: Option<u64> = None;
        for (index, step) in self.steps.iter().enumerate() {
            let fail = |failure| self.failure(index, failure);
            let started = Instant::now();
            let left = match deadline {
                Some((budget, at)) => {
                    let left = at.saturating_duration_since(started);
                    if left.is_zero() {
                        return Err(fail(StepFailure::OutOfTime { budget }));
                    }
                    left
                }
                None => Duration::MAX,
            };
            let output =
                step.plugin
                    .transform_within(&text, node, &step.settings_json, subject, left);
            observe(step, output.is_ok(), started.elapsed());
            let output = output.map_err(|e| match (e, deadline) {
                // The call was given what was left of the budget, less than
                // its own timeout: the budget stopped it.
                (CallFailure::DeadlineExceeded { timeout }, Some((budget, _)))
                    if timeout >= left =>
                {
                    fail(StepFailure::OutOfTime { budget })
                }
                (e, _) => fail(StepFailure::Call(e)),
            })?;
            let last = index + 1 == self.steps.len();
            // The same text is the same pod: nothing changed, nothing to
            // parse or check (identity plugins, a substitute with nothing
            // to substitute).
            if output == text {
                if let Some(explain) = explain.as_deref_mut() {
                    explain.push(self.changes(index, Vec::new(), 0));
                }
                if last {
                    return match known {
                        Some(pod) => Ok(pod.into_owned()),
                        None => parse_output(&text).map_err(fail),
                    };
                }
                continue;
            }
            let compare = !step.scope.is_unrestricted() || explain.is_some() || debug;
            // Only a verdict wanted, no list of changes: the two texts are
            // compared as they are, nothing built but what differs.
            let by_text = !step.scope.is_unrestricted() && explain.is_none() && !debug;
            // A pair that passed this step's check before passes again.
            let pair = by_text.then(|| {
                let input = text_key.unwrap_or_else(|| text_hash(&text));
                (input, text_hash(&output))
            });
            if let Some(pair) = pair
                && step.lock_passed().contains(&pair)
            {
                if last {
                    return parse_output(&output).map_err(fail);
                }
                text = output;
                text_key = Some(pair.1);
                known = None;
                continue;
            }
            if !last && !compare {
                // Only probed: blame the right plugin for invalid JSON or a
                // renamed pod, and build nothing.
                self.probe(index, &name, &output)?;
                text = output;
                text_key = None;
                known = None;
                continue;
            }
            if let Some(pair) = pair {
                // Checked as a pod first, so the texts are JSON: only the
                // last output is built, as it is returned.
                let after = if last {
                    let after = parse_output(&output).map_err(fail)?;
                    let new_name = after.pointer("/metadata/name").unwrap_or(&Value::Null);
                    self.check_name(index, &name, new_name)?;
                    Some(after)
                } else {
                    self.probe(index, &name, &output)?;
                    None
                };
                step.scope
                    .check_text(&text, &output)
                    .map_err(|e| fail(StepFailure::InvalidJson(e.to_string())))?
                    .map_err(|overstep| self.out_of_scope(index, *overstep))?;
                step.remember(pair);
                if let Some(after) = after {
                    return Ok(after);
                }
                text = output;
                text_key = Some(pair.1);
                known = None;
                continue;
            }
            let after = parse_output(&output).map_err(fail)?;
            let new_name = after
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null);
            self.check_name(index, &name, &new_name)?;
            if compare {
                // The input was checked as a pod when it was made.
                let before = match known.take() {
                    Some(pod) => pod,
                    None => Cow::Owned(parse_output(&text).map_err(fail)?),
                };
                step.scope
                    .check(&before, &after)
                    .map_err(|overstep| self.out_of_scope(index, *overstep))?;
                if explain.is_some() || debug {
                    let (changes, more) = scope::diff(&before, &after, EXPLAIN_LIMIT);
                    if debug {
                        let fields = scope::top_level_fields(&changes).join(", ");
                        tracing::debug!(subject, plugin = %step.name, changed = %fields, "a plugin changed the pod");
                    }
                    if let Some(explain) = explain.as_deref_mut() {
                        explain.push(self.changes(index, changes, more));
                    }
                }
            }
            if last {
                return Ok(after);
            }
            // Compared as values (or not at all): no memo key was made.
            text = output;
            text_key = None;
            known = Some(Cow::Owned(after));
        }
        unreachable!("a chain of steps returns from its last step")
    }

    /// Fails the step at `index` when its `output` is not a JSON object
    /// or renames the pod, without building the pod.
    fn probe(&self, index: usize, name: &Value, output: &str) -> Result<(), Box<ChainFailure>> {
        let new_name = name_in(output)
            .map_err(|failure| self.failure(index, failure))?
            .unwrap_or(Value::Null);
        self.check_name(index, name, &new_name)
    }

    /// Fails the step at `index` when it renamed the pod.
    fn check_name(
        &self,
        index: usize,
        name: &Value,
        new_name: &Value,
    ) -> Result<(), Box<ChainFailure>> {
        if new_name == name {
            return Ok(());
        }
        Err(self.failure(
            index,
            StepFailure::Renamed {
                from: name.as_str().unwrap_or_default().to_string(),
                to: new_name
                    .as_str()
                    .map_or_else(|| new_name.to_string(), str::to_string),
            },
        ))
    }

    /// The step at `index` changed what its scope does not grant.
    fn out_of_scope(&self, index: usize, overstep: scope::Overstep) -> Box<ChainFailure> {
        let step = &self.steps[index];
        let declared = step
            .plugin
            .declared_scope()
            .map(|d| declaration_note(d, &overstep.needed).into_boxed_str());
        self.failure(
            index,
            StepFailure::OutOfScope {
                change: overstep.change,
                needed: overstep.needed,
                scope: step.scope.to_string(),
                sha256: step.plugin.sha256().to_string(),
                declared,
            },
        )
    }

    /// What the step at `index` changed.
    fn changes(&self, index: usize, changes: Vec<Change>, more: usize) -> StepChanges {
        let step = &self.steps[index];
        let declared = step.plugin.declared_scope();
        StepChanges {
            step: step.name.clone(),
            plugin: step.plugin.info().clone(),
            declared: declared.map(<[String]>::to_vec),
            not_granted: declared
                .map(|d| step.scope.not_granted(d))
                .unwrap_or_default()
                .into_iter()
                .map(str::to_string)
                .collect(),
            granted: step.scope.to_string(),
            changes,
            more,
        }
    }

    /// How the step at `index` (0-based) failed.
    fn failure(&self, index: usize, failure: StepFailure) -> Box<ChainFailure> {
        let step = &self.steps[index];
        Box::new(ChainFailure {
            position: index + 1,
            chain_length: self.steps.len(),
            step: step.name.clone(),
            plugin: step.plugin.info().clone(),
            failure,
        })
    }
}

/// What the chain reads of a step's output: its metadata. Every other value
/// is checked as JSON and dropped without being built.
struct OutputProbe {
    metadata: Value,
}

impl<'de> Deserialize<'de> for OutputProbe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = OutputProbe;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OutputProbe, A::Error> {
                // A repeated key counts as its last value, as in a `Value`.
                let mut metadata = Value::Null;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "metadata" {
                        metadata = map.next_value()?;
                    } else {
                        map.next_value::<Skip>()?;
                    }
                }
                Ok(OutputProbe { metadata })
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// Any JSON value, walked and dropped. Unlike `serde::de::IgnoredAny`, which
/// serde_json skips without a depth limit, it descends through the
/// deserializer, so JSON nested deeper than serde_json's limit is refused
/// here, at the step that returned it.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

/// Where a chain's run starts: the pod's text (what the first plugin
/// receives), its `metadata.name` (no step may change it), and the pod
/// parsed, when the caller has it.
struct Start<'a> {
    text: String,
    name: Value,
    parsed: Option<&'a Value>,
}

impl<'a> Start<'a> {
    /// A pod the caller parsed: written as text for the first plugin.
    fn parsed(pod: &'a Value) -> Start<'a> {
        Start {
            text: pod.to_string(),
            name: pod
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null),
            parsed: Some(pod),
        }
    }

    /// A template's pod is named after the template
    /// ([`Template::from_value`] sets `metadata.name`) and kept as text.
    fn template(template: &Template) -> Start<'static> {
        Start {
            text: template.pod_json().to_string(),
            name: Value::String(template.name.clone()),
            parsed: None,
        }
    }
}

/// The last step's output as a value, or why it is not a pod at all: the
/// same failures, with the same messages, as [`name_in`]'s.
fn parse_output(text: &str) -> Result<Value, StepFailure> {
    match serde_json::from_str::<Value>(text) {
        Ok(pod) if pod.is_object() => Ok(pod),
        Ok(_) => Err(StepFailure::NotAnObject),
        Err(e) => Err(StepFailure::InvalidJson(e.to_string())),
    }
}

/// The `metadata.name` of a step's output (`None` when there is none, or
/// its metadata is no object), or why the output is not a pod at all.
fn name_in(text: &str) -> Result<Option<Value>, StepFailure> {
    // A struct would also deserialize from a JSON array, by position.
    if !text.trim_start().starts_with('{') {
        return match serde_json::from_str::<Skip>(text) {
            Ok(_) => Err(StepFailure::NotAnObject),
            Err(e) => Err(StepFailure::InvalidJson(e.to_string())),
        };
    }
    let probe: OutputProbe =
        serde_json::from_str(text).map_err(|e| StepFailure::InvalidJson(e.to_string()))?;
    Ok(match probe.metadata {
        Value::Object(mut metadata) => metadata.remove("name"),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_output_is_checked_without_building_it() {
        // The last step's parse must fail as the probe does, message and
        // all, and find the same name.
        let name = |text: &str| {
            let probed = name_in(text).map(|name| name.unwrap_or(Value::Null));
            let parsed = parse_output(text).map(|pod| {
                pod.pointer("/metadata/name")
                    .cloned()
                    .unwrap_or(Value::Null)
            });
            assert_eq!(probed, parsed, "{text}");
            probed
        };
        assert_eq!(
            name(r#" {"spec": {"x": [1, 2]}, "metadata": {"name": "web"}}"#),
            Ok(Value::from("web"))
        );
        assert_eq!(name(r#"{"metadata": {"labels": {}}}"#), Ok(Value::Null));
        assert_eq!(name(r#"{"metadata": 5}"#), Ok(Value::Null));
        assert_eq!(name(r#"{"metadata": {"name": 5}}"#), Ok(Value::from(5)));
        assert_eq!(
            name(r#"{"metadata": {"name": "a"}, "metadata": {"name": "b"}}"#),
            Ok(Value::from("b"))
        );
        assert_eq!(
            name(r#"[{"metadata": {"name": "web"}}]"#),
            Err(StepFailure::NotAnObject)
        );
        assert_eq!(name("5"), Err(StepFailure::NotAnObject));
        let deep_array = format!("{}{}", "[".repeat(1500), "]".repeat(1500));
        assert!(
            matches!(name(&deep_array), Err(StepFailure::InvalidJson(ref e)) if e.contains("recursion")),
            "{:?}",
            name(&deep_array)
        );
        for bad in [
            r#"{"metadata": {"name": "web"}"#,
            r#"{"spec": {"x": [1, 2}}"#,
            r#"{"metadata": {}} trailing"#,
            r#"{"spec": {"a": tru}}"#,
            r#"{"spec": "\x"}"#,
            "",
        ] {
            assert!(
                matches!(name(bad), Err(StepFailure::InvalidJson(_))),
                "{bad}: {:?}",
                name(bad)
            );
        }
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let deep = format!("{{\"spec\": {}1{}}}", open.repeat(1500), close.repeat(1500));
            assert!(
                matches!(name(&deep), Err(StepFailure::InvalidJson(ref e)) if e.contains("recursion")),
                "{:?}",
                name(&deep)
            );
        }
    }
}
