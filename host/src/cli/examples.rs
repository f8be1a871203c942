//! The `Examples:` of the commands users type most (`render`, `run`,
//! `status`, `test`), shown at the end of their `--help`. Every line that
//! runs podstamp is parsed by the command line itself in main.rs's tests,
//! so an example cannot name a flag that is gone.

pub const RENDER: &str = "\
Examples:
  # The bundled example: the template, the Node it is rendered for, the chain
  podstamp render examples/pod-checkpointer.yaml --node examples/node.yaml --config examples/podstamp.yaml

  # A template from the API server, for a node given by name and architecture
  kubectl get podtemplate web -n kube-system -o yaml | podstamp render - --node-name n1 --node-arch arm64 --config podstamp.yaml

  # Into the kubelet's manifest directory, with one plugin and no catalog file
  podstamp render web.yaml --node-name n1 --plugin target/plugins/substitute.wasm -o /etc/kubernetes/manifests/web.yaml";

pub const RUN: &str = "\
Examples:
  # On a node: the templates of kube-system labelled podstamp.io/enabled=true
  podstamp run --config /etc/podstamp/podstamp.yaml --node-name n1 --manifest-dir /etc/kubernetes/manifests

  # From a kubeconfig, another namespace and selector, metrics on 127.0.0.1:9464
  podstamp run --config podstamp.yaml --kubeconfig ~/.kube/config -n infra -l tier=node --node-name n1 --listen 127.0.0.1:9464

  # Without an API server: every PodTemplate file of a directory
  podstamp run --config podstamp.yaml --source dir:/etc/podstamp/templates --node-name n1 --node-file node.yaml";

pub const STATUS: &str = "\
Examples:
  # Every template of kube-system, one row per node (as kubectl's plugin too)
  podstamp status
  kubectl podstamp status

  # One template, followed live while it rolls
  podstamp status web -n kube-system --watch

  # For scripts
  podstamp status web -o json";

pub const TEST: &str = "\
Examples:
  # Every case under tests/cases (template.yaml, node.yaml, expected.yaml)
  podstamp test tests/cases

  # Two cases, their expected manifests rewritten from what renders now
  podstamp test my-plugin/cases basic arm64 --update";
