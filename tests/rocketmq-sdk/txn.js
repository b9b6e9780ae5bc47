'use strict';
// Apache's RocketMQ 5 Node.js SDK (rocketmq-client-nodejs), unchanged, as a
// transactional producer against storaged: rocketmq_txn_test.go runs it.
//
//   node txn.js --endpoints 127.0.0.1:PORT --topic T --mode ends|orphan|hold
//
// ends:   commits "tx-commit" and rolls back "tx-rollback".
// orphan: sends "tx-orphan" and ends nothing; its transactionChecker prints
//         {"kind":"check", ...} and answers COMMIT. Runs until stdin closes.
// hold:   sends "tx-held", then waits for a line "commit" on stdin (the
//         test kills and restarts storaged meanwhile) and commits.
//
// Prints one JSON line per event: {"kind":"sent", "body", "messageId",
// "transactionId"}, {"kind":"committed"|"rolledback", "body"}, {"kind":
// "check", "body", "messageId"}, {"kind", "error", "code", "message"} for
// a call the SDK or the server refused, then {"kind":"done"}.

const { format } = require('node:util');
const readline = require('node:readline');
const { Producer } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const line = (level, a) => console.error(level, format(...a).split('\n')[0]);
const logger = { info() {}, debug() {}, warn(...a) { line('warn', a); }, error(...a) { line('error', a); }, close() {} };

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

function failed(kind, err) {
  out({ kind, error: err.name || String(err), code: typeof err.code === 'number' ? err.code : 0, message: String(err.message) });
}

async function main() {
  const endpoints = arg('endpoints');
  const topic = arg('topic');
  const mode = arg('mode', 'ends');
  if (!endpoints || !topic) throw new Error('usage: node txn.js --endpoints host:port --topic T --mode ends|orphan|hold');
  const checker = {
    async check(view) {
      out({ kind: 'check', body: view.body.toString(), messageId: view.messageId, topic: view.topic });
      return TransactionResolution.COMMIT;
    },
  };
  const producer = new Producer({ endpoints, namespace: '', topic, logger, requestTimeout: 10000, checker });
  await producer.startup();
  const lines = readline.createInterface({ input: process.stdin });
  const stdin = lines[Symbol.asyncIterator]();
  try {
    const send = async body => {
      const tx = producer.beginTransaction();
      const r = await producer.send({ topic, body: Buffer.from(body), tag: 'tx', keys: [ body ] }, tx);
      out({ kind: 'sent', body, messageId: r.messageId, transactionId: r.transactionId });
      return tx;
    };
    if (mode === 'ends') {
      const a = await send('tx-commit');
      await a.commit();
      out({ kind: 'committed', body: 'tx-commit' });
      const b = await send('tx-rollback');
      await b.rollback();
      out({ kind: 'rolledback', body: 'tx-rollback' });
    } else if (mode === 'orphan') {
      await send('tx-orphan');
      while (!(await stdin.next()).done) { /* until the test closes stdin */ }
    } else if (mode === 'hold') {
      const tx = await send('tx-held');
      for (;;) {
        const { value, done } = await stdin.next();
        if (done) throw new Error('stdin closed before "commit"');
        if (value.trim() === 'commit') break;
      }
      // storaged was restarted: the SDK's connection comes back on its own;
      // an end refused meanwhile (UNAVAILABLE) is sent again, as an
      // application would.
      for (let i = 0; ; i++) {
        try {
          await tx.commit();
          out({ kind: 'committed', body: 'tx-held', attempts: i + 1 });
          break;
        } catch (err) {
          if (i >= 20) throw err;
          await new Promise(resolve => setTimeout(resolve, 500));
        }
      }
    }
  } catch (err) {
    failed('error', err);
  } finally {
    lines.close();
    await producer.shutdown();
  }
  out({ kind: 'done' });
}

main().catch(err => {
  console.error(err);
  process.exit(1);
});
