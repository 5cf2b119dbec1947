// SignalChat: one workflow per conversation. Each user message is the Signal `userMessage` ({id, text});
// the Query `messages` returns the conversation as [{role, content}]. Messages are answered one at a time, in
// the order they arrived, by the main loop. A message whose id was already seen is dropped (a client re-sends a
// signal when it cannot tell whether it was delivered). The Signal `end` ends the chat once its queue is empty.
'use strict';

const { TemporalProvider } = require('@temporalio/ai-sdk/workflow');
const { generateText, stepCountIs, tool } = require('ai');
const wf = require('@temporalio/workflow');
const { z } = require('zod');

const MODEL = 'gpt-4o-mini';
const MAX_TURNS = 50; // per run; after that (or when Temporal suggests it) the chat continues as new
const SYSTEM = 'You are a helpful assistant. Use the calculate tool for arithmetic.';

const RETRY = { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '10 seconds' };
const model = new TemporalProvider({ default: { startToCloseTimeout: '30 seconds', retry: RETRY } })
  .languageModel(MODEL);
const { calculate } = wf.proxyActivities({ startToCloseTimeout: '10 seconds', retry: RETRY });

const userMessage = wf.defineSignal('userMessage');
const end = wf.defineSignal('end');
const messages = wf.defineQuery('messages');

const tools = {
  calculate: tool({
    description: 'Evaluate an arithmetic expression with + - * / and parentheses, e.g. "(2 + 3) * 4".',
    inputSchema: z.object({ expression: z.string().describe('the expression to evaluate') }),
    execute: async ({ expression }) => calculate(expression),
  }),
};

/**
 * @param {{history?: {role: string, content: string}[], seen?: string[],
 *          pending?: {id: string, text: string}[], ending?: boolean}} [state]
 *   what continue-as-new carries; a new chat starts with none of it.
 */
async function SignalChat(state = {}) {
  const history = state.history ?? [];
  const seen = new Set(state.seen ?? []);
  const pending = state.pending ?? [];
  let ending = state.ending ?? false;

  wf.setHandler(userMessage, ({ id, text }) => {
    if (seen.has(id)) return; // a re-sent copy of a message we already have
    seen.add(id);
    pending.push({ id, text });
  });
  wf.setHandler(end, () => { ending = true; });
  wf.setHandler(messages, () => history);

  for (let turns = 1; ; turns++) {
    await wf.condition(() => pending.length > 0 || ending);
    if (pending.length === 0) return history; // ended, and every message answered
    const { text } = pending.shift();
    history.push({ role: 'user', content: text });
    history.push({ role: 'assistant', content: await reply(history) });
    if (turns >= MAX_TURNS || wf.workflowInfo().continueAsNewSuggested) {
      // Messages signalled meanwhile (even while this run hands over) are in `pending`: the next run answers them.
      await wf.condition(wf.allHandlersFinished);
      return await wf.continueAsNew({ history, seen: [...seen], pending, ending });
    }
  }
}

async function reply(history) {
  try {
    const result = await generateText({ model, system: SYSTEM, messages: history.slice(), tools,
                                        stopWhen: stepCountIs(8) });
    return result.text;
  } catch (err) {
    // Activities retry until they succeed, so this is a bug or a refusal: say so, and keep the chat going.
    wf.log.warn('turn failed', { error: String(err) });
    return `Sorry, I could not answer that (${err.message}).`;
  }
}

module.exports = { SignalChat };
