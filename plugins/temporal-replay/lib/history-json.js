// A saved History in proto3 JSON -> the History message the SDK's replayer takes.
//
// Read against the reflected schema of the target's own @temporalio/proto, so every SDK version reads the
// histories its own server and tools write, and nothing depends on which copy of protobufjs npm placed where
// (the reason @temporalio/common's historyFromJSON fails on 1.24 installs: README.md, "Why not historyFromJSON").
//
// proto3 JSON, as Temporal's tools and the Python SDK's WorkflowHistory.to_json() write it: lowerCamelCase
// names (the proto's snake_case names are accepted too), enums by name (or number; the PascalCase names of
// old tctl output too), 64-bit integers as strings, bytes in base64, Timestamp as RFC 3339 text, Duration as
// "1.5s". Fields the schema does not know are skipped, as the SDK's own reader does: a newer server's fields.
'use strict';

class HistoryFormatError extends Error {}

const TIMESTAMP = '.google.protobuf.Timestamp';
const DURATION = '.google.protobuf.Duration';
const NANOS_PER_SECOND = 1_000_000_000;

/**
 * The History message of `json` (a parsed proto3 JSON object with an `events` array).
 * @param {object} proto  the target's `require('@temporalio/proto')` (a protobufjs Root)
 * @param {unknown} json
 */
function historyFromProtoJson(proto, json) {
  if (json === null || typeof json !== 'object' || !Array.isArray(json.events)) {
    throw new HistoryFormatError('expected an object with an "events" array');
  }
  if (!json.events.length) throw new HistoryFormatError('"events" is empty');
  const type = proto.lookupType('temporal.api.history.v1.History');
  type.root.resolveAll();
  const history = readMessage(type, json, '$');
  history.events.forEach((event, i) => withEventType(proto, event, `$.events[${i}]`));
  // Core stops with a panic, not an error, on a history that does not begin with the run's start.
  if (!history.events[0].workflowExecutionStartedEventAttributes) {
    throw new HistoryFormatError("its first event is not WorkflowExecutionStarted, where every run's history begins");
  }
  return type.fromObject(history);
}

/** An event's type, which Core reads, from its attributes where the JSON leaves it out. */
function withEventType(proto, event, at) {
  const attributes = Object.keys(event).filter((k) => k.endsWith('EventAttributes'));
  if (attributes.length !== 1) throw new HistoryFormatError(`${at}: expected one *EventAttributes field`);
  if (event.eventType) return;
  const name = `EVENT_TYPE_${attributes[0].replace(/EventAttributes$/, '').replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`;
  const value = proto.lookupEnum('temporal.api.enums.v1.EventType').values[name];
  if (value === undefined) throw new HistoryFormatError(`${at}: no event type and unknown attributes ${attributes[0]}`);
  event.eventType = value;
}

function readMessage(type, json, at) {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw new HistoryFormatError(`${at}: expected an object for ${type.fullName.slice(1)}`);
  }
  const fields = fieldsByJsonName(type);
  const out = {};
  for (const [key, value] of Object.entries(json)) {
    const field = fields.get(key);
    if (!field || value === null) continue; // unknown to this SDK's schema, or proto3 JSON's "default"
    const here = `${at}.${key}`;
    if (field.map) {
      if (typeof value !== 'object' || Array.isArray(value)) throw new HistoryFormatError(`${here}: expected a map`);
      out[field.name] = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, readValue(field, v, `${here}.${k}`)]));
    } else if (field.repeated) {
      if (!Array.isArray(value)) throw new HistoryFormatError(`${here}: expected a list`);
      out[field.name] = value.map((v, i) => readValue(field, v, `${here}[${i}]`));
    } else {
      out[field.name] = readValue(field, value, here);
    }
  }
  return out;
}

/** One value of `field` (an element, for a list or map field). */
function readValue(field, value, at) {
  const resolved = field.resolvedType;
  if (resolved && resolved.values) return readEnum(resolved, value, at);
  if (resolved) {
    if (resolved.fullName === TIMESTAMP) return readTimestamp(value, at);
    if (resolved.fullName === DURATION) return readDuration(value, at);
    return readMessage(resolved, value, at);
  }
  switch (field.type) {
    case 'bytes':
      if (typeof value !== 'string') throw new HistoryFormatError(`${at}: expected base64 text`);
      return value.replace(/-/g, '+').replace(/_/g, '/'); // the URL-safe alphabet is proto3 JSON too
    case 'double':
    case 'float':
      return typeof value === 'string' ? Number(value) : value; // "NaN", "Infinity", or a quoted number
    case 'int32':
    case 'uint32':
    case 'sint32':
    case 'fixed32':
    case 'sfixed32':
      return typeof value === 'string' ? Number(value) : value;
    default:
      return value; // 64-bit integers stay text (protobufjs reads them into Longs), strings and bools as they are
  }
}

function readEnum(enumType, value, at) {
  if (typeof value === 'number') return value;
  if (typeof value !== 'string') throw new HistoryFormatError(`${at}: expected an enum name or number`);
  if (value in enumType.values) return enumType.values[value];
  // Old tctl JSON: "WorkflowExecutionStarted" for EVENT_TYPE_WORKFLOW_EXECUTION_STARTED.
  const constant = `${enumPrefix(enumType)}${value.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase()}`;
  return constant in enumType.values ? enumType.values[constant] : 0; // unknown to this SDK: its default, as protojson
}

/** What every name of an enum begins with ("EVENT_TYPE_"), found from its zero value ("EVENT_TYPE_UNSPECIFIED"). */
function enumPrefix(enumType) {
  const zero = Object.keys(enumType.values).find((name) => enumType.values[name] === 0) || '';
  return zero.endsWith('_UNSPECIFIED') ? zero.slice(0, -'UNSPECIFIED'.length) : '';
}

const RFC3339 = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$/i;

function readTimestamp(value, at) {
  if (value !== null && typeof value === 'object') return value; // already {seconds, nanos}
  const m = typeof value === 'string' ? RFC3339.exec(value) : null;
  if (!m) throw new HistoryFormatError(`${at}: expected an RFC 3339 timestamp, got ${JSON.stringify(value)}`);
  const millis = Date.parse(`${m[1]}${m[3].toUpperCase() === 'Z' ? 'Z' : m[3]}`);
  if (Number.isNaN(millis)) throw new HistoryFormatError(`${at}: not a date: ${JSON.stringify(value)}`);
  return { seconds: String(Math.floor(millis / 1000)), nanos: Number((m[2] || '').padEnd(9, '0')) };
}

function readDuration(value, at) {
  if (value !== null && typeof value === 'object') return value;
  const m = typeof value === 'string' ? /^(-)?(\d+)(?:\.(\d{1,9}))?s$/.exec(value) : null;
  if (!m) throw new HistoryFormatError(`${at}: expected a duration such as "1.5s", got ${JSON.stringify(value)}`);
  const sign = m[1] ? -1 : 1;
  const nanos = Number((m[3] || '').padEnd(9, '0'));
  if (nanos >= NANOS_PER_SECOND) throw new HistoryFormatError(`${at}: bad duration ${value}`);
  return { seconds: `${m[1] || ''}${m[2]}`, nanos: sign * nanos };
}

const byType = new WeakMap();

/** A type's fields by their JSON names: lowerCamelCase and the proto's snake_case. */
function fieldsByJsonName(type) {
  let fields = byType.get(type);
  if (!fields) {
    fields = new Map();
    for (const field of type.fieldsArray) {
      field.resolve();
      fields.set(field.name, field);
      fields.set(field.name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), field);
      if (field.options && field.options.json_name) fields.set(field.options.json_name, field);
    }
    byType.set(type, fields);
  }
  return fields;
}

module.exports = { historyFromProtoJson, HistoryFormatError };
