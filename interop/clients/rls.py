#!/usr/bin/python3
"""ShouldRateLimit through gRPC C-core (Debian's python3-grpcio).

Run by the interop tests with /usr/bin/python3. The plan, a JSON file named by
the one argument, is a list of steps; each step prints one JSON line. The
protobuf messages are encoded and decoded by hand below, so C-core's HTTP/2
and gRPC stack is the only library between the test and the daemon.
"""
import json
import sys
import threading
import time

import grpc

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


# --- protobuf, by hand: RateLimitRequest out, RateLimitResponse in ---------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    if wire == 0:
        return varint(num << 3) + varint(payload)
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def encode_request(r):
    """r: {"domain", "hits_addend"?, "descriptors": [{"entries": [[k, v]],
    "limit"?: {"requests_per_unit", "unit"}, "hits_addend"?}]}"""
    out = b""
    if r.get("domain"):
        out += field(1, 2, r["domain"].encode())
    for d in r.get("descriptors") or []:
        body = b""
        for k, v in d.get("entries") or []:
            e = b""
            if k:
                e += field(1, 2, k.encode())
            if v:
                e += field(2, 2, v.encode())
            body += field(1, 2, e)
        if "limit" in d:
            lim = d["limit"]
            lb = b""
            if lim.get("requests_per_unit"):
                lb += field(1, 0, lim["requests_per_unit"])
            if lim.get("unit"):
                lb += field(2, 0, lim["unit"])
            body += field(2, 2, lb)
        if "hits_addend" in d:  # a UInt64Value: set, even when 0
            hv = field(1, 0, d["hits_addend"]) if d["hits_addend"] else b""
            body += field(3, 2, hv)
        out += field(2, 2, body)
    if r.get("hits_addend"):
        out += field(3, 0, r["hits_addend"])
    return out


def fields(buf):
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wire == 1:
            val, i = buf[i:i + 8], i + 8
        elif wire == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        yield num, val


def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def decode_response(buf):
    resp = {"overall": 0, "statuses": []}
    for num, val in fields(buf):
        if num == 1:
            resp["overall"] = val
        elif num == 2:
            st = {"code": 0, "remaining": 0, "limit": None}
            for n2, v2 in fields(val):
                if n2 == 1:
                    st["code"] = v2
                elif n2 == 2:
                    lim = {"requests_per_unit": 0, "unit": 0, "name": ""}
                    for n3, v3 in fields(v2):
                        if n3 == 1:
                            lim["requests_per_unit"] = v3
                        elif n3 == 2:
                            lim["unit"] = v3
                        elif n3 == 3:
                            lim["name"] = v3.decode()
                    st["limit"] = lim
                elif n2 == 3:
                    st["remaining"] = v2
            resp["statuses"].append(st)
    return resp


# --- calls ------------------------------------------------------------------

def outcome(fut):
    try:
        return {"code": 0, "resp": decode_response(fut.result())}
    except grpc.FutureCancelledError:
        return {"code": grpc.StatusCode.CANCELLED.value[0], "details": "cancelled by the client"}
    except grpc.RpcError as e:
        return {"code": e.code().value[0], "details": e.details() or ""}


def start(stub, c):
    timeout = c["timeout_ms"] / 1000.0 if "timeout_ms" in c else 60
    md = [tuple(kv) for kv in c.get("metadata", [])]
    return stub.future(encode_request(c["req"]), timeout=timeout, metadata=md or None)


def step_calls(stub, s):
    """Every call of the step: one after another, or all started at once."""
    calls = []
    for c in s["calls"]:
        calls.extend([c] * c.get("repeat", 1))
    if not s.get("concurrent"):
        return [outcome(start(stub, c)) for c in calls]
    futs = [start(stub, c) for c in calls]
    for c, f in zip(calls, futs):
        if "cancel_after_ms" in c:
            threading.Timer(c["cancel_after_ms"] / 1000.0, f.cancel).start()
    return [outcome(f) for f in futs]


def step_load(stub, s):
    """workers calls at a time until a line arrives on stdin, then until
    s["after"] calls started after it have succeeded; counts of each code
    before and after the line. A failed call waits 50 ms before the next."""
    lock = threading.Lock()
    state = {"line": False, "after_ok": 0, "stop": False, "loading": False}
    counts = {"before": {}, "after": {}}
    req = encode_request(s["req"])

    def worker():
        while True:
            with lock:
                if state["stop"]:
                    return
                phase = "after" if state["line"] else "before"
            o = outcome(stub.future(req, timeout=s.get("timeout_ms", 10000) / 1000.0))
            with lock:
                counts[phase][str(o["code"])] = counts[phase].get(str(o["code"]), 0) + 1
                if o["code"] == 0 and not state["loading"]:
                    state["loading"] = True
                    print(json.dumps({"event": "loading"}), flush=True)
                if phase == "after" and o["code"] == 0:
                    state["after_ok"] += 1
                    if state["after_ok"] >= s["after"]:
                        state["stop"] = True
            if o["code"] != 0:
                time.sleep(0.05)

    threads = [threading.Thread(target=worker) for _ in range(s["workers"])]
    for t in threads:
        t.start()
    sys.stdin.readline()
    with lock:
        state["line"] = True
    for t in threads:
        t.join()
    return counts


def keep_connected(channel, stop):
    while not stop.is_set():
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            pass
        stop.wait(0.2)


def main():
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    opts = [tuple(kv) for kv in plan.get("options", [])]
    if plan.get("ca"):
        with open(plan["ca"], "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        channel = grpc.secure_channel(plan["target"], creds, options=opts)
    else:
        channel = grpc.insecure_channel(plan["target"], options=opts)
    states = []
    stop, watcher = threading.Event(), None
    if plan.get("watch"):
        # Note each state C-core reports, and connect again whenever the
        # channel goes idle, as a client with steady traffic would.
        channel.subscribe(lambda st: states.append([round(time.monotonic(), 3), st.name]))
        watcher = threading.Thread(target=keep_connected, args=(channel, stop))
        watcher.start()
    stub = channel.unary_unary(METHOD)
    for i, s in enumerate(plan["steps"]):
        if s["op"] == "calls":
            out = step_calls(stub, s)
        elif s["op"] == "sleep":
            time.sleep(s["ms"] / 1000.0)
            out = None
        elif s["op"] == "load":
            out = step_load(stub, s)
        else:
            raise ValueError("unknown op " + s["op"])
        print(json.dumps({"step": i, "out": out}), flush=True)
    if plan.get("watch"):
        stop.set()
        watcher.join()
        print(json.dumps({"states": states}), flush=True)
    channel.close()


if __name__ == "__main__":
    main()
