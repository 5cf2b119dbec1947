// The agent's worker: the chat workflow, the model activity of @temporalio/ai-sdk (the AI SDK's OpenAI
// provider at --model-url, its default Responses API) and the saveNote activity.
//
//   node worker.js --address 127.0.0.1:7233 --namespace default --task-queue chat --identity w1 \
//     --model-url http://127.0.0.1:8000/v1 --effects-url http://127.0.0.1:8001 [--model NAME] [--bug NAME]
//
// Every flag also reads from the environment (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_TASK_QUEUE,
// WORKER_IDENTITY, OPENAI_BASE_URL, OPENAI_API_KEY, EFFECTS_URL, AGENT_BUG).
// --bug plants a known bug: no-idempotency-key (the note is sent with no key) or swallow-tool-failure
// (a failed save is reported to the model as saved).
// The model activity's start-to-close is not a flag: @temporalio/ai-sdk takes activity options only in workflow
// code (TemporalProvider), so it is the start input `modelStartToClose` (workflows.js), kept in the history.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');
const { NativeConnection, Worker, bundleWorkflowCode } = require('@temporalio/worker');
const { createActivities } = require('./activities');
const { plugins } = require('./temporal-plugins');

const BUGS = ['no-idempotency-key', 'swallow-tool-failure'];

function readOptions(argv, env) {
  const { values } = parseArgs({
    args: argv,
    options: {
      address: { type: 'string', default: env.TEMPORAL_ADDRESS || '127.0.0.1:7233' },
      namespace: { type: 'string', default: env.TEMPORAL_NAMESPACE || 'default' },
      'task-queue': { type: 'string', default: env.TEMPORAL_TASK_QUEUE || 'ai-sdk-chat' },
      identity: { type: 'string', default: env.WORKER_IDENTITY },
      'model-url': { type: 'string', default: env.OPENAI_BASE_URL },
      'effects-url': { type: 'string', default: env.EFFECTS_URL },
      bug: { type: 'string', default: env.AGENT_BUG || '' },
    },
  });
  if (!values['model-url']) throw new Error('no model URL: pass --model-url (an OpenAI-compatible base URL ending in /v1)');
  if (!values['effects-url']) throw new Error('no notes service URL: pass --effects-url (e.g. http://127.0.0.1:8001)');
  if (values.bug && !BUGS.includes(values.bug)) {
    throw new Error(`--bug ${values.bug}: unknown; use one of ${BUGS.join(', ')}`);
  }
  return values;
}

// What goes into the workflow bundle: the workflow code, the plugins that configure the bundler, the packages.
const BUNDLE_INPUTS = ['workflows.js', 'temporal-plugins.js', 'package-lock.json', 'node_modules/.package-lock.json'];

// The workflow bundle, built by the first worker that needs it and kept in node_modules/.cache under a hash of
// BUNDLE_INPUTS: a later start (a worker restarted after a kill, say) loads it instead of running Temporal's
// bundler again, which takes ~6 s and ~7 s of CPU here. The plugins configure the bundler here as they would
// in Worker.create. Written to a temporary file, then renamed: a worker never reads half a bundle.
async function workflowBundle(bundlerPlugins) {
  const hash = crypto.createHash('sha256');
  for (const name of BUNDLE_INPUTS) {
    const file = path.join(__dirname, name);
    hash.update(`${name}\0${fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '(none)'}\0`);
  }
  const codePath = path.join(__dirname, 'node_modules', '.cache', `workflow-bundle-${hash.digest('hex').slice(0, 16)}.js`);
  if (fs.existsSync(codePath)) return { codePath };
  const { code } = await bundleWorkflowCode({ workflowsPath: require.resolve('./workflows'), plugins: bundlerPlugins });
  const partial = `${codePath}.${process.pid}.tmp`;
  try {
    fs.mkdirSync(path.dirname(codePath), { recursive: true });
    fs.writeFileSync(partial, code);
    fs.renameSync(partial, codePath);
  } catch (err) {  // a read-only node_modules: this worker runs on the bundle it built, the next builds its own
    fs.rmSync(partial, { force: true });
    console.error(`worker: the workflow bundle was not kept (${err.message}); the next start bundles again`);
  }
  return { code };
}

async function main() {
  const opts = readOptions(process.argv.slice(2), process.env);
  const agentPlugins = plugins({ modelUrl: opts['model-url'], apiKey: process.env.OPENAI_API_KEY });
  const bundle = await workflowBundle(agentPlugins);
  const connection = await NativeConnection.connect({ address: opts.address });
  const worker = await Worker.create({
    connection,
    namespace: opts.namespace,
    taskQueue: opts['task-queue'],
    identity: opts.identity,
    workflowBundle: bundle,
    activities: createActivities({ effectsUrl: opts['effects-url'].replace(/\/+$/, ''), bug: opts.bug }),
    plugins: agentPlugins,
  });
  await worker.run();
}

main().catch((err) => {
  console.error(`worker: ${err && err.message ? err.message : err}`);
  process.exit(1);
});
