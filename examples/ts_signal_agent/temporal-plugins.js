// The worker's Temporal plugins, in one place so the replayer (`dah-replay --plugins`) bundles the workflow
// code as the worker does: @temporalio/ai-sdk's plugin, its model the AI SDK's OpenAI provider.
'use strict';

const { createOpenAI } = require('@ai-sdk/openai');
const { AiSdkPlugin } = require('@temporalio/ai-sdk');

/** @param {{modelUrl?: string, apiKey?: string}} [options]  an OpenAI-compatible base URL (ending in /v1) */
function plugins({ modelUrl, apiKey } = {}) {
  return [new AiSdkPlugin({ modelProvider: createOpenAI({ baseURL: modelUrl, apiKey: apiKey || 'unused' }) })];
}

module.exports = { plugins };
