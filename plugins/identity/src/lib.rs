//! Returns the pod unchanged. It takes the pod as [`RawPod`], so it does no
//! JSON work at all: the host uses it to measure the cost of one plugin call.
//! Settings: none (`{}`).

use podstamp_plugin::{Error, NoSettings, Node, Plugin, RawPod};

struct Identity;

impl Plugin for Identity {
    type Settings = NoSettings;
    type Pod = RawPod;

    fn transform(_pod: &mut RawPod, _node: &Node, _settings: &NoSettings) -> Result<(), Error> {
        Ok(())
    }
}

podstamp_plugin::export!(Identity);
// What it changes: nothing.
podstamp_plugin::scope!();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_text_unchanged() {
        let pod = "{ \"kind\": \"Pod\",\n  \"metadata\": {\"name\": \"p\"} }";
        let out = podstamp_plugin::run::<Identity>(pod, &Node::new("n1"), "{}").unwrap();
        assert_eq!(out, pod);
    }

    #[test]
    fn takes_no_settings() {
        let err =
            podstamp_plugin::run::<Identity>("{}", &Node::new("n1"), r#"{"x":1}"#).unwrap_err();
        assert!(err.message().starts_with("invalid settings"), "{err}");
    }
}
