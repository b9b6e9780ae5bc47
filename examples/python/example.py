#!/usr/bin/python3
"""A storaged client in Python (grpcio): it produces messages (PutMessage,
PutMessages, PutMessageStream), reads one back by msgId, consumes a queue by
following next_offset, recovers from an out-of-range offset with the bounds
its ErrorInfo carries, waits for a new message with a long poll, and reads
the ErrorInfo and BadRequest of a refused put.

    /usr/bin/python3 examples/python/example.py --addr 127.0.0.1:9090 --topic ExamplePython

It prints one JSON object per step on stdout (the format is described in
examples/README.md) so that examples/examples_test.go can check what it says
against the store; a real client would act on the values instead. The same
scenario is written in Go (examples/go) and Node (examples/node).

Uses Debian's python3 and packages only (apt-get install python3-grpcio
python3-protobuf protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
golang-github-gogo-googleapis-dev). The stubs are generated at start into a
temporary directory with protoc and grpc_python_plugin, from the repository's
proto/storaged/v1/message_store.proto and from googleapis' google/rpc
status.proto and error_details.proto as Debian ships them (in
golang-github-gogo-googleapis-dev; Debian has no googleapis-common-protos for
Python). Nothing is written to the repository. With PyPI, grpcio-tools,
grpcio-status and googleapis-common-protos do the same.

Exit status 0 when the scenario ran, 1 when a call failed unexpectedly, 2 when
a prerequisite is missing.
"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEBIAN_GOOGLEAPIS = "/usr/share/gocode/src/github.com/gogo/googleapis"
PREREQUISITES = ("apt-get install python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc "
                 "libprotobuf-dev golang-github-gogo-googleapis-dev")

# The one queue the example uses, so that every message it stores is in one
# consume queue and a pull sees them all in order.
QUEUE_ID = 0


class Missing(Exception):
    """A prerequisite is not installed."""


def generate(out, googleapis):
    """Generates the storaged stubs and google.rpc's status and error details into out."""
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        raise Missing("protoc or grpc_python_plugin")
    rpc_protos = ["google/rpc/status.proto", "google/rpc/error_details.proto"]
    for p in rpc_protos:
        if not os.path.isfile(os.path.join(googleapis, p)):
            raise Missing(os.path.join(googleapis, p))
    subprocess.run([protoc, "-I", os.path.join(REPO, "proto"), "--python_out", out, "--grpc_python_out", out,
                    "--plugin=protoc-gen-grpc_python=" + plugin, "storaged/v1/message_store.proto"], check=True)
    subprocess.run([protoc, "-I", googleapis, "--python_out", out] + rpc_protos, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=os.environ.get("STORAGED_ADDR", "127.0.0.1:9090"),
                    help="storaged gRPC address, host:port (plaintext); env STORAGED_ADDR")
    ap.add_argument("--topic", default=os.environ.get("STORAGED_TOPIC", "ExamplePython"),
                    help="topic to produce to and consume from; env STORAGED_TOPIC")
    ap.add_argument("--googleapis", default=os.environ.get("GOOGLEAPIS_PROTO_DIR", DEBIAN_GOOGLEAPIS),
                    help="directory holding google/rpc/status.proto and error_details.proto; env GOOGLEAPIS_PROTO_DIR")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="storaged-py-") as out:
        try:
            import grpc
            generate(out, args.googleapis)
        except (ImportError, Missing) as e:
            print("example: missing %s: %s" % (e, PREREQUISITES), file=sys.stderr)
            return 2
        # google is a namespace package: the generated google/rpc joins the
        # installed google/protobuf.
        sys.path.insert(0, out)
        importlib.invalidate_caches()
        from google.rpc import error_details_pb2, status_pb2
        from storaged.v1 import message_store_pb2 as pb
        from storaged.v1 import message_store_pb2_grpc as pb_grpc

        with grpc.insecure_channel(args.addr) as channel:
            Example(grpc, pb, pb_grpc.MessageStoreServiceStub(channel), status_pb2, error_details_pb2,
                    args.topic).run()
    return 0


def out(event):
    print(json.dumps(event), flush=True)


class Example:
    def __init__(self, grpc, pb, stub, status_pb2, error_details_pb2, topic):
        self.grpc, self.pb, self.stub, self.topic = grpc, pb, stub, topic
        self.status_pb2, self.error_details_pb2 = status_pb2, error_details_pb2
        # The whole run is bounded: every call below gets what is left of it.
        self.deadline = time.monotonic() + 60

    def left(self):
        return max(0.0, self.deadline - time.monotonic())

    def run(self):
        grpc, pb, stub, topic = self.grpc, self.pb, self.stub, self.topic
        stored = 0

        # 1. Produce: one message per call. PUT_OK means stored (and, with
        # the default wait_store_ok, readable at once).
        first = None
        for i in range(2):
            m = self.new_message("hello %d from python" % i)
            resp = stub.PutMessage(pb.PutMessageRequest(message=m), timeout=self.left())
            if resp.status != pb.PUT_MESSAGE_STATUS_PUT_OK:
                raise RuntimeError("PutMessage: status %s" % pb.PutMessageStatus.Name(resp.status))
            first = first or resp.result
            out(self.put_event("PutMessage", 0, resp.status, m, resp.result))
            stored += 1

        # 2. A batch: consecutive queue offsets, all or nothing.
        bodies = ["batch a", "batch b", "batch c"]
        bresp = stub.PutMessages(pb.PutMessagesRequest(
            topic=topic, queue_id=QUEUE_ID, messages=[pb.BatchEntry(body=b.encode(), tags="batch") for b in bodies]),
            timeout=self.left())
        r = bresp.result
        out({"event": "batch", "status": pb.PutMessageStatus.Name(bresp.status), "topic": topic,
             "queue_id": r.queue_id, "queue_offset": r.queue_offset, "msg_id": r.msg_id,
             "wrote_offset": r.wrote_offset, "wrote_bytes": r.wrote_bytes,
             "store_ms": r.store_timestamp.ToMilliseconds(), "message_count": r.message_count,
             "msg_ids": list(r.msg_ids), "bodies": bodies})
        stored += len(bodies)

        # 3. A stream: many messages in flight on one call, one answer each,
        # matched by request_id, in completion order. A bad message is
        # answered with a code and reason and does not end the stream.
        stored += self.produce_stream()

        # 4. Read one message back by the msgId its put returned.
        got = stub.GetMessage(pb.GetMessageRequest(msg_id=first.msg_id, include_raw=True), timeout=self.left())
        out(message_event("GetMessage", got.message))

        # 5. Consume the queue from its first readable offset, following
        # next_offset, until every message stored above has come back. Small
        # pulls, so that it takes several; the wait lets a pull at the end of
        # the queue wait for the next message instead of returning empty.
        info = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic=topic, queue_id=QUEUE_ID), timeout=self.left())
        offset, received = info.min_offset, 0
        while received < stored:
            resp = self.pull("PullMessages", offset, 4, 1)
            received += len(resp.messages)
            offset = resp.next_offset

        # 6. A consumer whose saved offset is past the end (say, a store that
        # was replaced) is told OUT_OF_RANGE; the ErrorInfo carries the
        # readable bounds, so it goes on from max_offset.
        try:
            stub.PullMessages(pb.PullMessagesRequest(topic=topic, queue_id=QUEUE_ID, queue_offset=1_000_000),
                              timeout=self.left())
            raise RuntimeError("PullMessages past the end succeeded")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.OUT_OF_RANGE:
                raise
            ev = self.error_event("PullMessages", e)
            out(ev)
            resume = int(ev.get("metadata", {}).get("max_offset", "-1"))
            if resume < 0:
                raise RuntimeError("OUT_OF_RANGE without max_offset: %s" % e.details())

        # 7. Long poll: a pull at the end of the queue waits (up to its wait)
        # and returns as soon as a message arrives. The late message is put
        # concurrently; whether it reaches the server before or after the
        # poll does, the poll returns it.
        late = self.new_message("late message from python")
        put = stub.PutMessage.future(pb.PutMessageRequest(message=late), timeout=self.left())
        offset = resume
        while True:
            resp = self.pull("long poll", offset, 32, 5)
            if resp.messages:
                break
            offset = resp.next_offset  # the wait ran out first: poll again
        lresp = put.result()
        out(self.put_event("PutMessage", 0, lresp.status, late, lresp.result))
        stored += 1

        # 8. A refused put: INVALID_ARGUMENT, with ErrorInfo (reason
        # MESSAGE_ILLEGAL, the RocketMQ status name) and a BadRequest naming
        # the field.
        try:
            stub.PutMessage(pb.PutMessageRequest(message=pb.Message(topic="../etc", body=b"x")), timeout=self.left())
            raise RuntimeError("PutMessage with a bad topic succeeded")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            out(self.error_event("PutMessage", e))

        out({"event": "done", "stored": stored})

    def new_message(self, body):
        """A message with every optional field a producer usually sets. The
        born time is in milliseconds, the precision the store keeps."""
        m = self.pb.Message(topic=self.topic, queue_id=QUEUE_ID, body=body.encode(), tags="example", keys="k1 k2",
                            properties={"lang": "python"})
        m.born_timestamp.FromMilliseconds(int(time.time() * 1000))
        return m

    def produce_stream(self):
        """Sends four good messages and one bad one on a PutMessageStream and
        prints each answer; returns how many were stored. grpcio sends from
        the request iterator while this thread reads the answers (the server
        holds at most 256 unanswered ones)."""
        pb = self.pb
        sent = {}
        for i in range(5):
            m = self.new_message("stream %d from python" % i)
            if i == 3:
                m.topic = ""  # refused: MESSAGE_ILLEGAL
            sent[i + 1] = m
        requests = (pb.PutMessageStreamRequest(request_id=rid, message=m) for rid, m in sent.items())
        stored = 0
        # A failure of the stream itself raises grpc.RpcError: the messages
        # without an answer may or may not have been stored.
        for resp in self.stub.PutMessageStream(requests, timeout=self.left()):
            if resp.code != 0:
                out({"event": "stream_error", "request_id": resp.request_id, "code": resp.code,
                     "reason": resp.reason, "message": resp.error_message})
                continue
            out(self.put_event("PutMessageStream", resp.request_id, resp.status, sent[resp.request_id], resp.result))
            stored += 1
        return stored

    def pull(self, via, offset, max_messages, wait_seconds):
        """Runs one PullMessages and prints it and the messages it returned."""
        req = self.pb.PullMessagesRequest(topic=self.topic, queue_id=QUEUE_ID, queue_offset=offset,
                                          max_messages=max_messages)
        req.wait.FromSeconds(wait_seconds)
        resp = self.stub.PullMessages(req, timeout=self.left())
        out({"event": "pull", "via": via, "queue_offset": offset, "count": len(resp.messages),
             "next_offset": resp.next_offset, "min_offset": resp.min_offset, "max_offset": resp.max_offset})
        for m in resp.messages:
            out(message_event(via, m))
        return resp

    def put_event(self, via, request_id, status, m, r):
        ev = {"event": "put", "via": via, "status": self.pb.PutMessageStatus.Name(status), "topic": m.topic,
              "queue_id": r.queue_id, "queue_offset": r.queue_offset, "msg_id": r.msg_id,
              "wrote_offset": r.wrote_offset, "wrote_bytes": r.wrote_bytes,
              "store_ms": r.store_timestamp.ToMilliseconds(), "body": m.body.decode(), "tags": m.tags,
              "keys": m.keys, "properties": dict(m.properties), "born_ms": m.born_timestamp.ToMilliseconds()}
        if request_id:
            ev["request_id"] = request_id
        return ev

    def error_event(self, call, e):
        """Decodes the rich error model: the gRPC code, and the
        google.rpc.Status details storaged attaches (grpc-status-details-bin).
        Every storaged error carries an ErrorInfo (domain "storaged"; reason
        the RocketMQ status name or a read reason); bad requests add a
        BadRequest, retryable ones a RetryInfo."""
        ev = {"event": "error", "call": call, "code": e.code().value[0], "message": e.details()}
        raw = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin")
        if raw is None:
            return ev
        ed = self.error_details_pb2
        for detail in self.status_pb2.Status.FromString(raw).details:
            if detail.Is(ed.ErrorInfo.DESCRIPTOR):
                info = ed.ErrorInfo()
                detail.Unpack(info)
                ev.update(reason=info.reason, domain=info.domain, metadata=dict(info.metadata))
            elif detail.Is(ed.BadRequest.DESCRIPTOR):
                bad = ed.BadRequest()
                detail.Unpack(bad)
                ev["field_violations"] = [v.field for v in bad.field_violations]
            elif detail.Is(ed.RetryInfo.DESCRIPTOR):
                retry = ed.RetryInfo()
                detail.Unpack(retry)
                ev["retry_delay_ms"] = retry.retry_delay.ToMilliseconds()
        return ev


def message_event(via, m):
    ev = {"event": "message", "via": via, "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
          "commit_log_offset": m.commit_log_offset, "msg_id": m.msg_id, "body": m.body.decode(), "tags": m.tags,
          "keys": m.keys, "properties": dict(m.properties), "born_ms": m.born_timestamp.ToMilliseconds(),
          "store_ms": m.store_timestamp.ToMilliseconds(), "born_host": m.born_host, "store_host": m.store_host,
          "store_size": m.store_size}
    if m.raw:
        ev["raw_hex"] = m.raw.hex()
    return ev


if __name__ == "__main__":
    sys.exit(main())
