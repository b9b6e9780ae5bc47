'use strict';
// Apache's RocketMQ 5 Node.js SDK (rocketmq-client-nodejs), unchanged, as a
// producer against storaged: rocketmq_sdk_test.go runs it and checks what
// it prints against what storaged holds (read back through storaged.v1).
//
//   node producer.js --endpoints 127.0.0.1:PORT --topic T [--count N [--inflight K] | --timers MS]
//
// Prints one JSON line per send: {"kind", "body", "tag", "keys", "group",
// "props", "messageId", "offset"} for a receipt, {"kind", "error", "code"}
// for a send the SDK or the server refused. With --count N it sends N
// messages of 1 KiB, K at a time (default 1), and prints
// {"kind":"bench","count","inflight","ms"} instead (BENCHMARKS.md). With
// --timers MS it sends timer messages instead: "timer-0" due in MS ms and
// "timer-recalled" due in MS/2 ms, recalls the second (twice: the second
// recall must fail), and prints {"kind":"timer", ..., "recallHandle",
// "deliverAt"} per send and {"kind":"recall", "messageId"} or {"kind":
// "recall", "error", "message"} per recall.

const { format } = require('node:util');
const { Producer } = require('rocketmq-client-nodejs');

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

// A logger that keeps the SDK off stdout (the test parses stdout): one
// line per warning or error on stderr.
const line = (level, a) => console.error(level, format(...a).split('\n')[0]);
const logger = { info() {}, debug() {}, warn(...a) { line('warn', a); }, error(...a) { line('error', a); }, close() {} };

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

// HA_NOT_AVAILABLE: a replication group's leader could not commit now
// (nothing was stored). The SDK retries it at once, within a millisecond;
// an application waits a little and sends again, as this does.
const HA_NOT_AVAILABLE = 50002;

async function send(producer, kind, msg) {
  for (let haRetries = 0; ; haRetries++) {
    try {
      const r = await producer.send(msg);
      out({
        kind, body: msg.body.toString(), tag: msg.tag || '', keys: msg.keys || [], group: msg.messageGroup || '',
        props: msg.properties ? Object.fromEntries(msg.properties) : {}, messageId: r.messageId, offset: Number(r.offset), haRetries,
        recallHandle: r.recallHandle || '', deliverAt: msg.deliveryTimestamp ? msg.deliveryTimestamp.getTime() : 0,
      });
      return r;
    } catch (err) {
      if (err.code === HA_NOT_AVAILABLE && haRetries < 20) {
        await new Promise(resolve => setTimeout(resolve, 250));
        continue;
      }
      out({ kind, error: err.name || String(err), code: typeof err.code === 'number' ? err.code : 0, message: String(err.message), haRetries });
      return;
    }
  }
}

async function main() {
  const endpoints = arg('endpoints');
  const topic = arg('topic');
  const count = Number(arg('count', '0'));
  const inflight = Math.max(1, Number(arg('inflight', '1')));
  const timers = Number(arg('timers', '0'));
  if (!endpoints || !topic) throw new Error('usage: node producer.js --endpoints host:port --topic T [--count N]');
  // topic given at start: the SDK queries the route and waits for the
  // server's answer to its settings on the telemetry stream.
  const producer = new Producer({ endpoints, namespace: '', topic, logger, requestTimeout: 10000 });
  await producer.startup();
  try {
    if (count > 0) {
      const body = Buffer.alloc(1024, 'x');
      let next = 0;
      const worker = async () => {
        while (next < count) {
          next++;
          await producer.send({ topic, body });
        }
      };
      const began = Date.now();
      await Promise.all(Array.from({ length: inflight }, worker));
      out({ kind: 'bench', count, inflight, ms: Date.now() - began });
      return;
    }
    if (timers > 0) {
      const now = Date.now();
      await send(producer, 'timer', { topic, body: Buffer.from('timer-0'), deliveryTimestamp: new Date(now + timers) });
      const r = await send(producer, 'timer', { topic, body: Buffer.from('timer-recalled'), deliveryTimestamp: new Date(now + timers / 2) });
      for (let i = 0; i < 2; i++) {
        try {
          const rr = await producer.recallMessage(topic, r ? r.recallHandle : '');
          out({ kind: 'recall', messageId: rr.messageId });
        } catch (err) {
          out({ kind: 'recall', error: err.name || String(err), message: String(err.message) });
        }
      }
      return;
    }
    await send(producer, 'normal', { topic, body: Buffer.from('normal-0') });
    await send(producer, 'tagged', {
      topic, body: Buffer.from('tagged-0'), tag: 'TagA', keys: [ 'order-1', 'user-7' ],
      properties: new Map([ [ 'color', 'red' ], [ 'size', 'L' ] ]),
    });
    for (let i = 0; i < 3; i++) await send(producer, 'fifo', { topic, body: Buffer.from(`fifo-a-${i}`), tag: 'F', messageGroup: 'group-a' });
    for (let i = 0; i < 2; i++) await send(producer, 'fifo', { topic, body: Buffer.from(`fifo-b-${i}`), messageGroup: 'group-b' });
    // Refused: a reserved property (the server: 40007), a bad tag (40004).
    await send(producer, 'reserved-property', { topic, body: Buffer.from('bad-0'), properties: new Map([ [ 'DELAY', '3' ] ]) });
    await send(producer, 'bad-tag', { topic, body: Buffer.from('bad-1'), tag: 'a|b' });
  } finally {
    await producer.shutdown();
  }
}

main().catch(err => {
  console.error(err);
  process.exit(1);
});
