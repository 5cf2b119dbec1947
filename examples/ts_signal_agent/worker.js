// The agent's worker: SignalChat, the calculator activity and @temporalio/ai-sdk's model activity.
//
//   node worker.js --address 127.0.0.1:7233 --namespace default --task-queue signal-chat --identity w1 \
//     --model-url http://127.0.0.1:8000/v1
//
// Flags default to TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_TASK_QUEUE, WORKER_IDENTITY, OPENAI_BASE_URL
// (and OPENAI_API_KEY). On SIGINT or SIGTERM the SDK stops polling, lets running tasks finish, and run() returns.
'use strict';

const { parseArgs } = require('node:util');
const { NativeConnection, Worker } = require('@temporalio/worker');
const activities = require('./activities');
const { plugins } = require('./temporal-plugins');

async function main() {
  const env = process.env;
  const { values: opts } = parseArgs({
    options: {
      address: { type: 'string', default: env.TEMPORAL_ADDRESS || '127.0.0.1:7233' },
      namespace: { type: 'string', default: env.TEMPORAL_NAMESPACE || 'default' },
      'task-queue': { type: 'string', default: env.TEMPORAL_TASK_QUEUE || 'signal-chat' },
      identity: { type: 'string', default: env.WORKER_IDENTITY },
      'model-url': { type: 'string', default: env.OPENAI_BASE_URL },
    },
  });
  if (!opts['model-url']) throw new Error('no model URL: pass --model-url (an OpenAI-compatible base URL ending in /v1)');
  const connection = await NativeConnection.connect({ address: opts.address });
  try {
    const worker = await Worker.create({
      connection,
      namespace: opts.namespace,
      taskQueue: opts['task-queue'],
      identity: opts.identity,
      workflowsPath: require.resolve('./workflows'),
      activities,
      plugins: plugins({ modelUrl: opts['model-url'], apiKey: env.OPENAI_API_KEY }),
    });
    await worker.run(); // until SIGINT / SIGTERM (the SDK's default shutdown signals)
  } finally {
    await connection.close();
  }
}

main().catch((err) => {
  console.error(`worker: ${err && err.message ? err.message : err}`);
  process.exit(1);
});
