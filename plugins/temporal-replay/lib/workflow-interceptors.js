// Bundled into the replayed workflow code, last of its interceptors (innermost: it sees each call as it
// becomes a command). Reports every activity and child workflow the code starts, with its arguments, through
// the `dahReplay` sink, which lib/replay.js compares with the history's events. It observes only.
//
// `@temporalio/workflow` here is the target's own: lib/replay.js points the bundler at it.
'use strict';

const { proxySinks } = require('@temporalio/workflow');

const { dahReplay } = proxySinks();

function interceptors() {
  return {
    outbound: [
      {
        scheduleActivity(input, next) {
          // The SDK's own default activity id is the command's sequence number.
          dahReplay.activity(input.options.activityId ?? `${input.seq}`, input.activityType, input.args);
          return next(input);
        },
        scheduleLocalActivity(input, next) {
          dahReplay.localActivity(input.activityType); // its input is not in the history: counted, not compared
          return next(input);
        },
        startChildWorkflowExecution(input, next) {
          dahReplay.childWorkflow(input.options.workflowId, input.workflowType, input.options.args ?? []);
          return next(input);
        },
      },
    ],
  };
}

module.exports = { interceptors };
