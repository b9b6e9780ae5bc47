#!/usr/bin/python3
"""Cross-language client check for storaged: a Python gRPC client puts
messages and checks every response field, pulls a message back with
PullMessages and GetMessage, and checks two rich errors.

    /usr/bin/python3 scripts/python_client_test.py HOST:PORT

Uses Debian's system python3 with the apt packages python3-grpcio,
python3-protobuf, protobuf-compiler, protobuf-compiler-grpc and
libprotobuf-dev (the pyenv python3 first on some PATHs has no grpc). Stubs are
generated into a temporary directory with protoc and grpc_python_plugin from
proto/storaged/v1/message_store.proto; nothing is written to the repository.

Debian has no googleapis-common-protos, so a wire-compatible subset of
google/rpc/status.proto and error_details.proto is written to the temporary
directory to decode the error details (grpc-status-details-bin).

Exit status 0 when every check passes, 1 on a failed check, 2 when a
prerequisite is missing. Run by cmd/storaged's TestPythonClient against the
real binary, and by scripts/python_client_test.sh.
"""

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Wire-compatible subset of google.rpc.Status, ErrorInfo and BadRequest
# (field numbers as in googleapis google/rpc/{status,error_details}.proto).
RPC_PROTO = """
syntax = "proto3";
package google.rpc;
import "google/protobuf/any.proto";
message Status {
  int32 code = 1;
  string message = 2;
  repeated google.protobuf.Any details = 3;
}
message ErrorInfo {
  string reason = 1;
  string domain = 2;
  map<string, string> metadata = 3;
}
message BadRequest {
  message FieldViolation {
    string field = 1;
    string description = 2;
    string reason = 3;
  }
  repeated FieldViolation field_violations = 1;
}
"""

failures = []


def check(cond, what):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        failures.append(what)


def generate(out):
    """Generates the storaged stubs into out, the google.rpc subset into out/rpcgen."""
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        sys.exit("missing protoc or grpc_python_plugin: apt-get install protobuf-compiler protobuf-compiler-grpc libprotobuf-dev")
    rpc_dir = os.path.join(out, "rpcsrc", "google", "rpc")
    os.makedirs(rpc_dir)
    with open(os.path.join(rpc_dir, "status_subset.proto"), "w") as f:
        f.write(RPC_PROTO)
    proto_root = os.path.join(REPO, "proto")
    subprocess.run([protoc, "-I", proto_root, "--python_out", out, "--grpc_python_out", out,
                    "--plugin=protoc-gen-grpc_python=" + plugin, "storaged/v1/message_store.proto"], check=True)
    # Outside sys.path: a generated google/ directory must not meet the
    # installed google.protobuf package.
    os.makedirs(os.path.join(out, "rpcgen"))
    subprocess.run([protoc, "-I", os.path.join(out, "rpcsrc"), "--python_out", os.path.join(out, "rpcgen"),
                    "google/rpc/status_subset.proto"], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("address", help="storaged gRPC address, host:port (plaintext)")
    args = ap.parse_args()

    try:
        import grpc
    except ImportError:
        print("python3 lacks grpc: apt-get install python3-grpcio python3-protobuf", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="storaged-py-") as out:
        generate(out)
        sys.path.insert(0, out)
        # Loaded by path under its own name (see generate).
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "status_subset_pb2", os.path.join(out, "rpcgen", "google", "rpc", "status_subset_pb2.py"))
        rpc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rpc)
        from storaged.v1 import message_store_pb2 as pb
        from storaged.v1 import message_store_pb2_grpc as pb_grpc

        with grpc.insecure_channel(args.address) as channel:
            stub = pb_grpc.MessageStoreServiceStub(channel)
            run_checks(grpc, pb, rpc, stub)

    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("python client: all checks passed")
    return 0


def msg_id_offset(msg_id):
    # IPv4 offset msgId: 4 bytes IP, 4 bytes port, 8 bytes offset, upper-case hex.
    return int(msg_id[16:], 16)


def pull_back(grpc, pb, stub, topic, queue_id, queue_offset, msg_id):
    """Pulls until the message put at queue_offset comes back, as a consumer would.

    A message is readable once the store has dispatched it, shortly after its put
    returns; a pull past the dispatched end is OUT_OF_RANGE. So start at the queue's
    current max when the put's offset is not there yet, and let the long poll wait.
    """
    try:
        info = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic=topic, queue_id=queue_id), timeout=10)
        offset = min(queue_offset, info.max_offset)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            raise
        offset = 0  # the queue appears with its first message; the pull waits for it
    for _ in range(20):
        req = pb.PullMessagesRequest(topic=topic, queue_id=queue_id, queue_offset=offset, max_messages=64)
        req.wait.FromSeconds(5)
        resp = stub.PullMessages(req, timeout=10)
        for msg in resp.messages:
            if msg.msg_id == msg_id:
                return msg
        offset = resp.next_offset
    return None


def error_info(rpc, e):
    raw = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin")
    if raw is None:
        return None
    for d in rpc.Status.FromString(raw).details:
        if d.type_url.endswith("/google.rpc.ErrorInfo"):
            info = rpc.ErrorInfo()
            info.ParseFromString(d.value)
            return info
    return None


def run_checks(grpc, pb, rpc, stub):
    now = datetime.datetime.now(datetime.timezone.utc)
    m = pb.Message(topic="PyTopic", queue_id=1, body=b"hello from python", tags="py", keys="k1 k2",
                   properties={"lang": "python"})
    m.born_timestamp.FromDatetime(now)
    r1 = stub.PutMessage(pb.PutMessageRequest(message=m), timeout=10)
    check(r1.status == pb.PUT_MESSAGE_STATUS_PUT_OK, "PutMessage status is PUT_MESSAGE_STATUS_PUT_OK (%s)"
          % pb.PutMessageStatus.Name(r1.status))
    res = r1.result
    check(len(res.msg_id) == 32 and all(c in "0123456789ABCDEF" for c in res.msg_id),
          "msg_id is 32 upper-case hex characters (%r)" % res.msg_id)
    check(msg_id_offset(res.msg_id) == res.wrote_offset, "msg_id encodes wrote_offset %d" % res.wrote_offset)
    check(res.wrote_offset >= 0 and res.wrote_bytes > len(m.body), "wrote_offset %d, wrote_bytes %d"
          % (res.wrote_offset, res.wrote_bytes))
    check(res.queue_id == 1 and res.queue_offset >= 0, "queue_id 1, queue_offset %d" % res.queue_offset)
    check(res.message_count == 1 and len(res.msg_ids) == 0, "message_count 1, no msg_ids for a single put")
    stored = res.store_timestamp.ToDatetime(tzinfo=datetime.timezone.utc)
    check(abs((stored - now).total_seconds()) < 60, "store_timestamp %s is close to now" % stored.isoformat())

    pulled = pull_back(grpc, pb, stub, "PyTopic", 1, res.queue_offset, res.msg_id)
    check(pulled is not None, "PullMessages returns the message put (queue offset %d)" % res.queue_offset)
    if pulled is not None:
        check(pulled.body == m.body, "pulled body is the body put (%r)" % pulled.body)
        check(pulled.topic == "PyTopic" and pulled.queue_id == 1 and pulled.queue_offset == res.queue_offset,
              "pulled topic, queue id and queue offset")
        check(pulled.commit_log_offset == res.wrote_offset and pulled.store_size == res.wrote_bytes,
              "pulled commit_log_offset and store_size match the append result")
        check(pulled.tags == "py" and pulled.keys == "k1 k2" and pulled.properties.get("lang") == "python"
              and "__CRC32#" not in pulled.properties,
              "pulled tags, keys and properties (%s)" % dict(pulled.properties))
        born = pulled.born_timestamp.ToDatetime(tzinfo=datetime.timezone.utc)
        check(abs((born - now).total_seconds()) < 0.002, "pulled born_timestamp is the one sent (%s)" % born.isoformat())
        check(pulled.born_host.startswith("127.0.0.1:") and ":" in pulled.store_host,
              "pulled born_host %r and store_host %r are ip:port" % (pulled.born_host, pulled.store_host))

        got = stub.GetMessage(pb.GetMessageRequest(msg_id=res.msg_id, include_raw=True), timeout=10).message
        check(got.body == m.body and got.msg_id == res.msg_id, "GetMessage by msg_id returns the message")
        check(len(got.raw) == got.store_size and got.raw[4:8] == bytes.fromhex("DAA320A7"),
              "GetMessage include_raw: store_size bytes with the RocketMQ magic code")

        info = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="PyTopic", queue_id=1), timeout=10)
        try:
            stub.PullMessages(pb.PullMessagesRequest(topic="PyTopic", queue_id=1, queue_offset=info.max_offset + 1000),
                              timeout=10)
            check(False, "a pull past the end is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.OUT_OF_RANGE, "pull past the end: OUT_OF_RANGE (%s)" % e.code())
            ei = error_info(rpc, e)
            check(ei is not None and ei.reason == "OFFSET_OUT_OF_RANGE" and "min_offset" in ei.metadata
                  and "max_offset" in ei.metadata,
                  "OUT_OF_RANGE carries ErrorInfo OFFSET_OUT_OF_RANGE with min_offset and max_offset (%s)"
                  % (dict(ei.metadata) if ei is not None else None))

    r2 = stub.PutMessage(pb.PutMessageRequest(message=pb.Message(topic="PyTopic", queue_id=1, body=b"second")),
                         timeout=10)
    check(r2.result.queue_offset == res.queue_offset + 1, "queue offsets are consecutive (%d, %d)"
          % (res.queue_offset, r2.result.queue_offset))
    check(r2.result.wrote_offset >= res.wrote_offset + res.wrote_bytes, "the second record follows the first")

    batch = pb.PutMessagesRequest(topic="PyBatch", queue_id=0, messages=[
        pb.BatchEntry(body=b"a", tags="x"), pb.BatchEntry(body=b"bb"), pb.BatchEntry(body=b"ccc")])
    rb = stub.PutMessages(batch, timeout=10)
    check(rb.status == pb.PUT_MESSAGE_STATUS_PUT_OK, "PutMessages status PUT_OK")
    check(rb.result.message_count == 3 and len(rb.result.msg_ids) == 3 and rb.result.msg_ids[0] == rb.result.msg_id,
          "batch: message_count 3, three msg_ids, the first equals msg_id")
    offsets = [msg_id_offset(i) for i in rb.result.msg_ids]
    check(offsets == sorted(offsets) and len(set(offsets)) == 3 and offsets[0] == rb.result.wrote_offset,
          "batch msg_ids are increasing offsets from wrote_offset (%s)" % offsets)

    try:
        stub.PutMessage(pb.PutMessageRequest(message=pb.Message(topic="../etc", body=b"x")), timeout=10)
        check(False, "an invalid topic is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "invalid topic: INVALID_ARGUMENT (%s)" % e.code())
        raw = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin")
        check(raw is not None, "error carries grpc-status-details-bin")
        if raw is not None:
            st = rpc.Status.FromString(raw)
            info, bad = rpc.ErrorInfo(), rpc.BadRequest()
            for d in st.details:
                if d.type_url.endswith("/google.rpc.ErrorInfo"):
                    info.ParseFromString(d.value)
                elif d.type_url.endswith("/google.rpc.BadRequest"):
                    bad.ParseFromString(d.value)
            check(info.reason == "MESSAGE_ILLEGAL" and info.domain == "storaged",
                  "ErrorInfo reason MESSAGE_ILLEGAL, domain storaged (%r, %r)" % (info.reason, info.domain))
            check(len(bad.field_violations) == 1 and bad.field_violations[0].field == "message.topic",
                  "BadRequest names message.topic (%s)" % [v.field for v in bad.field_violations])


if __name__ == "__main__":
    sys.exit(main())
