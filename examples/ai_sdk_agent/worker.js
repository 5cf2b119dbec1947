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

const { parseArgs } = require('node:util');
const { NativeConnection, Worker } = require('@temporalio/worker');
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

async function main() {
  const opts = readOptions(process.argv.slice(2), process.env);
  const connection = await NativeConnection.connect({ address: opts.address });
  const worker = await Worker.create({
    connection,
    namespace: opts.namespace,
    taskQueue: opts['task-queue'],
    identity: opts.identity,
    workflowsPath: require.resolve('./workflows'),
    activities: createActivities({ effectsUrl: opts['effects-url'].replace(/\/+$/, ''), bug: opts.bug }),
    plugins: plugins({ modelUrl: opts['model-url'], apiKey: process.env.OPENAI_API_KEY }),
  });
  await worker.run();
}

main().catch((err) => {
  console.error(`worker: ${err && err.message ? err.message : err}`);
  process.exit(1);
});
