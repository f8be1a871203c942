// Builds one JavaScript plugin into a podstamp component. Run by build.sh
// (which installs the pinned toolchain first and passes its directory in
// PODSTAMP_JS_TOOLCHAIN):
//
//   node build.mjs PLUGIN_DIR OUT.wasm
//
// 1. bundles the plugin's entry module (package.json `main`, default
//    plugin.js) with rolldown into one ES module: `podstamp-plugin` is this
//    checkout's SDK, `podstamp:package-info` is { name, version } from the
//    plugin's package.json, `podstamp:plugin/*` stay imports of the component;
//    the bundle's entry re-exports the plugin's module and adds the
//    `settingsValidator` export of its `transformer` (definePlugin makes it:
//    the settings' schema, then the plugin's own `validate`);
// 2. makes a component of it with componentize-js for wit/podstamp.wit's
//    `plugin` world, without wasi:http (`-d http fetch-event`);
// 3. refuses it unless every import is the podstamp host interface or a WASI
//    0.2 interface the host grants (the list is read from
//    host/src/plugin/wasi.rs, the host's own), and it exports the transformer;
// 4. writes OUT.wasm atomically (a temporary file renamed into place), with
//    the scope the plugin declares (package.json `podstamp.scope`, a list of
//    grants; `[]`: it changes nothing) added by plugins/scope-section.py as a
//    custom section, as the Rust SDK's scope! writes it.

import { execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '../..');
const sdk = join(here, 'podstamp-plugin', 'index.js');
const wit = join(repo, 'wit', 'podstamp.wit');
const PODSTAMP_IMPORTS = ['podstamp:plugin/host@0.1.1', 'podstamp:plugin/types@0.1.1'];
const REQUIRED_EXPORTS = ['podstamp:plugin/transformer@0.1.1', 'podstamp:plugin/settings-validator@0.1.1'];

function fail(message) {
  console.error(`build.mjs: error: ${message}`);
  process.exit(1);
}

const args = process.argv.slice(2);
if (args.length !== 2) fail('usage: node build.mjs PLUGIN_DIR OUT.wasm');
const [pluginDir, out] = args.map((arg) => resolve(arg));
const toolchain = process.env.PODSTAMP_JS_TOOLCHAIN;
if (!toolchain) fail('PODSTAMP_JS_TOOLCHAIN is not set (run plugins/js/build.sh, not this file)');
// The toolchain's packages, imported from its node_modules by their package
// exports (ESM resolution does not look outside this file's own tree).
async function importTool(name) {
  const dir = join(toolchain, 'node_modules', name);
  const manifest = JSON.parse(await readFile(join(dir, 'package.json'), 'utf8'));
  let target = manifest.exports?.['.'] ?? manifest.exports;
  while (target !== null && typeof target === 'object') {
    target = target.import ?? target.node ?? target.default;
  }
  return import(pathToFileURL(join(dir, target ?? manifest.main ?? 'index.js')).href);
}

const pkgPath = join(pluginDir, 'package.json');
let pkg;
try {
  pkg = JSON.parse(await readFile(pkgPath, 'utf8'));
} catch (e) {
  fail(`${pkgPath}: ${e.message} (a plugin directory needs a package.json with name and version)`);
}
for (const field of ['name', 'version']) {
  if (typeof pkg[field] !== 'string' || pkg[field] === '') {
    fail(`${pkgPath}: no ${field}: add "${field}": "..." (it is the plugin's info())`);
  }
}
const entry = resolve(pluginDir, pkg.main ?? 'plugin.js');
// The declared scope, checked before the long componentize so that a bad
// one fails fast; plugins/scope-section.py writes it (step 4) and says
// itself, in one line, what is wrong with a grant.
const scope = pkg.podstamp?.scope;
const scopeTool = join(here, '..', 'scope-section.py');
function runScopeTool(args, cleanup = () => {}) {
  try {
    execFileSync('python3', [scopeTool, ...args], { stdio: 'inherit' });
  } catch (e) {
    cleanup();
    if (e.code === 'ENOENT') fail('python3 is missing (it writes the declared scope): install it, e.g. apt-get install -y python3');
    process.exit(1);
  }
}
if (scope !== undefined) {
  if (!(Array.isArray(scope) && scope.every((g) => typeof g === 'string'))) {
    fail(`${pkgPath}: podstamp.scope must be a list of grants, e.g. "podstamp": {"scope": ["spec.containers[*].env"]} ([]: the plugin changes nothing)`);
  }
  runScopeTool(['--check', `${pkgPath}: podstamp.scope`, ...scope]);
}

// --- 1. bundle ----------------------------------------------------------------
// A fresh directory of its own: componentize-js maps the current directory
// into the engine it snapshots, which must then reach the bundle by a plain
// relative path (through a symbolic link, such as a target/ that is one, it
// fails with "Operation not permitted").
const work = await mkdtemp(join(tmpdir(), 'podstamp-js-'));
const bundlePath = join(work, 'bundle.js');
const { rolldown } = await importTool('rolldown');
const INFO_ID = '\0podstamp:package-info';
const ENTRY_ID = '\0podstamp:entry';
const entryModule = `export * from ${JSON.stringify(entry)};
import { transformer } from ${JSON.stringify(entry)};
import { settingsValidatorOf } from 'podstamp-plugin';
export const settingsValidator = settingsValidatorOf(transformer);
`;
const bundle = await rolldown({
  input: ENTRY_ID,
  cwd: pluginDir,
  logLevel: 'warn',
  external: (id) => id.startsWith('podstamp:plugin/'),
  plugins: [
    {
      name: 'podstamp',
      resolveId(id) {
        if (id === 'podstamp-plugin') return sdk;
        if (id === 'podstamp:package-info') return INFO_ID;
        if (id === ENTRY_ID) return ENTRY_ID;
        return null;
      },
      load(id) {
        if (id === ENTRY_ID) return entryModule;
        if (id !== INFO_ID) return null;
        return `export default ${JSON.stringify({ name: pkg.name, version: pkg.version })};`;
      },
    },
  ],
});
await bundle.write({ file: bundlePath, format: 'esm' });
await bundle.close();

// --- 2. componentize --------------------------------------------------------------
const { componentize } = await importTool('@bytecodealliance/componentize-js');
process.chdir(work);
const { component } = await componentize({
  sourcePath: 'bundle.js',
  witPath: wit,
  worldName: 'plugin',
  // Without these the component imports wasi:http, which the host refuses.
  disableFeatures: ['http', 'fetch-event'],
});

// --- 3. check its imports and export -------------------------------------------------
const wasiRs = await readFile(join(repo, 'host/src/plugin/wasi.rs'), 'utf8');
const list = wasiRs.match(/WASI_INTERFACES: &\[&str\] = &\[([^\]]*)\]/);
if (!list) fail('cannot find WASI_INTERFACES in host/src/plugin/wasi.rs');
const wasi = new Set([...list[1].matchAll(/"([^"]+)"/g)].map((m) => m[1]));
const { componentWit } = await importTool('@bytecodealliance/jco');
const witText = await componentWit(component);
const imports = [...witText.matchAll(/^\s*import ([^;]+);/gm)].map((m) => m[1]);
const exports = [...witText.matchAll(/^\s*export ([^;]+);/gm)].map((m) => m[1]);
const allowed = (name) => {
  if (PODSTAMP_IMPORTS.includes(name)) return true;
  const m = name.match(/^([^@]+)@0\.2\.\d+$/);
  return m !== null && wasi.has(m[1]);
};
const refused = imports.filter((name) => !allowed(name));
if (refused.length > 0) {
  fail(`${pkg.name}: the component imports ${refused.join(', ')}, which podstamp does not provide`);
}
for (const required of REQUIRED_EXPORTS) {
  if (!exports.includes(required)) {
    fail(`${pkg.name}: the component does not export ${required} (export const transformer = definePlugin({...}))`);
  }
}

// --- 4. write ------------------------------------------------------------------------
const tmp = `${out}.tmp`;
await writeFile(tmp, component);
// componentize-js cannot write a custom section: the shared tool appends it.
// A failure leaves no half-built OUT.wasm.tmp behind.
if (scope !== undefined) runScopeTool([tmp, ...scope], () => rmSync(tmp, { force: true }));
await rename(tmp, out);
await rm(work, { recursive: true, force: true });
console.error(`build.mjs: ${basename(out)}: ${pkg.name} ${pkg.version}, ${component.length} bytes`);
