// tests/server_e2e.mjs — `mla serve` end to end through the official OpenAI JS client and raw HTTP.
//
//   node tests/server_e2e.mjs ids    token-id prompts on a model without a tokenizer (tests/data/v3_tiny)
//   node tests/server_e2e.mjs text   text prompts and chat; needs MLA_TEST_TOKENIZER (a folder with
//                                    tokenizer.json + chat template); exits 77 (skipped) without it
// Environment: MLA (the mla binary), MLA_ECHO_SERVER (tests/echo_server.cpp: the same HTTP server over
// a scripted engine that answers each chat with its last user message, for tool calls), MLA_MODEL
// (model folder), MLA_NPM_MODULES (node_modules with `openai`, from scripts/fetch_npm_test_deps.sh).
// Servers listen on 127.0.0.1, on free ports.
import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";

const mode = process.argv[2] || "ids";
const MLA = process.env.MLA || "build/bin/mla";
const ECHO = process.env.MLA_ECHO_SERVER || path.join(path.dirname(MLA), "echo_server");
const MODEL = process.env.MLA_MODEL || "tests/data/v3_tiny";
const TOKENIZER = process.env.MLA_TEST_TOKENIZER || "";
if (mode === "text" && !(TOKENIZER && existsSync(path.join(TOKENIZER, "tokenizer.json")))) {
  console.log(`SKIPPED: text and chat tests need MLA_TEST_TOKENIZER (a folder with tokenizer.json); got '${TOKENIZER}'`);
  process.exit(77);
}
const require = createRequire(path.join(process.env.MLA_NPM_MODULES || "node_modules", "x.js"));
const OpenAI = require("openai");

const KEY = "sk-test-key";
const tmp = mkdtempSync(path.join(tmpdir(), "mla-serve-"));
const servers = [];
let failures = 0, checks = 0;
const t0 = Date.now();

function check(cond, what, extra) {
  checks++;
  if (!cond) {
    failures++;
    console.log(`FAIL ${what}${extra !== undefined ? ": " + JSON.stringify(extra).slice(0, 400) : ""}`);
  }
}
let lapAt = Date.now();
function lap(what) {  // the time each part took, for keeping the test fast
  const now = Date.now();
  console.log(`  ${what}: ${((now - lapAt) / 1000).toFixed(2)} s`);
  lapAt = now;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function startServer(name, args, command) {
  const portFile = path.join(tmp, `${name}.port`);
  const proc = command ? spawn(command, [portFile], { stdio: ["ignore", "ignore", "pipe"] })
    : spawn(MLA, ["serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0", "--port-file", portFile,
                  "--served-model-name", "tiny", ...args], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((r) => proc.on("exit", (code, sig) => r({ code, sig })));
  const s = { name, proc, exited, get stderr() { return stderr; } };
  servers.push(s);
  for (let i = 0; i < 600 && !existsSync(portFile); i++) {
    if (proc.exitCode !== null) throw new Error(`mla serve (${name}) exited: ${stderr}`);
    await sleep(50);
  }
  s.port = Number(readFileSync(portFile, "utf8"));
  s.url = `http://127.0.0.1:${s.port}`;
  return s;
}

async function http(s, method, p, body, headers = {}) {
  const h = { Authorization: `Bearer ${KEY}`, ...headers };
  if (body !== undefined && typeof body !== "string") body = JSON.stringify(body);
  if (body !== undefined) h["Content-Type"] = "application/json";
  const res = await fetch(s.url + p, { method, headers: h, body });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: res.status, text, json, type: res.headers.get("content-type") };
}

async function metrics(s) {
  const text = (await http(s, "GET", "/metrics")).text;
  const get = (name) => {
    const m = text.match(new RegExp(`^${name.replace(/[:]/g, "\\$&")} ([0-9.eE+-]+)$`, "m"));
    return m ? Number(m[1]) : NaN;
  };
  return { text, get };
}

async function waitIdle(s, ms = 5000) {
  for (let i = 0; i < ms / 20; i++) {
    const m = await metrics(s);
    if (m.get("mla:num_requests_running") === 0 && m.get("mla:num_requests_waiting") === 0) return true;
    await sleep(20);
  }
  return false;
}

// POST /flush_cache; it answers once the flush is done, with the pages it released.
async function flush(s) {
  const r = await http(s, "POST", "/flush_cache");
  check(r.status === 200 && Number.isInteger(r.json?.pages_released) && r.json.pages_released >= 0,
        "flush_cache 200 with the pages released", { status: r.status, text: r.text.slice(0, 200) });
  return r.json?.pages_released;
}

function randomIds(n, rnd, vocab) { return Array.from({ length: n }, () => Math.floor(rnd() * vocab)); }
function rng(seed) {  // mulberry32
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// ---------------------------------------------------------------------------------------------
async function idsTests() {
  const s = await startServer("main", ["--api-key", KEY, "--max-running", "32"]);
  const client = new OpenAI({ apiKey: KEY, baseURL: s.url + "/v1", maxRetries: 0 });
  const rnd = rng(7);

  // Health, models, metrics.
  check((await http(s, "GET", "/health", undefined, { Authorization: "" })).status === 200, "health 200 without a key");
  const models = await client.models.list();
  const model = models.data[0];
  check(model.id === "tiny" && model.object === "model", "/v1/models lists the served name", model);
  const vocab = 512, ctx = model.max_model_len;
  check(Number.isInteger(ctx) && ctx > 64, "max_model_len", model);
  const m0 = await metrics(s);
  for (const name of ["mla:num_requests_running", "mla:num_requests_waiting", "mla:kv_cache_usage_perc",
                      "mla:prefix_cache_queries_total", "mla:prefix_cache_hits_total", "mla:prompt_tokens_total",
                      "mla:generation_tokens_total", "mla:decode_ahead_steps_total", "mla:time_to_first_token_seconds_count",
                      "mla:inter_token_latency_seconds_count", "mla:step_graph_captures_total",
                      "mla:step_graph_replays_total", "mla:step_graphs", "mla:host_syncs_total"])
    check(!Number.isNaN(m0.get(name)), `/metrics has ${name}`);
  check(/# TYPE mla:time_to_first_token_seconds histogram/.test(m0.text), "TTFT histogram type line");

  lap("start + health/models/metrics");
  // Non-streaming completion with token ids and return_token_ids.
  const prompt = randomIds(40, rnd, vocab);  // more than two 16-token pages: the repeat hits the cache
  const c = await client.completions.create({ model: "tiny", prompt, max_tokens: 8, temperature: 0, ignore_eos: true,
                                              return_token_ids: true });
  check(c.id.startsWith("cmpl-") && c.object === "text_completion" && c.model === "tiny" && c.created > 0,
        "completion envelope", c);
  check(c.choices.length === 1 && c.choices[0].index === 0 && c.choices[0].finish_reason === "length", "one choice, length", c.choices);
  check(c.choices[0].token_ids?.length === 8 && c.choices[0].token_ids.every((x) => x >= 0 && x < vocab), "8 token ids", c.choices[0]);
  check(c.usage.prompt_tokens === 40 && c.usage.completion_tokens === 8 && c.usage.total_tokens === 48 &&
        Number.isInteger(c.usage.prompt_tokens_details?.cached_tokens), "usage", c.usage);
  // The same prompt again: its pages come from the prefix cache, the answer does not change.
  const c2 = await client.completions.create({ model: "tiny", prompt, max_tokens: 8, temperature: 0, ignore_eos: true,
                                               return_token_ids: true });
  check(JSON.stringify(c2.choices[0].token_ids) === JSON.stringify(c.choices[0].token_ids), "a prefix-cache hit keeps the answer");
  check(c2.usage.prompt_tokens_details.cached_tokens > 0, "cached_tokens after a repeat", c2.usage);
  // Greedy decode batches run a step ahead: 7 decode batches a request, nearly all issued ahead.
  const ahead = (await metrics(s)).get("mla:decode_ahead_steps_total") - m0.get("mla:decode_ahead_steps_total");
  check(ahead >= 10, "decode batches issued a step ahead", ahead);

  lap("non-streaming + cache repeat");
  // Streaming through the client, with usage.
  const stream = await client.completions.create({ model: "tiny", prompt, max_tokens: 8, temperature: 0, ignore_eos: true,
                                                   return_token_ids: true, stream: true,
                                                   stream_options: { include_usage: true } });
  const streamed = [];
  let usage = null, finish = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    check(ch.id.startsWith("cmpl-") && ch.object === "text_completion", "chunk envelope", ch);
    if (ch.usage) { usage = ch.usage; check(ch.choices.length === 0, "usage chunk has no choices", ch); }
    for (const x of ch.choices) {
      check(Array.isArray(x.token_ids), "every streamed choice carries token_ids", x);
      streamed.push(...(x.token_ids || []));
      if (x.finish_reason) finish = x.finish_reason;
    }
  }
  check(JSON.stringify(streamed) === JSON.stringify(c.choices[0].token_ids), "streamed ids = non-streamed ids", streamed);
  check(finish === "length" && usage?.completion_tokens === 8, "stream finish and usage", { finish, usage });

  // Raw SSE framing: data: lines, [DONE] last.
  const raw = await http(s, "POST", "/v1/completions", { prompt, max_tokens: 3, ignore_eos: true, stream: true });
  check(raw.type.startsWith("text/event-stream"), "SSE content type", raw.type);
  const events = raw.text.split("\n\n").filter((e) => e.length);
  check(events.every((e) => e.startsWith("data: ")) && events.at(-1) === "data: [DONE]" && raw.text.endsWith("\n\n"),
        "SSE framing", raw.text.slice(0, 300));

  lap("streaming + raw SSE");
  // A batch of prompts × n: indices prompt-major, as OpenAI numbers them.
  const pa = randomIds(5, rnd, vocab), pb = randomIds(7, rnd, vocab);
  const b = await client.completions.create({ model: "tiny", prompt: [pa, pb], n: 2, max_tokens: 4, temperature: 0,
                                              ignore_eos: true, return_token_ids: true });
  check(b.choices.length === 4 && b.choices.every((x, i) => x.index === i), "4 choices indexed 0..3", b.choices);
  const single = async (p) => (await client.completions.create({ model: "tiny", prompt: p, max_tokens: 4, temperature: 0,
                                                                 ignore_eos: true, return_token_ids: true })).choices[0].token_ids;
  const [sa, sb] = [await single(pa), await single(pb)];
  check(JSON.stringify(b.choices[0].token_ids) === JSON.stringify(sa) && JSON.stringify(b.choices[1].token_ids) === JSON.stringify(sa) &&
        JSON.stringify(b.choices[2].token_ids) === JSON.stringify(sb) && JSON.stringify(b.choices[3].token_ids) === JSON.stringify(sb),
        "batch choices = the prompts alone", b.choices.map((x) => x.token_ids));
  check(b.usage.prompt_tokens === 12 && b.usage.completion_tokens === 16, "batch usage", b.usage);
  // n > 1 sampled with a seed: reproducible.
  const ns = async () => (await client.completions.create({ model: "tiny", prompt: pa, n: 3, max_tokens: 6, temperature: 1,
                                                            seed: 5, ignore_eos: true, return_token_ids: true })).choices;
  const n1 = await ns(), n2 = await ns();
  check(n1.length === 3 && JSON.stringify(n1.map((x) => x.token_ids)) === JSON.stringify(n2.map((x) => x.token_ids)),
        "n=3 with a seed is reproducible", n1);
  // Logprobs (completions format) and stop_token_ids.
  const lp = await client.completions.create({ model: "tiny", prompt: pa, max_tokens: 3, temperature: 0, logprobs: 2,
                                               ignore_eos: true, return_token_ids: true });
  const L = lp.choices[0].logprobs;
  check(L && L.tokens.length === 3 && L.token_logprobs.length === 3 && L.top_logprobs.length === 3 &&
        Object.keys(L.top_logprobs[0]).length === 2 && L.token_logprobs.every((x) => x <= 0) &&
        L.tokens[0] === `token_id:${lp.choices[0].token_ids[0]}`, "completion logprobs", L);
  const stopAt = sa[1];
  const st = await client.completions.create({ model: "tiny", prompt: pa, max_tokens: 4, temperature: 0,
                                               stop_token_ids: [stopAt], return_token_ids: true });
  const firstStop = sa.indexOf(stopAt);
  check(st.choices[0].finish_reason === "stop" && st.choices[0].token_ids.length === firstStop + 1, "stop_token_ids", st.choices[0]);

  lap("batch, n, logprobs, stop ids");
  // Served greedy ids equal `mla generate` alone, for 16 concurrent requests sharing prefixes.
  const shared = [randomIds(20, rnd, vocab), randomIds(33, rnd, vocab)];
  const prompts = Array.from({ length: 16 }, (_, i) => [...shared[i % 2].slice(0, 10 + i), ...randomIds(1 + (i % 5), rnd, vocab)]);
  const served = await Promise.all(prompts.map((p, i) => client.completions.create({
    model: "tiny", prompt: p, max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true, stream: i % 2 === 1,
  }).then(async (r) => {
    if (!(i % 2)) return r.choices[0].token_ids;
    const ids = [];
    for await (const ch of r) for (const x of ch.choices) ids.push(...(x.token_ids || []));
    return ids;
  })));
  for (let i = 0; i < 16; i++) {
    const out = execFileSync(MLA, ["generate", "--model", MODEL, "--ids", prompts[i].join(","), "--max-new-tokens", "10",
                                   "--json"], { stdio: ["ignore", "pipe", "ignore"] }).toString();
    const alone = JSON.parse(out).ids;
    check(JSON.stringify(served[i]) === JSON.stringify(alone), `served = mla generate, request ${i}`, { served: served[i], alone });
  }

  lap("16 concurrent vs mla generate");
  // An aborted stream: the request stops running and frees its pages.
  {
    const gen0 = (await metrics(s)).get("mla:generation_tokens_total");
    const ctl = new AbortController();
    const st2 = await client.completions.create({ model: "tiny", prompt: randomIds(40, rnd, vocab), max_tokens: ctx - 64,
                                                  ignore_eos: true, stream: true, return_token_ids: true },
                                                { signal: ctl.signal });
    let n = 0;
    try { for await (const ch of st2) { if (++n === 3) ctl.abort(); } } catch (e) { /* aborted */ }
    check(await waitIdle(s, 3000), "an aborted stream stops running");
    // It stopped soon after the client left, far from its max_tokens.
    const gen = (await metrics(s)).get("mla:generation_tokens_total") - gen0;
    check(gen < (ctx - 64) / 2, "an aborted stream stops generating", gen);
  }

  lap("aborted stream");
  // A non-streamed request whose client closes the connection (a raw socket: send, then close without
  // reading) is aborted within an engine step, as a dropped stream is: nothing runs soon after, it
  // generated far fewer tokens than it asked for, /metrics counts the disconnect, and after
  // /flush_cache the pool is empty.
  {
    const m0 = await metrics(s);
    const gen0 = m0.get("mla:generation_tokens_total"), gone0 = m0.get("mla:client_disconnects_total");
    // 4 prompts × n = 8: 32 sequences of ctx - 64 tokens, about a second of work if nothing stops it.
    const asked = 32 * (ctx - 64);
    const body = JSON.stringify({ model: "tiny", prompt: Array.from({ length: 4 }, () => randomIds(40, rnd, vocab)), n: 8,
                                  max_tokens: ctx - 64, ignore_eos: true });
    const sock = net.connect(s.port, "127.0.0.1");
    await new Promise((r, j) => { sock.once("connect", r); sock.once("error", j); });
    let answered = false;
    sock.on("data", () => (answered = true));
    sock.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${KEY}\r\n` +
               `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    let running = false;
    for (let i = 0; i < 200 && !running; i++) {
      running = (await metrics(s)).get("mla:generation_tokens_total") > gen0;
      if (!running) await sleep(5);
    }
    check(running && !answered, "the non-streamed request runs", { running, answered });
    const closedAt = Date.now();
    sock.destroy();
    check(await waitIdle(s, 2000), "a non-streamed request whose client left stops running");
    const idleMs = Date.now() - closedAt;
    const m1 = await metrics(s);
    const gen = m1.get("mla:generation_tokens_total") - gen0;
    check(gen < asked / 4, "a non-streamed request whose client left stops generating", { gen, asked, idleMs });
    check(m1.get("mla:client_disconnects_total") - gone0 === 1, "/metrics counts the client that left",
          m1.get("mla:client_disconnects_total"));
    await flush(s);
    check((await metrics(s)).get("mla:kv_cache_usage_perc") === 0, "the pool is empty after the client left + flush");
    // An ordinary non-streamed answer is still one JSON body with its length, as before.
    const r = await http(s, "POST", "/v1/completions", { prompt: [1, 2, 3], max_tokens: 3, ignore_eos: true });
    check(r.status === 200 && r.type === "application/json" && r.json?.choices?.[0]?.finish_reason === "length",
          "non-streamed: 200, application/json", { status: r.status, type: r.type, text: r.text.slice(0, 200) });
    lap(`non-streamed client gone (${gen} of ${asked} tokens generated, idle ${idleMs} ms after the close)`);
  }
  // Errors as OpenAI sends them, through the client...
  const err = async (f) => { try { await f(); return null; } catch (e) { return e; } };
  let e = await err(() => client.completions.create({ model: "tiny", prompt: [1, 2], max_tokens: -1 }));
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.error?.param === "max_tokens", "client: 400", e?.error);
  e = await err(() => client.completions.create({ model: "nope", prompt: [1, 2] }));
  check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.error?.code === "model_not_found", "client: 404", e?.error);
  e = await err(() => new OpenAI({ apiKey: "wrong", baseURL: s.url + "/v1", maxRetries: 0 }).models.list());
  check(e instanceof OpenAI.AuthenticationError && e.status === 401, "client: 401", e?.status);
  // ...and over raw HTTP, each with the error object.
  const cases = [
    ["malformed JSON", "/v1/completions", '{"prompt": [1, 2', 400],
    ["prompt of the wrong type", "/v1/completions", { prompt: { a: 1 } }, 400],
    ["temperature of the wrong type", "/v1/completions", { prompt: [1], temperature: "hot" }, 400],
    ["unknown tool_choice value", "/v1/chat/completions", { messages: [{ role: "user", content: "x" }], tool_choice: "maybe" }, 400],
    ["negative max_tokens", "/v1/completions", { prompt: [1], max_tokens: -3 }, 400],
    ["too large max_tokens", "/v1/completions", { prompt: [1, 2], max_tokens: ctx }, 400],
    ["prompt longer than the context", "/v1/completions", { prompt: new Array(ctx + 1).fill(3) }, 400],
    ["id outside the vocabulary", "/v1/completions", { prompt: [1, vocab] }, 400],
    ["negative id", "/v1/completions", { prompt: [1, -1] }, 400],
    ["text prompt without a tokenizer", "/v1/completions", { prompt: "hello" }, 400, /tokenizer/],
    ["chat without a tokenizer", "/v1/chat/completions", { messages: [{ role: "user", content: "hi" }] }, 400, /tokenizer/],
    ["unknown model", "/v1/completions", { model: "gpt-9", prompt: [1] }, 404],
    ["n too large for the engine", "/v1/completions", { prompt: [1], n: 100 }, 400],
  ];
  for (const [what, p, body, status, msg] of cases) {
    const r = await http(s, "POST", p, body);
    const eo = r.json?.error;
    check(r.status === status && eo && typeof eo.message === "string" && "type" in eo && "param" in eo && "code" in eo &&
          !eo.message.includes("\n") && (!msg || msg.test(eo.message)), `error: ${what}`, { status: r.status, body: r.text });
  }
  for (const [what, headers] of [["missing key", { Authorization: "" }], ["wrong key", { Authorization: "Bearer x" }]]) {
    const r = await http(s, "POST", "/v1/completions", { prompt: [1] }, headers);
    check(r.status === 401 && r.json?.error?.code === "invalid_api_key", `error: 401 ${what}`, r.text);
  }
  check((await http(s, "GET", "/v1/nothing")).status === 404, "unknown route 404");
  check((await http(s, "GET", "/health")).status === 200, "still serving after the errors");

  lap("errors");
  // 200 streams cancelled at random points (32 at a time): nothing runs afterwards, and after
  // /flush_cache the pool is empty.
  const cancelOne = async (i) => {
    const ctl = new AbortController();
    const stopAfter = Math.floor(rnd() * 8);  // chunks before the cancel (0: before the first)
    try {
      const st3 = await client.completions.create({ model: "tiny", prompt: randomIds(8 + Math.floor(rnd() * 40), rnd, vocab),
                                                    max_tokens: 400, ignore_eos: true, stream: true, return_token_ids: true },
                                                  { signal: ctl.signal });
      let n = 0;
      if (stopAfter === 0) ctl.abort();
      for await (const ch of st3) if (++n >= stopAfter) { ctl.abort(); break; }
    } catch (e) { if (!(e instanceof OpenAI.APIUserAbortError) && e?.name !== "AbortError") throw e; }
  };
  const genBefore = (await metrics(s)).get("mla:generation_tokens_total");
  for (let i = 0; i < 200; i += 32) await Promise.all(Array.from({ length: Math.min(32, 200 - i) }, (_, k) => cancelOne(i + k)));
  check(await waitIdle(s, 5000), "no request runs after 200 cancelled streams");
  const genCancelled = (await metrics(s)).get("mla:generation_tokens_total") - genBefore;
  check(genCancelled < 200 * 40, "cancelled streams stop generating (of 200 × 400 tokens asked)", genCancelled);
  check(await flush(s) > 0, "/flush_cache released the cancelled streams' cached pages");
  const mf = await metrics(s);
  check(mf.get("mla:kv_cache_usage_perc") === 0, "the pool is empty after /flush_cache", mf.get("mla:kv_cache_usage_perc"));
  check(mf.get("mla:prefix_cache_hits_total") > 0, "prefix-cache hits counted", mf.get("mla:prefix_cache_hits_total"));

  lap("200 cancelled streams + flush");

  // mla bench-serve: a shared-prefix workload at fixed concurrency, then Poisson arrivals.
  for (const extra of [["--max-concurrency", "8"], ["--request-rate", "200"]]) {
    const out = execFileSync(MLA, ["bench-serve", "--port", String(s.port), "--api-key", KEY, "--vocab-size", "512",
                                   "--num-prompts", "24", "--input-len", "40", "--output-len", "8",
                                   "--shared-prefix-len", "32", "--prefix-groups", "2", ...extra],
                             { stdio: ["ignore", "pipe", "pipe"] }).toString();
    const j = JSON.parse(out);
    check(j.completed === 24 && j.failed === 0 && j.total_input_tokens === 24 * 40 && j.total_output_tokens === 24 * 8,
          `bench-serve ${extra[0]}: counts`, j);
    check(j.request_throughput > 0 && j.output_throughput > 0 && j.ttft_ms.mean > 0 && j.ttft_ms.p99 >= j.ttft_ms.median &&
          j.tpot_ms.mean > 0 && j.itl_ms.median > 0, `bench-serve ${extra[0]}: latencies`, j);
    check(j.prefix_cache_hit_rate > 0.5 && j.prefix_cache_hit_rate <= 1, `bench-serve ${extra[0]}: prefix hits`, j);
    check(j.step_graph_captures === 0 && j.step_graph_replays === 0 && j.step_graphs === 0 && j.host_syncs === 0,
          `bench-serve ${extra[0]}: the CPU records no graphs`, j);
  }
  lap("bench-serve");
  // SIGTERM: exit 0.
  s.proc.kill("SIGTERM");
  const ex = await s.exited;
  check(ex.code === 0, "SIGTERM: exit 0", { ...ex, stderr: s.stderr.slice(-300) });

  lap("SIGTERM");
  // A full queue answers 503 and the server keeps serving.
  const q = await startServer("queue", ["--max-queue", "1", "--max-running", "1", "--token-budget", "64"]);
  const long = { prompt: randomIds(30, rnd, vocab), max_tokens: 200, ignore_eos: true };
  const rs = await Promise.all(Array.from({ length: 6 }, () => http(q, "POST", "/v1/completions", long)));
  const codes = rs.map((r) => r.status);
  check(codes.includes(503) && codes.includes(200), "a full queue answers 503", codes);
  const r503 = rs.find((r) => r.status === 503);
  check(r503?.json?.error?.code === "queue_full", "503 error object", r503?.text);
  check((await http(q, "POST", "/v1/completions", { prompt: [1, 2], max_tokens: 2 })).status === 200, "serving after 503s");
  lap("queue full");
  q.proc.kill("SIGINT");
  check((await q.exited).code === 0, "SIGINT: exit 0");
}

// ---------------------------------------------------------------------------------------------
async function textTests() {
  const s = await startServer("text", ["--tokenizer", TOKENIZER]);
  const client = new OpenAI({ apiKey: "unused", baseURL: s.url + "/v1", maxRetries: 0 });
  const c = await client.completions.create({ model: "tiny", prompt: "Hello, my name is", max_tokens: 8, temperature: 0,
                                              ignore_eos: true, return_token_ids: true });
  check(typeof c.choices[0].text === "string" && c.choices[0].token_ids.length === 8, "text completion", c.choices[0]);
  // Stream text = non-stream text.
  const st = await client.completions.create({ model: "tiny", prompt: "Hello, my name is", max_tokens: 8, temperature: 0,
                                               ignore_eos: true, stream: true });
  let text = "";
  for await (const ch of st) for (const x of ch.choices) text += x.text;
  check(text === c.choices[0].text, "streamed text = non-streamed text", { text, full: c.choices[0].text });
  // A stop string taken from the greedy output cuts the text before it.
  if (c.choices[0].text.length > 4) {
    const stop = c.choices[0].text.slice(2, 4);
    const cs = await client.completions.create({ model: "tiny", prompt: "Hello, my name is", max_tokens: 8, temperature: 0,
                                                 ignore_eos: true, stop: [stop] });
    const want = c.choices[0].text.slice(0, c.choices[0].text.indexOf(stop));
    check(cs.choices[0].text === want && cs.choices[0].finish_reason === "stop", "stop string", { got: cs.choices[0], want });
  }
  // Chat, non-streaming and streaming (role first, then content, then finish).
  const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "What is 2+2?" }];
  const cc = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 12, temperature: 0 });
  check(cc.id.startsWith("chatcmpl-") && cc.object === "chat.completion" && cc.choices[0].message.role === "assistant",
        "chat envelope", cc);
  const cst = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 12, temperature: 0, stream: true,
                                                     stream_options: { include_usage: true }, n: 2 });
  const first = {}, content = ["", ""], finishes = {};
  let usage = null;
  for await (const ch of cst) {
    check(ch.object === "chat.completion.chunk", "chat chunk object", ch);
    if (ch.usage) usage = ch.usage;
    for (const x of ch.choices) {
      if (!(x.index in first)) first[x.index] = x.delta;
      content[x.index] += x.delta.content || "";
      if (x.finish_reason) finishes[x.index] = x.finish_reason;
    }
  }
  check(first[0]?.role === "assistant" && first[1]?.role === "assistant", "first chunk has the role", first);
  check(content[0] === (cc.choices[0].message.content || "") && content[1] === content[0], "streamed chat = non-streamed", { content, cc: cc.choices[0].message });
  check(finishes[0] && finishes[1] && usage?.completion_tokens > 0, "chat finish + usage", { finishes, usage });
}

// ---------------------------------------------------------------------------------------------
// Tool calls through the official client, on the echo server (its engine answers each chat with the
// last user message): the streamed calls, accumulated by the client's own ChatCompletionStream, equal
// the non-streamed ones, and their arguments arrive in many pieces, as OpenAI streams them.
async function toolCallTests() {
  const e = await startServer("echo", [], ECHO);
  const client = new OpenAI({ apiKey: "none", baseURL: e.url + "/v1", maxRetries: 0 });
  const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object",
                   properties: { city: { type: "string" } } } } }];
  const args = '{"city": "Paris", "days": [1, 2], "note": "a `b` c"}';
  const replies = {
    v3: "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + args +
        "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>" +
        "<｜tool▁calls▁end｜>",
    v31: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + args + "<｜tool▁call▁end｜>" +
         "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
  };
  for (const [format, reply] of Object.entries(replies)) {
    const messages = [{ role: "user", content: reply }];
    const full = await client.chat.completions.create({ model: "echo", messages, tools });
    const m = full.choices[0].message;
    const calls = (m.tool_calls || []).map((c) => [c.type, c.function.name, c.function.arguments]);
    check(JSON.stringify(calls) === JSON.stringify([["function", "get_weather", args], ["function", "get_time", "{}"]]) &&
          full.choices[0].finish_reason === "tool_calls" && m.tool_calls.every((c) => c.id.startsWith("call_")),
          `${format}: non-streamed tool calls`, full.choices[0]);
    check(m.content === (format === "v3" ? "Let me look." : null), `${format}: non-streamed content`, m.content);
    // Streamed: the client's accumulation, its argument-delta events and the raw deltas.
    const st = client.chat.completions.stream({ model: "echo", messages, tools });
    let pieces = 0, content = "";
    const raw = [];
    st.on("tool_calls.function.arguments.delta", () => pieces++);
    st.on("chunk", (ch) => {
      for (const x of ch.choices) {
        content += x.delta.content || "";
        for (const tc of x.delta.tool_calls || []) raw.push(tc);
      }
    });
    const fin = await st.finalChatCompletion();
    const sm = fin.choices[0].message;
    const scalls = (sm.tool_calls || []).map((c) => [c.type, c.function.name, c.function.arguments]);
    check(JSON.stringify(scalls) === JSON.stringify(calls), `${format}: streamed calls, accumulated = non-streamed`,
          { scalls, calls });
    check(fin.choices[0].finish_reason === "tool_calls" && content === (m.content || ""), `${format}: streamed finish + content`,
          { finish: fin.choices[0].finish_reason, content });
    check(pieces >= args.length / 2, `${format}: the arguments arrive in pieces`, pieces);
    // The first delta of a call: index, id, type, name and arguments ""; the others index + arguments.
    const firsts = raw.filter((tc) => tc.id);
    check(firsts.length === 2 && firsts.every((tc, i) => tc.index === i && tc.type === "function" &&
          tc.id.startsWith("call_") && tc.function.arguments === "") && firsts[0].function.name === "get_weather",
          `${format}: first deltas`, firsts);
    check(raw.filter((tc) => !tc.id).every((tc) => Object.keys(tc).join() === "index,function" &&
          Object.keys(tc.function).join() === "arguments" && tc.function.arguments.length > 0 &&
          !tc.function.arguments.includes("```")), `${format}: argument deltas`, raw.slice(0, 6));
  }
  lap("tool calls (echo server)");
  e.proc.kill("SIGTERM");
  check((await e.exited).code === 0, "echo server: SIGTERM exit 0");
}

// ---------------------------------------------------------------------------------------------
try {
  if (mode === "text") await textTests();
  else {
    await idsTests();
    await toolCallTests();
  }
} catch (e) {
  failures++;
  console.log(`FAIL exception: ${e?.stack || e}`);
  for (const s of servers) console.log(`--- ${s.name} stderr:\n${s.stderr.slice(-2000)}`);
} finally {
  for (const s of servers) if (s.proc.exitCode === null) s.proc.kill("SIGKILL");
  rmSync(tmp, { recursive: true, force: true });
}
console.log(`server e2e (${mode}): ${checks - failures}/${checks} checks passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(failures ? 1 : 0);
