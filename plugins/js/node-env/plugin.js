// Injects facts about the node into containers as environment variables:
// plugins/node-env (Rust) in JavaScript, with the same settings, output and
// errors.
//
// Settings (all optional):
// - `containers`: names of the containers to inject into; default all.
// - `initContainers`: also inject into init containers (default `false`).
// - `nodeName`: env var for the node's name (default `NODE_NAME`, `""` = none).
// - `nodeIP`: env var for the node's first InternalIP, else its first
//   ExternalIP (default `NODE_IP`, `""` = none). No such address is an error.
// - `labels`: `{ ENV_VAR: label key }`; a missing label is an error.
// - `annotations`: `{ ENV_VAR: annotation key }`; a missing annotation is an error.
//
// A variable that the container already has is replaced where it is; new
// ones are appended in this order: node name, node IP, labels, annotations
// (each map sorted by variable name).

import {
  ContainerKind, PluginError, containerPath, containers, definePlugin, listPath, schema,
} from 'podstamp-plugin';

export const transformer = definePlugin({
  settings: schema.object({
    containers: schema.optional(schema.list(schema.string())),
    initContainers: schema.boolean(false),
    nodeName: schema.string('NODE_NAME'),
    nodeIP: schema.string('NODE_IP'),
    labels: schema.map(schema.string()),
    annotations: schema.map(schema.string()),
  }),

  transform(pod, node, settings) {
    const kinds = settings.initContainers ? ContainerKind.ALL : [ContainerKind.Container];
    const selected = (name) => settings.containers?.includes(name) ?? true;
    if (settings.containers) checkContainersExist(pod, kinds, settings.containers);
    const vars = wantedVars(node, settings);
    for (const kind of kinds) {
      containers(pod, kind).forEach((container, i) => {
        if (!selected(container.name)) return;
        for (const [name, value, why] of vars) {
          if (value === undefined) throw new PluginError(why, containerPath(kind, i).key('env'));
          setEnv(container, name, value);
        }
      });
    }
  },
});

/** The variables to set, in order: [name, value, why there is none]. */
function wantedVars(node, s) {
  const vars = [];
  if (s.nodeName !== '') vars.push([s.nodeName, node.name]);
  if (s.nodeIP !== '') {
    const ip = node.address('InternalIP') ?? node.address('ExternalIP');
    vars.push([s.nodeIP, ip, `the node has no InternalIP or ExternalIP address for env var ${s.nodeIP}`]);
  }
  for (const [v, key] of s.labels) {
    vars.push([v, node.label(key), `the node has no label ${JSON.stringify(key)} for env var ${v}`]);
  }
  for (const [v, key] of s.annotations) {
    vars.push([v, node.annotation(key), `the node has no annotation ${JSON.stringify(key)} for env var ${v}`]);
  }
  return vars;
}

function checkContainersExist(pod, kinds, names) {
  const has = (kind, name) => containers(pod, kind).some((c) => c.name === name);
  for (const name of names) {
    if (kinds.some((kind) => has(kind, name))) continue;
    const hint = has(ContainerKind.Init, name) ? ' (it is an init container: set initContainers: true)' : '';
    throw new PluginError(`no container named ${JSON.stringify(name)} in the pod${hint}`, listPath(ContainerKind.Container));
  }
}

/** Sets `name` to `value`: in place if the container has it, else appended. */
function setEnv(container, name, value) {
  container.env ??= [];
  const existing = container.env.filter((v) => v.name === name);
  for (const v of existing) {
    v.value = value;
    delete v.valueFrom;
  }
  if (existing.length === 0) container.env.push({ name, value });
}
