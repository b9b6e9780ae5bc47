'use strict';
// Apache's RocketMQ 5 Node.js SDK's consumers, unchanged, against
// storaged's POP consumption. rocketmq_sdk_test.go runs it and checks what
// it prints (one JSON line per event) against what it sent and what the
// store holds.
//
//   node consumer.js --endpoints 127.0.0.1:PORT --topic T --group G --mode MODE [--count N]
//
// Modes:
//   simple   a SimpleConsumer receives the N messages sent (invisible 2 s):
//            it acks the first two it sees by body order (s0, s1), changes
//            the invisible duration of s2 to 3 s and acks it at its second
//            delivery, and never acks s3..s(N-1): it sees them again with
//            their attempt counts until the server dead-letters them (the
//            server runs with --consumer-max-attempts 3); then a second
//            SimpleConsumer (group G-dlq) reads %DLQ%G until it holds them.
//            Prints {"kind":"received","body","attempt","messageId"} for
//            every delivery, {"kind":"acked"|"changed","body"}, and
//            {"kind":"dlq","body","attempt","messageId"}.
//   push     a PushConsumer consumes the topic until it has consumed N
//            messages: {"kind":"consumed","body","attempt","messageId"}.
//   receive  a SimpleConsumer receives N messages (invisible 3 s), acks
//            the one with body k0 and not the others, and exits.
//   drain    a SimpleConsumer receives until one receive returns messages,
//            prints them, acks them and exits.
// Every mode ends with {"kind":"done"}; a mode that does not finish within
// 90 s prints {"kind":"timeout"} and exits with status 2.

const { format } = require('node:util');
const { SimpleConsumer, PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const line = (level, a) => console.error(level, format(...a).split('\n')[0]);
const logger = { info() {}, debug() {}, warn(...a) { line('warn', a); }, error(...a) { line('error', a); }, close() {} };

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

// at: when the consumer got it (Unix ms); deliverAt: the message's
// delivery timestamp (a timer message), 0 when it has none.
const view = (kind, m) => ({
  kind, body: m.body.toString(), attempt: m.deliveryAttempt, messageId: m.messageId,
  at: Date.now(), deliverAt: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : 0,
});

const deadline = Date.now() + 90000;
function checkTime() {
  if (Date.now() > deadline) {
    out({ kind: 'timeout' });
    process.exit(2);
  }
}

function simpleConsumer(endpoints, group, topic, awaitDuration) {
  return new SimpleConsumer({
    endpoints, namespace: '', consumerGroup: group, logger, subscriptions: new Map([ [ topic, '*' ] ]), awaitDuration,
    requestTimeout: 5000,
  });
}

async function simple(endpoints, topic, group, count) {
  const consumer = simpleConsumer(endpoints, group, topic, 2000);
  await consumer.startup();
  const dead = new Set(); // bodies never acked: they must reach the DLQ
  for (let i = 3; i < count; i++) dead.add(`s${i}`);
  let s2Seen = 0;
  const lastAttempt = new Map();
  try {
    // Until every never-acked message was delivered 3 times and s2 was
    // acked at its second delivery.
    let s2Acked = false;
    while (!s2Acked || [ ...dead ].some(b => (lastAttempt.get(b) || 0) < 3)) {
      checkTime();
      const msgs = await consumer.receive(32, 2000);
      for (const m of msgs) {
        const b = m.body.toString();
        out(view('received', m));
        lastAttempt.set(b, m.deliveryAttempt);
        if (b === 's0' || b === 's1') {
          await consumer.ack(m);
          out({ kind: 'acked', body: b });
        } else if (b === 's2') {
          s2Seen++;
          if (s2Seen === 1) {
            await consumer.changeInvisibleDuration(m, 3000);
            out({ kind: 'changed', body: b });
          } else {
            await consumer.ack(m);
            out({ kind: 'acked', body: b });
            s2Acked = true;
          }
        }
      }
    }
    // The never-acked ones reach the DLQ when a receive of the group finds
    // them due: keep receiving while a reader of %DLQ%G reads it.
    const dlq = simpleConsumer(endpoints, `${group}-dlq`, `%DLQ%${group}`, 1000);
    await dlq.startup();
    try {
      const inDLQ = new Set();
      while (inDLQ.size < dead.size) {
        checkTime();
        for (const m of await consumer.receive(32, 2000)) {
          out(view('received', m)); // a fourth delivery: the test fails on it
        }
        for (const m of await dlq.receive(32, 10000)) {
          out(view('dlq', m));
          inDLQ.add(m.body.toString());
          await dlq.ack(m);
        }
      }
    } finally {
      await dlq.shutdown();
    }
  } finally {
    await consumer.shutdown();
  }
}

async function push(endpoints, topic, group, count) {
  let consumed = 0;
  let finish;
  const all = new Promise(resolve => { finish = resolve; });
  const consumer = new PushConsumer({
    endpoints, namespace: '', consumerGroup: group, logger, subscriptions: new Map([ [ topic, '*' ] ]), requestTimeout: 5000,
    messageListener: {
      consume(m) {
        out(view('consumed', m));
        if (++consumed >= count) finish();
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  const timer = setInterval(checkTime, 1000);
  try {
    await all;
  } finally {
    clearInterval(timer);
    await consumer.shutdown();
  }
}

async function receive(endpoints, topic, group, count) {
  const consumer = simpleConsumer(endpoints, group, topic, 2000);
  await consumer.startup();
  try {
    let got = 0;
    while (got < count) {
      checkTime();
      for (const m of await consumer.receive(32, 3000)) {
        got++;
        out(view('received', m));
        if (m.body.toString() === 'k0') {
          await consumer.ack(m);
          out({ kind: 'acked', body: 'k0' });
        }
      }
    }
  } finally {
    await consumer.shutdown();
  }
}

async function drain(endpoints, topic, group) {
  const consumer = simpleConsumer(endpoints, group, topic, 2000);
  await consumer.startup();
  try {
    for (;;) {
      checkTime();
      const msgs = await consumer.receive(32, 30000);
      if (msgs.length === 0) continue;
      for (const m of msgs) {
        out(view('received', m));
        await consumer.ack(m);
        out({ kind: 'acked', body: m.body.toString() });
      }
      return;
    }
  } finally {
    await consumer.shutdown();
  }
}

async function main() {
  const endpoints = arg('endpoints');
  const topic = arg('topic');
  const group = arg('group');
  const mode = arg('mode');
  const count = Number(arg('count', '0'));
  if (!endpoints || !topic || !group || !mode) {
    throw new Error('usage: node consumer.js --endpoints host:port --topic T --group G --mode simple|push|receive|drain [--count N]');
  }
  switch (mode) {
    case 'simple': await simple(endpoints, topic, group, count); break;
    case 'push': await push(endpoints, topic, group, count); break;
    case 'receive': await receive(endpoints, topic, group, count); break;
    case 'drain': await drain(endpoints, topic, group); break;
    default: throw new Error(`unknown mode ${mode}`);
  }
  out({ kind: 'done' });
  process.exit(0); // the SDK may keep timers (telemetry) alive after shutdown
}

main().catch(err => {
  out({ kind: 'error', error: err.name || String(err), code: typeof err.code === 'number' ? err.code : 0, message: String(err.message) });
  console.error(err);
  process.exit(1);
});
