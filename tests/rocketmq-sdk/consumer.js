'use strict';
// Apache's RocketMQ 5 Node.js SDK's SimpleConsumer against storaged, which
// does not serve POP consumption yet: the consumer starts (storaged answers
// its route and settings) and its first receive fails with the SDK's
// UnsupportedException, saying why. rocketmq_sdk_test.go runs it.
//
//   node consumer.js --endpoints 127.0.0.1:PORT --topic T --group G
//
// Prints {"kind":"started"} once started, then {"kind":"receive", "error",
// "code", "message"} (or "count" if messages arrived).

const { format } = require('node:util');
const { SimpleConsumer } = require('rocketmq-client-nodejs');

function arg(name) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : undefined;
}

const line = (level, a) => console.error(level, format(...a).split('\n')[0]);
const logger = { info() {}, debug() {}, warn(...a) { line('warn', a); }, error(...a) { line('error', a); }, close() {} };

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

async function main() {
  const endpoints = arg('endpoints');
  const topic = arg('topic');
  const consumerGroup = arg('group');
  if (!endpoints || !topic || !consumerGroup) throw new Error('usage: node consumer.js --endpoints host:port --topic T --group G');
  const consumer = new SimpleConsumer({
    endpoints, namespace: '', consumerGroup, logger, subscriptions: new Map([ [ topic, '*' ] ]), awaitDuration: 1000,
  });
  await consumer.startup();
  out({ kind: 'started' });
  try {
    const messages = await consumer.receive(1, 10000);
    out({ kind: 'receive', count: messages.length });
  } catch (err) {
    out({ kind: 'receive', error: err.name || String(err), code: typeof err.code === 'number' ? err.code : 0, message: String(err.message) });
  } finally {
    await consumer.shutdown();
  }
}

main().catch(err => {
  console.error(err);
  process.exit(1);
});
