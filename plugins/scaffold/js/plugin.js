// {{name}}: a podstamp plugin. Sets a label on the pod with the node's
// architecture (settings: `label`, default `arch`).
//
// Build: bash build.sh (or npm run build) -> target/{{name}}.wasm
// Try:   podstamp render --plugin target/{{name}}.wasm template.yaml --node node.yaml

import { PluginError, definePlugin, log, schema } from 'podstamp-plugin';

export const transformer = definePlugin({
  settings: schema.object({
    label: schema.string('arch'),
  }),

  transform(pod, node, settings) {
    if (node.architecture === '') {
      throw new PluginError("the host did not say the node's architecture");
    }
    log.debug(`setting label ${settings.label}`);
    pod.metadata.labels = { ...pod.metadata.labels, [settings.label]: node.architecture };
  },
});
