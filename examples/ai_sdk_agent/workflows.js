// A chat agent as a Temporal workflow, its model the Vercel AI SDK's through @temporalio/ai-sdk.
//
// Each user message is an Update `send` whose result is the reply string; the conversation lives in the
// workflow and is read by the Query `messages` as [{role, content}]. After `maxTurns` turns, or the first
// turn that leaves the history at `maxHistoryEvents` events or more, the workflow continues as new, carrying
// the conversation. Model calls are activities (the plugin's `invokeModel`);
// the tool `saveNote` is the activity of activities.js. Workflow code is deterministic: no I/O, clock or
// random here; the SDK's bundler runs this file in its sandbox.
'use strict';

// Workflow code imports @temporalio/ai-sdk/workflow, not the package root (whose activities the sandbox refuses);
// the polyfills `ai` needs in the sandbox come from the plugin (temporal-plugins.js), which the bundle starts with.
const { TemporalProvider } = require('@temporalio/ai-sdk/workflow');
const { generateText, stepCountIs, tool } = require('ai');
const wf = require('@temporalio/workflow');
const { z } = require('zod');

const DEFAULT_MODEL = 'scripted';
const DEFAULT_MAX_TURNS = 10;
const SYSTEM = 'You are a helpful assistant. Use the saveNote tool when asked to save a note.';

// Every activity call states its timeouts and retry policy where it is made.
const RETRY = { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '10 seconds' };
const MODEL_START_TO_CLOSE = '60 seconds';
const models = new TemporalProvider({
  default: { startToCloseTimeout: MODEL_START_TO_CLOSE, retry: RETRY },
});
const { saveNote } = wf.proxyActivities({ startToCloseTimeout: '30 seconds', retry: RETRY });

const sendUpdate = wf.defineUpdate('send');
const messagesQuery = wf.defineQuery('messages');

/**
 * The chat workflow.
 * @param {{model?: string, maxTurns?: number, maxHistoryEvents?: number, modelStartToClose?: string,
 *          history?: {role: string, content: string}[],
 *          answered?: Object<string, string>}} [input]
 *   `history` and `answered` are what continue-as-new carries; a first start leaves them out.
 *   `modelStartToClose` (e.g. '10 seconds'): the model activity's start-to-close, instead of 60 s. invokeModel
 *   never heartbeats, so this is the only setting that notices a worker killed mid call.
 */
async function ChatWorkflow(input = {}) {
  const provider = input.modelStartToClose
    ? new TemporalProvider({ default: { startToCloseTimeout: input.modelStartToClose, retry: RETRY } })
    : models;
  const model = provider.languageModel(input.model || DEFAULT_MODEL);
  const maxTurns = input.maxTurns || DEFAULT_MAX_TURNS;
  const maxHistoryEvents = input.maxHistoryEvents || 0; // 0: by turns only
  const history = Array.isArray(input.history) ? input.history.slice() : [];
  // Update id -> its reply, carried across continue-as-new: a message re-sent with the same update id
  // after the run it was answered in continued as new gets that reply, not a second turn.
  const answered = new Map(Object.entries(input.answered || {}));
  const conversation = wf.workflowInfo().workflowId;
  let turns = 0;
  let busy = false; // one turn at a time: an update waits for the turn before it

  const tools = {
    saveNote: tool({
      description: 'Save a note in the notes service; returns the saved note.',
      inputSchema: z.object({ text: z.string().describe('the note text, verbatim') }),
      execute: async ({ text }) => saveNote({ text, conversation }),
    }),
  };

  wf.setHandler(messagesQuery, () => history.map(({ role, content }) => ({ role, content })));
  wf.setHandler(
    sendUpdate,
    async (message) => {
      const updateId = wf.currentUpdateInfo()?.id;
      if (updateId && answered.has(updateId)) return answered.get(updateId);
      await wf.condition(() => !busy);
      busy = true;
      const checkpoint = history.length;
      try {
        history.push({ role: 'user', content: messageText(message) });
        const result = await generateText({
          model,
          system: SYSTEM,
          messages: history.slice(),
          tools,
          stopWhen: stepCountIs(5),
        });
        history.push({ role: 'assistant', content: result.text });
        turns += 1;
        if (updateId) remember(answered, updateId, result.text);
        return result.text;
      } catch (err) {
        // This turn fails, the conversation does not: roll the turn back so the message can be sent again.
        history.splice(checkpoint);
        throw wf.ApplicationFailure.nonRetryable(`turn failed: ${err && err.message}`, 'TurnFailed');
      } finally {
        busy = false;
      }
    },
    {
      validator: (message) => {
        if (typeof messageText(message) !== 'string') throw new Error('send takes a string or {text: string}');
      },
    },
  );

  const longEnough = () =>
    turns >= maxTurns || (maxHistoryEvents > 0 && turns > 0 && wf.workflowInfo().historyLength >= maxHistoryEvents);
  await wf.condition(() => longEnough() && !busy && wf.allHandlersFinished());
  await wf.continueAsNew({ ...input, history, answered: Object.fromEntries(answered) });
}

const ANSWERED_KEPT = 64;

/** Record an update's reply, keeping the newest ANSWERED_KEPT (what continue-as-new carries stays bounded). */
function remember(answered, updateId, reply) {
  answered.set(updateId, reply);
  while (answered.size > ANSWERED_KEPT) answered.delete(answered.keys().next().value);
}

/** The user text of an update argument: a string, or `{text}`. */
function messageText(message) {
  return message !== null && typeof message === 'object' ? message.text : message;
}

module.exports = { ChatWorkflow };
