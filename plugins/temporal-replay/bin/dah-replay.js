#!/usr/bin/env node
// dah-replay: replay saved Temporal event histories against your TypeScript workflow code, strictly.
//
//   dah-replay --workflows ./workflows.js [--plugins ./plugins.js] [--interceptors MODULE]...
//              [--payload-converter MODULE] [--workflow-id ID] HISTORY.json|FOLDER ...
//
// Exit 0: every run replayed, one line on stdout; 1: a run did not replay, one line on stderr naming the
// file and why; 2: a bad argument, an unreadable file or nothing to replay, one line on stderr.
'use strict';

const { parseArgs } = require('node:util');
const { replay, ReplayFailure, UsageError, oneLine } = require('../lib/replay');

const USAGE =
  'usage: dah-replay --workflows PATH [--plugins MODULE] [--interceptors MODULE]... [--payload-converter MODULE] ' +
  '[--workflow-id ID] HISTORY.json|FOLDER ...';

async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        workflows: { type: 'string' },
        plugins: { type: 'string' },
        interceptors: { type: 'string', multiple: true },
        'payload-converter': { type: 'string' },
        'workflow-id': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      allowPositionals: true,
    });
  } catch (err) {
    throw new UsageError(`${oneLine(err.message)}; ${USAGE}`);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (!values.workflows) throw new UsageError(`--workflows is required (the path your worker's workflowsPath names); ${USAGE}`);
  if (!positionals.length) throw new UsageError(`no history given; ${USAGE}`);
  const line = await replay({
    workflows: values.workflows,
    histories: positionals,
    workflowId: values['workflow-id'],
    plugins: values.plugins,
    interceptors: values.interceptors,
    payloadConverter: values['payload-converter'],
  });
  console.log(line);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    if (err instanceof ReplayFailure) {
      console.error(err.message);
      process.exit(1);
    }
    console.error(err instanceof UsageError ? err.message : `dah-replay: ${oneLine(err && err.message ? err.message : err)}`);
    process.exit(2);
  },
);
