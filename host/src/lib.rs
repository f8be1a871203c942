//! podstamp renders Kubernetes static pod manifests from PodTemplates.
//!
//! The data path, one module per stage: [`template`] (the source object) →
//! [`node`] (what the node is) → [`chain`] of [`plugin`]s (Wasm transforms) →
//! [`validate`] (a v1 Pod) → [`manifest`] (ownership, hash, YAML) →
//! [`write`] (atomic file replacement). [`render`] ties them together and
//! [`config`] describes a chain the way the daemon and the CLI share;
//! [`settings`] resolves flags, environment, file and defaults for both;
//! [`kube_client`] finds the API server the same way for every command.

pub mod age;
pub mod catalog;
pub mod chain;
pub mod config;
pub mod daemon;
pub mod fleet;
pub mod kube_check;
pub mod kube_client;
pub mod manifest;
pub mod node;
pub mod oci;
pub mod plugin;
pub mod reason;
pub mod render;
pub mod scope;
pub mod security_level;
pub mod selector;
pub mod settings;
pub mod template;
pub mod text;
pub mod validate;
pub mod write;
pub mod yaml;
