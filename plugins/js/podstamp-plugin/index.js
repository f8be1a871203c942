// The SDK for podstamp plugins written in JavaScript.
//
// A plugin is one ES module that exports `transformer = definePlugin({...})`.
// plugins/js/build.sh bundles it with this SDK (and anything else it
// imports) and makes a WebAssembly component of it with componentize-js.
// The host calls `transform` in a fresh instance for every pod, so nothing
// a plugin keeps in a variable survives from one pod to the next.
//
// What the SDK guarantees, so that plugins behave like the Rust SDK's:
// - settings are parsed before the pod, and an empty text counts as `{}`;
// - a schema's errors read like the Rust SDK's (serde's):
//   `invalid settings at images.amd64: invalid type: integer `1`, expected a string`;
// - field paths use the host's syntax (FieldPath below), so an error points
//   at the same field whichever language the plugin is written in;
// - anything thrown that is not a PluginError is logged (with its stack) at
//   error level and returned as an error, never a trap.

import { log as hostLog } from 'podstamp:plugin/host@0.1.1';
// Made by the build from the plugin's package.json: { name, version }.
import packageInfo from 'podstamp:package-info';

// --- field paths -------------------------------------------------------------

/** A key made only of ASCII letters, digits, `-` and `_` is written plain. */
const PLAIN_KEY = /^[A-Za-z0-9_-]+$/;

/**
 * The path of a field in the pod, as the host expects in an error.
 *
 * Keys are joined with `.`, indexes are in brackets, and a key that is not
 * made only of ASCII letters, digits, `-` and `_` is a JSON string in
 * brackets: `spec.containers[0].command[3]`,
 * `metadata.labels["app.kubernetes.io/name"]`. Immutable.
 */
export class FieldPath {
  /** @param {string} [text] an already formatted path, e.g. `spec.containers` */
  constructor(text = '') {
    /** @readonly */
    this.text = text;
  }

  /** This path followed by an object key. @param {string} key */
  key(key) {
    if (key !== '' && PLAIN_KEY.test(key)) {
      return new FieldPath(this.text === '' ? key : `${this.text}.${key}`);
    }
    return new FieldPath(`${this.text}[${JSON.stringify(key)}]`);
  }

  /** This path followed by an array index. @param {number} index */
  index(index) {
    return new FieldPath(`${this.text}[${index}]`);
  }

  /** Whether this is the root (empty) path. */
  isRoot() {
    return this.text === '';
  }

  toString() {
    return this.text;
  }
}

// --- errors --------------------------------------------------------------------

/**
 * Why a plugin refused to transform a pod: a message and, when the problem
 * is about one field of the pod, its path. Throw it from `transform`.
 */
export class PluginError extends Error {
  /**
   * @param {string} message one sentence, no trailing newline
   * @param {string | FieldPath} [field] e.g. `spec.containers[0].image`
   */
  constructor(message, field) {
    super(message);
    this.name = 'PluginError';
    const text = field === undefined ? '' : String(field);
    /** @type {string | undefined} */
    this.field = text === '' ? undefined : text;
  }

  toString() {
    return this.field === undefined ? this.message : `${this.field}: ${this.message}`;
  }
}

// --- logging -------------------------------------------------------------------

/**
 * Lines for the host's log, tagged with the plugin and the pod. Lines over
 * 4 KiB are cut, and a call is cut off after 64 lines. `console.log` and
 * `console.error` also reach the log (through WASI stdout and stderr).
 */
export const log = {
  /** @param {string} message */ error: (message) => hostLog('error', String(message)),
  /** @param {string} message */ warn: (message) => hostLog('warn', String(message)),
  /** @param {string} message */ info: (message) => hostLog('info', String(message)),
  /** @param {string} message */ debug: (message) => hostLog('debug', String(message)),
  /** @param {string} message */ trace: (message) => hostLog('trace', String(message)),
};

// --- the node --------------------------------------------------------------------

/**
 * @typedef {object} NodeAddress One of the node's `status.addresses`.
 * @property {string} kind `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS` or `ExternalDNS`
 * @property {string} address e.g. `10.0.0.12`
 */

/**
 * @typedef {object} NodeContext What the host passes (the WIT `node-context`).
 * @property {string} name
 * @property {Array<[string, string]>} labels sorted by key
 * @property {Array<[string, string]>} annotations sorted by key
 * @property {NodeAddress[]} addresses
 * @property {string} architecture
 * @property {string} operatingSystem
 * @property {string | undefined} kubeletVersion
 */

/** What the host knows about the node a pod is rendered for. */
export class Node {
  /** @param {NodeContext} context */
  constructor(context) {
    /** The Node's `metadata.name`, e.g. `worker-1`. @type {string} */
    this.name = context.name;
    /** The Node's labels. @type {Map<string, string>} */
    this.labels = new Map(context.labels);
    /** The Node's annotations. @type {Map<string, string>} */
    this.annotations = new Map(context.annotations);
    /** The Node's `status.addresses`, in the Node's order. @type {NodeAddress[]} */
    this.addresses = context.addresses.map((a) => ({ kind: a.kind, address: a.address }));
    /** In Go's naming: `amd64`, `arm64`, `ppc64le`... @type {string} */
    this.architecture = context.architecture;
    /** `linux`, `windows`. @type {string} */
    this.operatingSystem = context.operatingSystem;
    /** e.g. `v1.34.2`, when the host knows it. @type {string | undefined} */
    this.kubeletVersion = context.kubeletVersion ?? undefined;
  }

  /** The value of a label, or undefined. @param {string} key */
  label(key) {
    return this.labels.get(key);
  }

  /** The value of an annotation, or undefined. @param {string} key */
  annotation(key) {
    return this.annotations.get(key);
  }

  /** The first address of this kind, e.g. `address('InternalIP')`. @param {string} kind */
  address(kind) {
    return this.addresses.find((a) => a.kind === kind)?.address;
  }
}

// --- the pod's containers --------------------------------------------------------

/** Which list of the pod spec a container is in: `[list name, ...]`. */
export const ContainerKind = Object.freeze({
  Init: 'initContainers',
  Container: 'containers',
  /** Both, init containers first (the order the kubelet starts them). */
  ALL: Object.freeze(['initContainers', 'containers']),
});

/** The path of a container list: `spec.containers`. @param {string} kind */
export function listPath(kind) {
  return new FieldPath().key('spec').key(kind);
}

/** The path of one container: `spec.initContainers[1]`. @param {string} kind @param {number} index */
export function containerPath(kind, index) {
  return listPath(kind).index(index);
}

/**
 * The pod's containers of one kind (`[]` when it has none), the objects
 * themselves: changing them changes the pod.
 * @param {any} pod @param {string} kind @returns {any[]}
 */
export function containers(pod, kind) {
  const list = pod?.spec?.[kind];
  return Array.isArray(list) ? list : [];
}

// --- settings ----------------------------------------------------------------------

// A schema checks a JSON value and gives it defaults, with serde's words
// (`invalid type: integer `1`, expected a string`) so that a JS plugin's
// settings errors read like a Rust plugin's.

class SettingsError extends Error {
  constructor(path, message) {
    super(message);
    this.path = path;
  }
}

/** serde's name for what a JSON value is. */
function unexpected(value) {
  if (value === null) return 'null';
  if (typeof value === 'boolean') return `boolean \`${value}\``;
  if (typeof value === 'number') {
    return Number.isInteger(value) ? `integer \`${value}\`` : `floating point \`${value}\``;
  }
  if (typeof value === 'string') return `string ${JSON.stringify(value)}`;
  return Array.isArray(value) ? 'sequence' : 'map';
}

function invalid(path, value, expected) {
  return new SettingsError(path, `invalid type: ${unexpected(value)}, expected ${expected}`);
}

function isMap(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/**
 * Settings schemas: `schema.object({ field: schema.string(), ... })`. Every
 * field is optional; a missing one (or `null`, for `optional`) gets its default.
 */
export const schema = {
  /** A string; `fallback` when missing. */
  string: (fallback = '') => ({
    fallback: () => fallback,
    check: (value, path) => {
      if (typeof value !== 'string') throw invalid(path, value, 'a string');
      return value;
    },
  }),
  /** `true` or `false`; `fallback` when missing. */
  boolean: (fallback = false) => ({
    fallback: () => fallback,
    check: (value, path) => {
      if (typeof value !== 'boolean') throw invalid(path, value, 'a boolean');
      return value;
    },
  }),
  /** A number; `fallback` when missing. */
  number: (fallback = 0) => ({
    fallback: () => fallback,
    check: (value, path) => {
      if (typeof value !== 'number') throw invalid(path, value, 'a number');
      return value;
    },
  }),
  /** `inner`, or undefined when missing or null. */
  optional: (inner) => ({
    fallback: () => undefined,
    check: (value, path) => (value === null ? undefined : inner.check(value, path)),
  }),
  /** A list of `inner`; `[]` when missing. */
  list: (inner) => ({
    fallback: () => [],
    check: (value, path) => {
      if (!Array.isArray(value)) throw invalid(path, value, 'a sequence');
      return value.map((item, i) => inner.check(item, path.index(i)));
    },
  }),
  /** An object of `inner` values, as a Map sorted by key; empty when missing. */
  map: (inner) => ({
    fallback: () => new Map(),
    check: (value, path) => {
      if (!isMap(value)) throw invalid(path, value, 'a map');
      const keys = Object.keys(value).sort(compareKeys);
      return new Map(keys.map((k) => [k, inner.check(value[k], path.key(k))]));
    },
  }),
  /** An object with these fields and no others; all fields defaulted when missing. */
  object: (fields) => ({
    fallback: () => defaults(fields),
    check: (value, path) => {
      if (!isMap(value)) throw invalid(path, value, 'a map');
      const names = Object.keys(fields);
      const out = defaults(fields);
      for (const key of Object.keys(value)) {
        if (!Object.hasOwn(fields, key)) {
          const expected = names.length === 0
            ? 'there are no fields'
            : names.length === 1
              ? `expected \`${names[0]}\``
              : `expected one of ${names.map((n) => `\`${n}\``).join(', ')}`;
          throw new SettingsError(path.key(key), `unknown field \`${key}\`, ${expected}`);
        }
        out[key] = fields[key].check(value[key], path.key(key));
      }
      return out;
    },
  }),
};

function defaults(fields) {
  const out = {};
  for (const [name, field] of Object.entries(fields)) out[name] = field.fallback();
  return out;
}

/** Byte order of the UTF-8 encodings (Rust's string order), not UTF-16's. */
function compareKeys(a, b) {
  const x = new TextEncoder().encode(a);
  const y = new TextEncoder().encode(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return x[i] - y[i];
  }
  return x.length - y.length;
}

/**
 * Parses settings from JSON and checks them against `shape` (a
 * `schema.object`, or undefined to take any JSON value as it is).
 * Errors: `invalid settings at images.amd64: ...`, `invalid settings: ...`.
 * @param {string} json @param {any} [shape]
 */
export function parseSettings(json, shape) {
  return parseSettingsWith(json, shape, (path, message) => {
    const at = path.isRoot() ? '' : ` at ${path}`;
    return new PluginError(`invalid settings${at}: ${message}`);
  });
}

/**
 * What the host's `validate-settings` call does (WIT 0.1.1), for tests:
 * parses the settings as `transform` would, then runs the plugin's
 * `validate(settings)`, if any. An error's field is its path inside the
 * settings (`labels.ZONE`), its message the schema's own.
 *
 * @param {{ settings?: any, validate?: (settings: any) => void }} plugin
 * @param {string} json
 */
export function validateSettings(plugin, json) {
  const settings = parseSettingsWith(json, plugin.settings, (path, message) =>
    path.isRoot() ? new PluginError(`invalid settings: ${message}`) : new PluginError(message, path));
  if (plugin.validate !== undefined) plugin.validate(settings);
}

/** @param {string} json @param {any} shape @param {(path: FieldPath, message: string) => PluginError} error */
function parseSettingsWith(json, shape, error) {
  let value;
  try {
    value = JSON.parse(json.trim() === '' ? '{}' : json);
  } catch (e) {
    throw error(new FieldPath(), e.message);
  }
  if (shape === undefined) return value;
  try {
    return shape.check(value, new FieldPath());
  } catch (e) {
    if (!(e instanceof SettingsError)) throw e;
    throw error(e.path, e.message);
  }
}

/** Where `definePlugin` keeps the plugin's `settings-validator` export. */
const SETTINGS_VALIDATOR = Symbol('podstamp settings-validator');

/**
 * The `settings-validator` export of a `transformer` made by
 * {@link definePlugin}; the build exports it for the plugin.
 */
export function settingsValidatorOf(transformer) {
  return transformer[SETTINGS_VALIDATOR];
}

// --- the export --------------------------------------------------------------------

/**
 * The plugin's `transformer` export. `transform(pod, node, settings)` gets
 * the pod as a parsed JSON object, a {@link Node} and the settings (checked
 * against `settings`, a `schema.object`, when given); it changes the pod in
 * place (or returns a new one), or throws a {@link PluginError}.
 * `info()` is the name and version in the plugin's package.json.
 *
 * `validate(settings)`, if given, checks settings that parsed when the host
 * loads them (WIT 0.1.1's `validate-settings`), throwing a
 * {@link PluginError} whose field is a path inside the settings.
 *
 * @param {{ settings?: any, validate?: (settings: any) => void, transform: (pod: any, node: Node, settings: any) => any }} plugin
 */
export function definePlugin(plugin) {
  return {
    [SETTINGS_VALIDATOR]: {
      /** @param {string} settingsJson */
      validateSettings(settingsJson) {
        try {
          validateSettings(plugin, settingsJson);
        } catch (e) {
          throw asWitError(e);
        }
      },
    },
    info() {
      return { name: packageInfo.name, version: packageInfo.version };
    },
    /** @param {string} podJson @param {NodeContext} context @param {string} settingsJson */
    transform(podJson, context, settingsJson) {
      try {
        const settings = parseSettings(settingsJson, plugin.settings);
        let pod;
        try {
          pod = JSON.parse(podJson);
        } catch (e) {
          throw new PluginError(`invalid pod: not valid JSON: ${e.message}`);
        }
        if (!isMap(pod)) throw new PluginError('invalid pod: not a JSON object');
        const result = plugin.transform(pod, new Node(context), settings);
        return JSON.stringify(result === undefined ? pod : result);
      } catch (e) {
        throw asWitError(e);
      }
    },
  };
}

/** The WIT `plugin-error` for anything thrown. */
function asWitError(e) {
  if (e instanceof PluginError) {
    return e.field === undefined ? { message: e.message } : { message: e.message, field: e.field };
  }
  const what = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  log.error(`uncaught ${what}${e instanceof Error && e.stack ? `\n${e.stack}` : ''}`);
  return { message: `the plugin failed: ${what}` };
}
