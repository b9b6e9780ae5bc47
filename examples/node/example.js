#!/usr/bin/env node
// A storaged client in Node.js (@grpc/grpc-js, stubs loaded at run time by
// @grpc/proto-loader): it produces messages (PutMessage, PutMessages,
// PutMessageStream), reads one back by msgId, consumes a queue by following
// next_offset, recovers from an out-of-range offset with the bounds its
// ErrorInfo carries, waits for a new message with a long poll, and reads the
// ErrorInfo and BadRequest of a refused put.
//
//   npm ci && node example.js --addr 127.0.0.1:9090 --topic ExampleNode
//
// It prints one JSON object per step on stdout (the format is described in
// examples/README.md) so that examples/examples_test.go can check what it
// says against the store; a real client would act on the values instead.
// The same scenario is written in Go (examples/go) and Python
// (examples/python).
'use strict';

const path = require('node:path');
const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');
const googleProtoFiles = require('google-proto-files');

// The one queue the example uses, so that every message it stores is in one
// consume queue and a pull sees them all in order.
const QUEUE_ID = 0;

// storaged's API, from the repository's proto directory. keepCase keeps the
// proto field names (queue_offset); longs: Number is exact below 2^53.
const PROTO_DIR = path.resolve(__dirname, '..', '..', 'proto');
const storaged = grpc.loadPackageDefinition(protoLoader.loadSync('storaged/v1/message_store.proto', {
  includeDirs: [PROTO_DIR], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
})).storaged.v1;

// google.rpc.Status and its detail messages, from googleapis' own protos
// (the google-proto-files package), to decode grpc-status-details-bin.
const rpc = new protobuf.Root().loadSync([
  googleProtoFiles.getProtoPath('rpc', 'status.proto'),
  googleProtoFiles.getProtoPath('rpc', 'error_details.proto'),
], { keepCase: true });
const RpcStatus = rpc.lookupType('google.rpc.Status');

function out(event) {
  console.log(JSON.stringify(event));
}

async function main() {
  const { values } = parseArgs({
    options: {
      addr: { type: 'string', default: process.env.STORAGED_ADDR || '127.0.0.1:9090' },
      topic: { type: 'string', default: process.env.STORAGED_TOPIC || 'ExampleNode' },
    },
  });
  const client = new storaged.MessageStoreService(values.addr, grpc.credentials.createInsecure());
  try {
    await run(client, values.topic);
  } finally {
    client.close();
  }
}

async function run(client, topic) {
  // The whole run is bounded: every call below carries this deadline.
  const deadline = Date.now() + 60_000;
  const call = (method, req) => new Promise((resolve, reject) => {
    client[method](req, { deadline }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
  let stored = 0;

  // 1. Produce: one message per call. PUT_OK means stored (and, with the
  // default wait_store_ok, readable at once).
  let first;
  for (let i = 0; i < 2; i++) {
    const m = newMessage(topic, `hello ${i} from node`);
    const resp = await call('PutMessage', { message: m });
    if (resp.status !== 'PUT_MESSAGE_STATUS_PUT_OK') throw new Error(`PutMessage: status ${resp.status}`);
    first = first || resp.result;
    out(putEvent('PutMessage', 0, resp.status, m, resp.result));
    stored++;
  }

  // 2. A batch: consecutive queue offsets, all or nothing.
  const bodies = ['batch a', 'batch b', 'batch c'];
  const bresp = await call('PutMessages', {
    topic, queue_id: QUEUE_ID, messages: bodies.map((b) => ({ body: Buffer.from(b), tags: 'batch' })),
  });
  const r = bresp.result;
  out({
    event: 'batch', status: bresp.status, topic, queue_id: r.queue_id, queue_offset: r.queue_offset,
    msg_id: r.msg_id, wrote_offset: r.wrote_offset, wrote_bytes: r.wrote_bytes, store_ms: millis(r.store_timestamp),
    message_count: r.message_count, msg_ids: r.msg_ids, bodies,
  });
  stored += bodies.length;

  // 3. A stream: many messages in flight on one call, one answer each,
  // matched by request_id, in completion order. A bad message is answered
  // with a code and reason and does not end the stream.
  stored += await produceStream(client, topic, deadline);

  // 4. Read one message back by the msgId its put returned.
  const got = await call('GetMessage', { msg_id: first.msg_id, include_raw: true });
  out(messageEvent('GetMessage', got.message));

  // 5. Consume the queue from its first readable offset, following
  // next_offset, until every message stored above has come back. Small
  // pulls, so that it takes several; the wait lets a pull at the end of the
  // queue wait for the next message instead of returning empty.
  const info = await call('GetQueueInfo', { topic, queue_id: QUEUE_ID });
  let offset = info.min_offset;
  for (let received = 0; received < stored;) {
    const resp = await pull(call, 'PullMessages', topic, offset, 4, 1);
    received += resp.messages.length;
    offset = resp.next_offset;
  }

  // 6. A consumer whose saved offset is past the end (say, a store that was
  // replaced) is told OUT_OF_RANGE; the ErrorInfo carries the readable
  // bounds, so it goes on from max_offset.
  let resume;
  try {
    await call('PullMessages', { topic, queue_id: QUEUE_ID, queue_offset: 1_000_000 });
    throw new Error('PullMessages past the end succeeded');
  } catch (err) {
    if (err.code !== grpc.status.OUT_OF_RANGE) throw err;
    const ev = errorEvent('PullMessages', err);
    out(ev);
    resume = Number(ev.metadata && ev.metadata.max_offset);
    if (!Number.isInteger(resume)) throw new Error(`OUT_OF_RANGE without max_offset: ${err.message}`);
  }

  // 7. Long poll: a pull at the end of the queue waits (up to its wait) and
  // returns as soon as a message arrives. The late message is put
  // concurrently; whether it reaches the server before or after the poll
  // does, the poll returns it.
  const late = newMessage(topic, 'late message from node');
  const put = call('PutMessage', { message: late });
  put.catch(() => {}); // awaited below; not an unhandled rejection meanwhile
  for (offset = resume; ;) {
    const resp = await pull(call, 'long poll', topic, offset, 32, 5);
    if (resp.messages.length > 0) break;
    offset = resp.next_offset; // the wait ran out first: poll again
  }
  const lresp = await put;
  out(putEvent('PutMessage', 0, lresp.status, late, lresp.result));
  stored++;

  // 8. A refused put: INVALID_ARGUMENT, with ErrorInfo (reason
  // MESSAGE_ILLEGAL, the RocketMQ status name) and a BadRequest naming the
  // field.
  try {
    await call('PutMessage', { message: { topic: '../etc', body: Buffer.from('x') } });
    throw new Error('PutMessage with a bad topic succeeded');
  } catch (err) {
    if (err.code !== grpc.status.INVALID_ARGUMENT) throw err;
    out(errorEvent('PutMessage', err));
  }

  out({ event: 'done', stored });
}

// newMessage is a message with every optional field a producer usually
// sets. The born time is in milliseconds, the precision the store keeps.
function newMessage(topic, body) {
  const ms = Date.now();
  return {
    topic, queue_id: QUEUE_ID, body: Buffer.from(body), tags: 'example', keys: 'k1 k2',
    born_timestamp: { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 },
    properties: { lang: 'node' },
  };
}

// produceStream sends four good messages and one bad one on a
// PutMessageStream, writing without waiting for answers (the server holds
// at most 256 unanswered ones), and prints each answer. It resolves to how
// many were stored.
function produceStream(client, topic, deadline) {
  return new Promise((resolve, reject) => {
    const stream = client.PutMessageStream({ deadline });
    const sent = new Map();
    let stored = 0;
    stream.on('data', (resp) => {
      if (resp.code !== grpc.status.OK) {
        out({
          event: 'stream_error', request_id: resp.request_id, code: resp.code, reason: resp.reason,
          message: resp.error_message,
        });
        return;
      }
      out(putEvent('PutMessageStream', resp.request_id, resp.status, sent.get(resp.request_id), resp.result));
      stored++;
    });
    stream.on('error', reject); // the stream failed: unanswered messages may or may not be stored
    stream.on('end', () => resolve(stored)); // every answer was sent
    for (let i = 0; i < 5; i++) {
      const m = newMessage(topic, `stream ${i} from node`);
      if (i === 3) m.topic = ''; // refused: MESSAGE_ILLEGAL
      sent.set(i + 1, m);
      stream.write({ request_id: i + 1, message: m });
    }
    stream.end();
  });
}

// pull runs one PullMessages and prints it and the messages it returned.
async function pull(call, via, topic, offset, maxMessages, waitSeconds) {
  const resp = await call('PullMessages', {
    topic, queue_id: QUEUE_ID, queue_offset: offset, max_messages: maxMessages, wait: { seconds: waitSeconds },
  });
  out({
    event: 'pull', via, queue_offset: offset, count: resp.messages.length, next_offset: resp.next_offset,
    min_offset: resp.min_offset, max_offset: resp.max_offset,
  });
  for (const m of resp.messages) out(messageEvent(via, m));
  return resp;
}

function millis(ts) {
  return ts.seconds * 1000 + Math.floor(ts.nanos / 1e6);
}

function putEvent(via, requestId, status, m, r) {
  const ev = {
    event: 'put', via, status, topic: m.topic, queue_id: r.queue_id, queue_offset: r.queue_offset,
    msg_id: r.msg_id, wrote_offset: r.wrote_offset, wrote_bytes: r.wrote_bytes, store_ms: millis(r.store_timestamp),
    body: m.body.toString(), tags: m.tags, keys: m.keys, properties: m.properties, born_ms: millis(m.born_timestamp),
  };
  if (requestId) ev.request_id = requestId;
  return ev;
}

function messageEvent(via, m) {
  const ev = {
    event: 'message', via, topic: m.topic, queue_id: m.queue_id, queue_offset: m.queue_offset,
    commit_log_offset: m.commit_log_offset, msg_id: m.msg_id, body: m.body.toString(), tags: m.tags, keys: m.keys,
    properties: m.properties, born_ms: millis(m.born_timestamp), store_ms: millis(m.store_timestamp),
    born_host: m.born_host, store_host: m.store_host, store_size: m.store_size,
  };
  if (m.raw.length > 0) ev.raw_hex = m.raw.toString('hex');
  return ev;
}

// errorEvent decodes the rich error model: the gRPC code, and the
// google.rpc.Status details storaged attaches (grpc-status-details-bin).
// Every storaged error carries an ErrorInfo (domain "storaged"; reason the
// RocketMQ status name or a read reason); bad requests add a BadRequest,
// retryable ones a RetryInfo.
function errorEvent(callName, err) {
  const ev = { event: 'error', call: callName, code: err.code, message: err.details };
  const [raw] = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (!raw) return ev;
  for (const any of RpcStatus.decode(raw).details) {
    const name = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
    const type = rpc.lookup(name);
    if (!(type instanceof protobuf.Type)) continue; // a detail this client does not know
    const d = type.toObject(type.decode(any.value), { longs: Number, defaults: true });
    if (name === 'google.rpc.ErrorInfo') {
      Object.assign(ev, { reason: d.reason, domain: d.domain, metadata: d.metadata });
    } else if (name === 'google.rpc.BadRequest') {
      ev.field_violations = d.field_violations.map((v) => v.field);
    } else if (name === 'google.rpc.RetryInfo') {
      ev.retry_delay_ms = d.retry_delay.seconds * 1000 + Math.floor(d.retry_delay.nanos / 1e6);
    }
  }
  return ev;
}

main().catch((err) => {
  console.error('example:', err);
  process.exitCode = 1;
});
