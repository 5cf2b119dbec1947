// Replay saved runs of one workflow against the target's workflow code, on the target's own Temporal SDK,
// and compare every activity and child workflow the code schedules with the event that scheduled it.
//
// The SDK is loaded from where the workflows file is (createRequire): this package brings no @temporalio
// package of its own, so a history replays on the exact SDK version the target's workers run.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { createRequire } = require('node:module');
const { pathToFileURL } = require('node:url');
const { argumentsDiffer, decodePayloads, scheduledInHistory } = require('./compare');
const { historyFromProtoJson } = require('./history-json');

const MAX_HISTORY_BYTES = 64 * 1024 * 1024;
const INTERCEPTORS = path.join(__dirname, 'workflow-interceptors.js');

/** Something the user can fix (a path, a file, a missing SDK): exit 2, this one line. */
class UsageError extends Error {}

/** A run that does not replay: exit 1, this one line. */
class ReplayFailure extends Error {}

/** The history files named by `args`: a folder stands for its *.json files, in name order. */
function historyFiles(args) {
  const files = [];
  for (const arg of args) {
    const st = fs.lstatSync(arg, { throwIfNoEntry: false });
    if (!st) throw new UsageError(`${arg}: no such file or folder; pass a saved history (.json) or a folder of them`);
    if (st.isDirectory()) {
      const names = fs.readdirSync(arg).filter((n) => n.endsWith('.json')).sort();
      if (!names.length) throw new UsageError(`${arg}: a folder with no .json history in it`);
      files.push(...names.map((n) => path.join(arg, n)));
    } else if (st.isFile()) {
      files.push(arg);
    } else {
      throw new UsageError(`${arg}: not a regular file or folder (a link or a device); pass the history itself`);
    }
  }
  return files;
}

/** One saved run as a History message of the target's SDK (never following a link). */
function readHistory(proto, file) {
  let fd;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch (err) {
    throw new UsageError(`${file}: cannot be read (${err.code || err.message})`);
  }
  try {
    const size = fs.fstatSync(fd).size;
    if (size > MAX_HISTORY_BYTES) throw new UsageError(`${file}: ${size} bytes, over the ${MAX_HISTORY_BYTES} read`);
    const text = fs.readFileSync(fd, 'utf8');
    try {
      return historyFromProtoJson(proto, JSON.parse(text));
    } catch (err) {
      throw new UsageError(`${file}: not the proto3 JSON of a History (${oneLine(err.message)})`);
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** The target's Temporal SDK, resolved from its workflows file, as the bundler will resolve it. */
function targetSdk(workflowsPath) {
  const from = fs.statSync(workflowsPath).isDirectory() ? path.join(workflowsPath, 'index.js') : workflowsPath;
  const requireHere = createRequire(from);
  let workerEntry;
  try {
    workerEntry = requireHere.resolve('@temporalio/worker');
  } catch {
    throw new UsageError(
      `no @temporalio/worker is installed where ${workflowsPath} is: install the Temporal SDK in the project ` +
        'whose workers run that code (npm install @temporalio/worker @temporalio/workflow)',
    );
  }
  const requireWorker = createRequire(workerEntry); // its common and proto: the copies the worker uses
  let workflowPackage;
  try {
    workflowPackage = path.dirname(requireHere.resolve('@temporalio/workflow'));
  } catch {
    throw new UsageError(`no @temporalio/workflow is installed where ${workflowsPath} is: npm install @temporalio/workflow`);
  }
  while (path.basename(workflowPackage) !== 'workflow' && path.dirname(workflowPackage) !== workflowPackage) {
    workflowPackage = path.dirname(workflowPackage); // from .../@temporalio/workflow/lib/index.js to the package
  }
  return {
    worker: requireHere('@temporalio/worker'),
    common: requireWorker('@temporalio/common'),
    proto: requireWorker('@temporalio/proto'),
    version: requireWorker('@temporalio/worker/package.json').version,
    workflowPackage,
  };
}

/** A module of the target's (a path from the working directory), loaded as Node would: CommonJS or ESM. */
async function loadModule(file, what) {
  const resolved = path.resolve(file);
  if (!fs.existsSync(resolved)) throw new UsageError(`${what} ${file}: no such file`);
  try {
    return await import(pathToFileURL(resolved).href);
  } catch (err) {
    throw new UsageError(`${what} ${file} does not load: ${oneLine(err.message)}`);
  }
}

/** The worker's plugins from a module exporting `plugins` or a default export: an array or a function returning one. */
async function loadPlugins(file) {
  if (!file) return [];
  const loaded = await loadModule(file, '--plugins');
  let exported = loaded.plugins ?? loaded.default?.plugins ?? loaded.default;
  if (typeof exported === 'function') exported = await exported();
  if (!Array.isArray(exported)) {
    throw new UsageError(
      `--plugins ${file}: export \`plugins\` (or a default export): an array of the worker's plugins or a function returning one`,
    );
  }
  return exported;
}

/**
 * Replay the runs in `histories` (files or folders) of one workflow; resolve to the success line, or throw
 * a ReplayFailure (a run does not replay) or a UsageError (nothing could be judged).
 * @param {{workflows: string, histories: string[], workflowId?: string, plugins?: string,
 *          interceptors?: string[], payloadConverter?: string}} args
 */
async function replay(args) {
  const workflowsPath = path.resolve(args.workflows);
  if (!fs.existsSync(workflowsPath)) throw new UsageError(`--workflows ${args.workflows}: no such file or folder`);
  const sdk = targetSdk(workflowsPath);
  const files = historyFiles(args.histories);
  const runs = files.map((file) => ({
    file,
    workflowId: args.workflowId || path.basename(path.dirname(path.resolve(file))),
    history: readHistory(sdk.proto, file),
  }));

  const { Runtime, DefaultLogger, Worker, bundleWorkflowCode } = sdk.worker;
  // A failure is said in one line, not logged: the SDK's logs and Core's (forwarded to it) go nowhere.
  const logger = new DefaultLogger('ERROR', () => {});
  Runtime.install({ logger, telemetryOptions: { logging: { filter: { core: 'ERROR', other: 'ERROR' }, forward: {} } } });
  const plugins = await loadPlugins(args.plugins);
  let bundleOptions = {
    workflowsPath,
    workflowInterceptorModules: (args.interceptors || []).map((m) => path.resolve(m)),
    payloadConverterPath: args.payloadConverter ? path.resolve(args.payloadConverter) : undefined,
    logger,
  };
  // The plugins configure the bundle as they do the worker's (the AI SDK's adds its polyfills); applied here,
  // not by the bundler, so this package's interceptor comes last of all, after theirs.
  for (const plugin of plugins) {
    if (plugin.configureBundler) bundleOptions = plugin.configureBundler(bundleOptions);
  }
  const ownHook = bundleOptions.webpackConfigHook;
  bundleOptions = {
    ...bundleOptions,
    workflowInterceptorModules: [...(bundleOptions.workflowInterceptorModules || []), INTERCEPTORS],
    webpackConfigHook: (config) => withOwnWorkflowPackage(ownHook ? ownHook(config) : config, sdk.workflowPackage),
  };
  let workflowBundle;
  try {
    workflowBundle = await bundleWorkflowCode(bundleOptions);
  } catch (err) {
    throw new UsageError(`the workflow code does not bundle: ${oneLine(err.message)}`);
  }

  let recorded;
  let options = {
    workflowBundle,
    dataConverter: bundleOptions.payloadConverterPath
      ? { payloadConverterPath: bundleOptions.payloadConverterPath }
      : undefined,
    reuseV8Context: false, // a fresh context per run, as a worker's first workflow sees it
    sinks: {
      dahReplay: {
        activity: { fn: (_info, id, type, input) => recorded.activities.push({ id, type, input: own(input) }), callDuringReplay: true },
        localActivity: { fn: () => (recorded.localActivities += 1), callDuringReplay: true },
        childWorkflow: { fn: (_info, id, type, input) => recorded.children.push({ id, type, input: own(input) }), callDuringReplay: true },
      },
    },
  };
  for (const plugin of plugins) {
    if (plugin.configureReplayWorker) options = plugin.configureReplayWorker(options);
  }
  const converter = await payloadConverterOf(options.dataConverter, sdk);
  const codecs = options.dataConverter?.payloadCodecs || [];

  let compared = 0;
  let locals = 0;
  for (const { file, workflowId, history } of runs) {
    recorded = { activities: [], children: [], localActivities: 0 };
    try {
      await Worker.runReplayHistory(options, history, workflowId);
    } catch (err) {
      throw new ReplayFailure(`${file}: does not replay: ${oneLine(err.message)}`);
    }
    const scheduled = scheduledInHistory(history);
    compared += await compareAll('activity', recorded.activities, scheduled.activities, file, converter, codecs);
    compared += await compareAll('child workflow', recorded.children, scheduled.children, file, converter, codecs);
    locals += recorded.localActivities;
  }
  const localNote = locals ? `; ${locals} local activit${locals === 1 ? 'y' : 'ies'} not compared (the history has no input for them)` : '';
  return (
    `replayed ${runs.length} run(s) of ${runs[0].workflowId} on @temporalio/worker ${sdk.version}: deterministic, ` +
    `and the inputs of ${compared} scheduled activit${compared === 1 ? 'y' : 'ies'} and child workflows compared ` +
    `with the history, every one as recorded${localNote}`
  );
}

/** Compare each call the replay made with the event of the same id; the number compared. */
async function compareAll(kind, calls, events, file, converter, codecs) {
  let compared = 0;
  for (const call of calls) {
    const event = events.get(call.id);
    if (!event) continue; // scheduled after the history's last event: nothing recorded to compare with
    if (call.type !== event.type) {
      throw new ReplayFailure(
        `${file}: ${kind} id ${call.id} (event ${event.eventId}) is ${event.type} in the history but ${call.type} on replay`,
      );
    }
    let payloads;
    try {
      payloads = await decodePayloads(event.payloads, codecs);
    } catch (err) {
      throw new UsageError(`${file}: event ${event.eventId}'s input does not decode: ${oneLine(err.message)}`);
    }
    const found = argumentsDiffer(converter, call.input, payloads);
    if (found) {
      throw new ReplayFailure(
        `${file}: ${kind} ${call.type} (id ${call.id}, event ${event.eventId}) scheduled with a different input ` +
          `on replay at ${found.path}: history ${found.history} vs replay ${found.replay}`,
      );
    }
    compared += 1;
  }
  return compared;
}

/** The payload converter the worker encodes with: the one at payloadConverterPath, or the SDK's default. */
async function payloadConverterOf(dataConverter, sdk) {
  const file = dataConverter?.payloadConverterPath;
  if (!file) return sdk.common.defaultPayloadConverter;
  const loaded = await loadModule(file, 'the payload converter');
  const converter = loaded.payloadConverter ?? loaded.default?.payloadConverter;
  if (!converter || typeof converter.toPayload !== 'function') {
    throw new UsageError(`the payload converter ${file} exports no payloadConverter (the SDK requires that name)`);
  }
  return converter;
}

/** Our interceptor's `require('@temporalio/workflow')` resolves to the target's package (this package has none). */
function withOwnWorkflowPackage(config, workflowPackage) {
  const rule = {
    include: path.dirname(INTERCEPTORS),
    resolve: { alias: { '@temporalio/workflow$': workflowPackage } },
  };
  return { ...config, module: { ...config.module, rules: [...(config.module?.rules || []), rule] } };
}

/** A value from the workflow's context as one of this realm (a Uint8Array stays one), or as it is. */
function own(value) {
  try {
    return structuredClone(value);
  } catch {
    return value;
  }
}

function oneLine(text) {
  return String(text).replace(/\s+/g, ' ').trim();
}

module.exports = { replay, ReplayFailure, UsageError, oneLine };
