// The Temporal plugins of this agent's workers: @temporalio/ai-sdk's, its model the AI SDK's OpenAI provider.
// The worker and the replayer (`dah-replay --plugins`) both build them here, so a replay bundles the workflow
// code as a worker does (the plugin adds the polyfills `ai` needs in the sandbox); a replay calls no model.
'use strict';

const { createOpenAI } = require('@ai-sdk/openai');
const { AiSdkPlugin } = require('@temporalio/ai-sdk');

/** @param {{modelUrl?: string, apiKey?: string}} [options]  the OpenAI-compatible base URL (ending in /v1) */
function plugins({ modelUrl, apiKey } = {}) {
  const openai = createOpenAI({ baseURL: modelUrl, apiKey: apiKey || 'unused' });
  return [new AiSdkPlugin({ modelProvider: openai })];
}

module.exports = { plugins };
