// Workflow interceptor of replay.js (never loaded by the worker): reports each activity the workflow
// schedules, with its arguments, through the `strictReplay` sink, which replay.js compares with the
// history's ActivityTaskScheduled events. It observes only: the commands are the workflow's own.
'use strict';

const { proxySinks } = require('@temporalio/workflow');

const { strictReplay } = proxySinks();

function interceptors() {
  return {
    outbound: [
      {
        scheduleActivity(input, next) {
          const activityId = input.options.activityId ?? `${input.seq}`;
          strictReplay.scheduled(activityId, input.activityType, input.args);
          return next(input);
        },
      },
    ],
  };
}

module.exports = { interceptors };
