//! The plugin chain: each plugin's output is the next one's input.
//!
//! Between plugins the pod travels as the JSON text the previous plugin
//! returned; the host parses it once per step, to blame the right plugin for
//! invalid JSON or a renamed pod, and never re-serializes it in between.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::plugin::{CallFailure, Plugin, PluginInfo, WitNode};

/// One configured plugin: a catalog name, the loaded component and its settings.
#[derive(Debug)]
pub struct Step {
    pub name: String,
    pub plugin: Plugin,
    /// The settings as compact JSON, made once at load time.
    pub settings_json: String,
}

impl Step {
    pub fn new(name: String, plugin: Plugin, settings: &Value) -> Step {
        Step {
            name,
            plugin,
            settings_json: settings.to_string(),
        }
    }
}

/// An ordered list of steps; empty is a passthrough.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    steps: Vec<Arc<Step>>,
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
    Renamed { from: String, to: String },
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
        }
    }
}

impl Chain {
    pub fn new(steps: Vec<Arc<Step>>) -> Chain {
        Chain { steps }
    }

    pub fn steps(&self) -> &[Arc<Step>] {
        &self.steps
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Runs every step over `pod`. `subject` names the render in plugin logs.
    pub fn apply(
        &self,
        pod: Value,
        node: &WitNode,
        subject: &str,
    ) -> Result<Value, Box<ChainFailure>> {
        self.apply_observed(pod, node, subject, &mut |_, _, _| {})
    }

    /// [`Chain::apply`], telling `observe` about every plugin call: the step,
    /// whether the call succeeded, and how long it took.
    pub fn apply_observed(
        &self,
        pod: Value,
        node: &WitNode,
        subject: &str,
        observe: &mut dyn FnMut(&Step, bool, Duration),
    ) -> Result<Value, Box<ChainFailure>> {
        if self.steps.is_empty() {
            return Ok(pod);
        }
        let name = pod
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::Null);
        let mut text = pod.to_string();
        let mut current = pod;
        for (index, step) in self.steps.iter().enumerate() {
            let fail = |failure| {
                Box::new(ChainFailure {
                    position: index + 1,
                    chain_length: self.steps.len(),
                    step: step.name.clone(),
                    plugin: step.plugin.info().clone(),
                    failure,
                })
            };
            let started = Instant::now();
            let output = step
                .plugin
                .transform(&text, node, &step.settings_json, subject);
            observe(step, output.is_ok(), started.elapsed());
            text = output.map_err(|e| fail(StepFailure::Call(e)))?;
            current = serde_json::from_str(&text)
                .map_err(|e| fail(StepFailure::InvalidJson(e.to_string())))?;
            if !current.is_object() {
                return Err(fail(StepFailure::NotAnObject));
            }
            let new_name = current.pointer("/metadata/name").unwrap_or(&Value::Null);
            if *new_name != name {
                return Err(fail(StepFailure::Renamed {
                    from: name.as_str().unwrap_or_default().to_string(),
                    to: new_name
                        .as_str()
                        .map_or_else(|| new_name.to_string(), str::to_string),
                }));
            }
        }
        Ok(current)
    }
}
