// Strict comparison: what the replay scheduled against what the history recorded.
//
// Each argument is encoded by the target's payload converter, as its worker would send it, and compared with
// the history's payload (decoded by the target's codecs): JSON by parsed value, so key order is no
// difference; any other encoding byte for byte. A difference is reported at the first JSON path that differs.
'use strict';

const SHOWN_CHARS = 300;
const JSON_ENCODING = 'json/plain';
const decoder = new TextDecoder();

/** The scheduling events of a History message: activity id / child workflow id -> {type, payloads, eventId}. */
function scheduledInHistory(history) {
  const activities = new Map();
  const children = new Map();
  for (const event of history.events || []) {
    const activity = event.activityTaskScheduledEventAttributes;
    if (activity) {
      activities.set(activity.activityId, {
        type: activity.activityType?.name,
        payloads: activity.input?.payloads || [],
        eventId: Number(event.eventId),
      });
    }
    const child = event.startChildWorkflowExecutionInitiatedEventAttributes;
    if (child) {
      children.set(child.workflowId, {
        type: child.workflowType?.name,
        payloads: child.input?.payloads || [],
        eventId: Number(event.eventId),
      });
    }
  }
  return { activities, children };
}

/** The history's payloads as the worker's converter sees them: through the codecs, last one first. */
async function decodePayloads(payloads, codecs) {
  let decoded = payloads;
  for (const codec of [...codecs].reverse()) decoded = await codec.decode(decoded);
  return decoded;
}

/**
 * Where `args` (encoded by `converter`) differ from `payloads`, as {path, history, replay} texts, or undefined.
 * @param {{toPayload(value: unknown): object}} converter
 */
function argumentsDiffer(converter, args, payloads) {
  if (args.length !== payloads.length) {
    return { path: '$', history: `${payloads.length} argument(s)`, replay: `${args.length} argument(s)` };
  }
  for (let i = 0; i < args.length; i += 1) {
    const now = converter.toPayload(args[i]);
    const then = payloads[i];
    const at = `$[${i}]`;
    const nowEncoding = encodingOf(now);
    const thenEncoding = encodingOf(then);
    if (nowEncoding === JSON_ENCODING && thenEncoding === JSON_ENCODING) {
      const a = JSON.parse(decoder.decode(then.data ?? new Uint8Array()));
      const b = JSON.parse(decoder.decode(now.data ?? new Uint8Array()));
      const found = firstDifference(a, b, at);
      if (found) return found;
    } else if (nowEncoding !== thenEncoding) {
      return { path: at, history: `encoding ${thenEncoding}`, replay: `encoding ${nowEncoding}` };
    } else if (!sameBytes(now.data, then.data)) {
      return { path: at, history: hex(then.data), replay: hex(now.data) };
    }
  }
  return undefined;
}

/** The first path where two parsed JSON values differ, with each side's value there, or undefined. */
function firstDifference(a, b, path) {
  if (Array.isArray(a) && Array.isArray(b)) {
    for (let i = 0; i < Math.min(a.length, b.length); i += 1) {
      const found = firstDifference(a[i], b[i], `${path}[${i}]`);
      if (found) return found;
    }
    return a.length === b.length ? undefined : shown(path, a, b);
  }
  if (isObject(a) && isObject(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    for (const key of keys) {
      if (!(key in a) || !(key in b)) return shown(pathOf(path, key), a[key], b[key]);
      const found = firstDifference(a[key], b[key], pathOf(path, key));
      if (found) return found;
    }
    return undefined;
  }
  return a === b ? undefined : shown(path, a, b);
}

function shown(path, history, replay) {
  const a = history === undefined ? '(absent)' : JSON.stringify(history);
  const b = replay === undefined ? '(absent)' : JSON.stringify(replay);
  const at = commonPrefix(a, b);
  return { path, history: clip(a, at), replay: clip(b, at) };
}

function pathOf(path, key) {
  return /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function encodingOf(payload) {
  const raw = payload?.metadata?.encoding;
  return raw ? decoder.decode(raw) : '(none)';
}

function sameBytes(a, b) {
  const x = a ?? new Uint8Array();
  const y = b ?? new Uint8Array();
  return x.length === y.length && x.every((byte, i) => byte === y[i]);
}

function hex(bytes) {
  return clip(Buffer.from(bytes ?? []).toString('hex'), 0);
}

function commonPrefix(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i += 1;
  return i;
}

/** SHOWN_CHARS of `text` from a little before character `at` (where the two values part), marked where cut. */
function clip(text, at) {
  const start = Math.max(0, at - 60);
  const end = Math.min(text.length, start + SHOWN_CHARS);
  return `${start > 0 ? '...' : ''}${text.slice(start, end)}${end < text.length ? '...' : ''}`;
}

module.exports = { argumentsDiffer, decodePayloads, firstDifference, scheduledInHistory };
