// Replay saved event histories against this agent's workflow code, with the TypeScript SDK's replayer.
//
//   node replay.js HISTORY.json [MORE.json | DIR ...]
//
// A HISTORY is the proto3 JSON of one run's History (what `temporal workflow show --output json` and the
// Python SDK's WorkflowHistory.to_json() write); a DIR stands for the *.json files in it. The workflow id is
// the file's folder name (histories are saved as <dir>/<workflow id>/<nn>-<run id>.json), or --workflow-id.
//
// Strict: besides the SDK's own determinism checks (command kinds and activity types), each activity the
// code schedules on replay is compared with the history's ActivityTaskScheduled event of the same activity
// id: same type and same input, or the replay fails naming the activity, the event and both values.
// Exit 0: every run replayed; 1: a run did not replay; 2: a bad argument or an unreadable file.
// One line on stdout (success) or stderr (failure).
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');
const { defaultPayloadConverter } = require('@temporalio/common');
const { historyFromJSON } = require('@temporalio/common/lib/proto-utils');
const { DefaultLogger, Runtime, Worker, bundleWorkflowCode } = require('@temporalio/worker');

const MAX_HISTORY_BYTES = 64 * 1024 * 1024;
const SHOWN_CHARS = 300;

class UsageError extends Error {}

/** The history files named by the arguments (a folder: its *.json files, in name order). */
function historyFiles(args) {
  const files = [];
  for (const arg of args) {
    const st = fs.lstatSync(arg, { throwIfNoEntry: false });
    if (!st) throw new UsageError(`${arg}: no such file or folder; pass a saved history JSON file`);
    if (st.isDirectory()) {
      const names = fs.readdirSync(arg).filter((n) => n.endsWith('.json')).sort();
      if (!names.length) throw new UsageError(`${arg}: a folder with no .json history in it`);
      files.push(...names.map((n) => path.join(arg, n)));
    } else if (st.isFile()) {
      files.push(arg);
    } else {
      throw new UsageError(`${arg}: not a regular file (a link or a device); pass the history file itself`);
    }
  }
  return files;
}

function readHistory(file) {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  try {
    const size = fs.fstatSync(fd).size;
    if (size > MAX_HISTORY_BYTES) throw new UsageError(`${file}: ${size} bytes, over ${MAX_HISTORY_BYTES}`);
    const text = fs.readFileSync(fd, 'utf8');
    try {
      return historyFromJSON(JSON.parse(text));
    } catch (err) {
      throw new UsageError(`${file}: not the JSON of a History (${oneLine(err.message)})`);
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** activity id -> {type, input, eventId} of the history's ActivityTaskScheduled events. */
function scheduledInHistory(history) {
  const out = new Map();
  for (const event of history.events || []) {
    const attrs = event.activityTaskScheduledEventAttributes;
    if (!attrs) continue;
    const input = (attrs.input?.payloads || []).map((p) => defaultPayloadConverter.fromPayload(p));
    out.set(attrs.activityId, { type: attrs.activityType?.name, input, eventId: Number(event.eventId) });
  }
  return out;
}

/** The first difference between what the replay scheduled and what the history recorded, or undefined. */
function firstMismatch(recorded, history) {
  for (const { activityId, type, args } of recorded) {
    const was = history.get(activityId);
    if (!was) continue; // scheduled after the history's last event: nothing to compare with
    const now = canonical(args);
    const then = canonical(was.input);
    if (type !== was.type || now !== then) {
      const at = firstDifference(then, now);
      return (
        `activity ${type} (id ${activityId}, event ${was.eventId}) scheduled with a different input on replay` +
        ` (from character ${at}): history ${was.type} ${clip(then, at)} vs replay ${type} ${clip(now, at)}`
      );
    }
  }
  return undefined;
}

/** JSON with object keys sorted, after a JSON round trip (what the payload converter would send). */
function canonical(value) {
  const sort = (v) =>
    Array.isArray(v)
      ? v.map(sort)
      : v !== null && typeof v === 'object'
        ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])]))
        : v;
  const plain = JSON.parse(JSON.stringify(value) ?? 'null');
  return JSON.stringify(sort(plain));
}

function firstDifference(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i += 1;
  return i;
}

/** SHOWN_CHARS of `text` around character `at` (where the two values part), marked where cut. */
function clip(text, at) {
  const start = Math.max(0, at - 60);
  const end = Math.min(text.length, start + SHOWN_CHARS);
  return `${start > 0 ? '...' : ''}${text.slice(start, end)}${end < text.length ? '...' : ''}`;
}

function oneLine(text) {
  return String(text).replace(/\s+/g, ' ').trim();
}

async function main() {
  const { values, positionals } = parseArgs({
    args: process.argv.slice(2),
    options: { 'workflow-id': { type: 'string' } },
    allowPositionals: true,
  });
  if (!positionals.length) throw new UsageError('usage: node replay.js HISTORY.json [MORE.json | DIR ...]');
  const files = historyFiles(positionals);
  const histories = files.map((file) => ({
    file,
    workflowId: values['workflow-id'] || path.basename(path.dirname(path.resolve(file))),
    history: readHistory(file),
  }));

  const logger = new DefaultLogger('WARN', () => {}); // a failure is reported in one line below, not logged
  Runtime.install({ logger });
  let recorded = [];
  const options = {
    // Bundled once for every history (the bundler takes seconds); the interceptor only observes.
    workflowBundle: await bundleWorkflowCode({
      workflowsPath: require.resolve('./workflows'),
      workflowInterceptorModules: [require.resolve('./replay-interceptors')],
      logger,
    }),
    reuseV8Context: false, // as worker.js: @temporalio/ai-sdk's globals reach only a context's first workflow
    sinks: {
      strictReplay: {
        scheduled: {
          fn: (_info, activityId, type, args) => recorded.push({ activityId, type, args }),
          callDuringReplay: true,
        },
      },
    },
  };
  // One history at a time, so each run's recorded schedules are its own.
  for (const { file, workflowId, history } of histories) {
    recorded = [];
    try {
      await Worker.runReplayHistory(options, history, workflowId);
    } catch (err) {
      return fail(`${file}: does not replay: ${oneLine(err.message)}`);
    }
    const mismatch = firstMismatch(recorded, scheduledInHistory(history));
    if (mismatch) return fail(`${file}: ${mismatch}`);
  }
  console.log(`replayed ${histories.length} run(s): deterministic, every scheduled activity's input as recorded`);
  return 0;
}

function fail(line) {
  console.error(line);
  return 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err instanceof UsageError ? err.message : `replay.js: ${oneLine(err && err.stack ? err.message : err)}`);
    process.exit(2);
  },
);
