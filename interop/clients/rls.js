// ShouldRateLimit through Node's @grpc/grpc-js.
//
// Run by the interop tests as `node rls.js plan.json`, with the same plans as
// rls.py: a list of steps, each printing one JSON line. The protobuf messages
// are encoded and decoded by hand below (makeUnaryRequest with Buffer
// serializers), so grpc-js and Node's http2 are the only stack in between.
'use strict';

const fs = require('fs');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');

const METHOD = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';

// --- protobuf, by hand ------------------------------------------------------

function varint(n) {
  const out = [];
  n = BigInt(n);
  for (;;) {
    const b = Number(n & 0x7fn);
    n >>= 7n;
    if (n) {
      out.push(b | 0x80);
    } else {
      out.push(b);
      return Buffer.from(out);
    }
  }
}

function field(num, wire, payload) {
  if (wire === 0) return Buffer.concat([varint(num << 3), varint(payload)]);
  return Buffer.concat([varint((num << 3) | 2), varint(payload.length), payload]);
}

function encodeRequest(r) {
  const parts = [];
  if (r.domain) parts.push(field(1, 2, Buffer.from(r.domain)));
  for (const d of r.descriptors || []) {
    const body = [];
    for (const [k, v] of d.entries || []) {
      const e = [];
      if (k) e.push(field(1, 2, Buffer.from(k)));
      if (v) e.push(field(2, 2, Buffer.from(v)));
      body.push(field(1, 2, Buffer.concat(e)));
    }
    if (d.limit) {
      const lb = [];
      if (d.limit.requests_per_unit) lb.push(field(1, 0, d.limit.requests_per_unit));
      if (d.limit.unit) lb.push(field(2, 0, d.limit.unit));
      body.push(field(2, 2, Buffer.concat(lb)));
    }
    if ('hits_addend' in d) {
      // a UInt64Value: set, even when 0
      body.push(field(3, 2, d.hits_addend ? field(1, 0, d.hits_addend) : Buffer.alloc(0)));
    }
    parts.push(field(2, 2, Buffer.concat(body)));
  }
  if (r.hits_addend) parts.push(field(3, 0, r.hits_addend));
  return Buffer.concat(parts);
}

function readVarint(buf, i) {
  let n = 0n;
  let shift = 0n;
  for (;;) {
    const b = buf[i++];
    n |= BigInt(b & 0x7f) << shift;
    shift += 7n;
    if (!(b & 0x80)) return [Number(n), i];
  }
}

function* fields(buf) {
  let i = 0;
  while (i < buf.length) {
    let key;
    [key, i] = readVarint(buf, i);
    const num = Math.floor(key / 8);
    const wire = key & 7;
    let val;
    if (wire === 0) {
      [val, i] = readVarint(buf, i);
    } else if (wire === 2) {
      let n;
      [n, i] = readVarint(buf, i);
      val = buf.subarray(i, i + n);
      i += n;
    } else if (wire === 1) {
      val = buf.subarray(i, i + 8);
      i += 8;
    } else if (wire === 5) {
      val = buf.subarray(i, i + 4);
      i += 4;
    } else {
      throw new Error('wire type ' + wire);
    }
    yield [num, val];
  }
}

function decodeResponse(buf) {
  const resp = { overall: 0, statuses: [] };
  for (const [num, val] of fields(buf)) {
    if (num === 1) resp.overall = val;
    if (num !== 2) continue;
    const st = { code: 0, remaining: 0, limit: null };
    for (const [n2, v2] of fields(val)) {
      if (n2 === 1) st.code = v2;
      if (n2 === 3) st.remaining = v2;
      if (n2 !== 2) continue;
      st.limit = { requests_per_unit: 0, unit: 0, name: '' };
      for (const [n3, v3] of fields(v2)) {
        if (n3 === 1) st.limit.requests_per_unit = v3;
        if (n3 === 2) st.limit.unit = v3;
        if (n3 === 3) st.limit.name = v3.toString();
      }
    }
    resp.statuses.push(st);
  }
  return resp;
}

// --- calls ------------------------------------------------------------------

function call(client, c) {
  const md = new grpc.Metadata();
  for (const [k, v] of c.metadata || []) md.add(k, v);
  const deadline = new Date(Date.now() + ('timeout_ms' in c ? c.timeout_ms : 60000));
  let handle;
  const done = new Promise((resolve) => {
    handle = client.makeUnaryRequest(METHOD, (b) => b, (b) => b, encodeRequest(c.req), md, { deadline },
      (err, resp) => {
        if (err) resolve({ code: err.code, details: err.details || '' });
        else resolve({ code: 0, resp: decodeResponse(resp) });
      });
  });
  if ('cancel_after_ms' in c) setTimeout(() => handle.cancel(), c.cancel_after_ms);
  return done;
}

async function stepCalls(client, s) {
  const calls = [];
  for (const c of s.calls) for (let i = 0; i < (c.repeat || 1); i++) calls.push(c);
  if (s.concurrent) return Promise.all(calls.map((c) => call(client, c)));
  const out = [];
  for (const c of calls) out.push(await call(client, c));
  return out;
}

// stepLoad: s.workers calls at a time until a line arrives on stdin, then
// until s.after calls started after it have succeeded; the counts of each code
// before and after the line. A failed call waits 50 ms before the next.
async function stepLoad(client, s) {
  const counts = { before: {}, after: {} };
  let line = false;
  let afterOK = 0;
  let loading = false;
  const rl = readline.createInterface({ input: process.stdin });
  rl.once('line', () => {
    line = true;
    rl.close();
  });
  const worker = async () => {
    while (afterOK < s.after) {
      const phase = line ? 'after' : 'before';
      const o = await call(client, { req: s.req, timeout_ms: s.timeout_ms || 10000 });
      counts[phase][o.code] = (counts[phase][o.code] || 0) + 1;
      if (o.code === 0 && !loading) {
        loading = true;
        console.log(JSON.stringify({ event: 'loading' }));
      }
      if (phase === 'after' && o.code === 0) afterOK++;
      if (o.code !== 0) await new Promise((r) => setTimeout(r, 50));
    }
  };
  await Promise.all(Array.from({ length: s.workers }, worker));
  return counts;
}

async function main() {
  const plan = JSON.parse(fs.readFileSync(process.argv[2]));
  const creds = plan.ca
    ? grpc.credentials.createSsl(fs.readFileSync(plan.ca))
    : grpc.credentials.createInsecure();
  const opts = Object.fromEntries(plan.options || []);
  const client = new grpc.Client(plan.target, creds, opts);
  for (let i = 0; i < plan.steps.length; i++) {
    const s = plan.steps[i];
    let out = null;
    if (s.op === 'calls') out = await stepCalls(client, s);
    else if (s.op === 'sleep') await new Promise((r) => setTimeout(r, s.ms));
    else if (s.op === 'load') out = await stepLoad(client, s);
    else throw new Error('unknown op ' + s.op);
    console.log(JSON.stringify({ step: i, out }));
  }
  client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
