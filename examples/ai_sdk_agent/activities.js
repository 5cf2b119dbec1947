// The agent's tool as an activity: save a note in the notes service (POST {effectsUrl}/v1/notes).
//
// The Idempotency-Key is the activity's identity, `${workflowId}/${runId}/${activityId}`: stable across
// retries of one call, so a retry after a crash (the note applied, the response lost) is answered from the
// service's stored response instead of saving the note twice.
'use strict';

const { ApplicationFailure, Context } = require('@temporalio/activity');

const REQUEST_TIMEOUT_MS = 20_000;

/**
 * The activities of one worker.
 * @param {{effectsUrl: string, bug?: string}} config  `bug` plants a known bug (see worker.js --bug).
 */
function createActivities({ effectsUrl, bug }) {
  return {
    /** @param {{text: string, conversation?: string}} note */
    async saveNote(note) {
      const { workflowExecution, activityId } = Context.current().info;
      const headers = { 'content-type': 'application/json' };
      if (bug !== 'no-idempotency-key') {
        headers['idempotency-key'] = `${workflowExecution.workflowId}/${workflowExecution.runId}/${activityId}`;
      }
      try {
        return await postNote(effectsUrl, headers, note);
      } catch (err) {
        // Planted bug: a failed save reported as saved, so the model tells the user it was.
        if (bug === 'swallow-tool-failure') return { note_id: 'n-0', text: note.text, replayed: false };
        throw err;
      }
    },
  };
}

async function postNote(effectsUrl, headers, note) {
  let response;
  try {
    response = await fetch(`${effectsUrl}/v1/notes`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ text: note.text, conversation: note.conversation }),
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
  } catch (err) {
    throw ApplicationFailure.retryable(`notes service unreachable: ${err.message}`, 'NotesUnavailable');
  }
  const body = (await response.text()).slice(0, 4096);
  if (response.ok) return JSON.parse(body);
  // 4xx: this request will never succeed (the model sees the error); 5xx/429: retried by Temporal.
  const retryable = response.status >= 500 || response.status === 429;
  const message = `notes service answered ${response.status}: ${body}`;
  throw retryable
    ? ApplicationFailure.retryable(message, 'NotesUnavailable')
    : ApplicationFailure.nonRetryable(message, 'NoteRejected');
}

module.exports = { createActivities };
