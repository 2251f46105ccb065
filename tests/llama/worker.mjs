// One llama.cpp model behind JSON lines, for tests/llama/server.py.
//
// Started as `node worker.mjs MODEL.gguf` with node-llama-cpp in ./node_modules. It loads the
// model once on the CPU build (no GPU probing, no download, no compile), prints
// {"ready": true, "load_ms", "metadata", "eos"} and then answers one request per stdin line,
// in order (one model, one sequence: Ollama's runner with OLLAMA_NUM_PARALLEL=1):
//
//   {"id", "op": "tokenize", "text"}        -> {"id", "tokens": [...]}  (special tokens parsed)
//   {"id", "op": "generate", "tokens", "num_ctx", "num_predict", "temperature", "seed", "shift"}
//        -> {"id", "piece": "..."} per piece of text, then
//           {"id", "done": true, "done_reason": "stop"|"length", "prompt_n", "cache_n",
//            "eval_n", "prompt_ms", "predict_ms", "reloaded"}
//
// A different num_ctx makes a new context (Ollama reloads the runner for it; "reloaded" says
// so). The KV cache keeps the previous prompt and reply; the next prompt's common prefix with
// them is not evaluated again, except that at least one prompt token always is (llama-server's
// rule), and cache_n says how many were reused. Generation stops at EOS, at num_predict, or at
// the window: with shift false at num_ctx tokens (prompt + reply, done_reason "length"); with
// shift true llama.cpp's context shift erases the oldest half and goes on, as llama-server does.
import { createInterface } from "node:readline";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const started = performance.now();
const modelPath = process.argv[2];
const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true,
    progressLogs: false, logLevel: LlamaLogLevel.error,
    // Tests share the machine: two threads at most unless told otherwise.
    maxThreads: Number(process.env.ROOST_LLAMA_THREADS || 2),
});
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
let context = null;
let sequence = null;

function send(obj) {
    process.stdout.write(JSON.stringify(obj) + "\n");
}

function flatten(prefix, value, out) {
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
        for (const [key, inner] of Object.entries(value)) {
            flatten(prefix ? `${prefix}.${key}` : key, inner, out);
        }
    } else {
        out[prefix] = typeof value === "bigint" ? Number(value) : value;
    }
    return out;
}

async function window(numCtx) {
    if (context !== null && context.contextSize === numCtx) {
        return false;
    }
    if (context !== null) {
        await context.dispose();
    }
    context = await model.createContext({ contextSize: numCtx, batchSize: Math.min(numCtx, 512) });
    sequence = context.getSequence();
    return true;
}

async function generate(req) {
    const reloaded = await window(req.num_ctx);
    const tokens = req.tokens;
    const held = sequence.contextTokens;
    let common = 0;
    while (common < held.length && common < tokens.length && held[common] === tokens[common]) {
        common++;
    }
    const cached = Math.min(common, tokens.length - 1);
    if (sequence.nextTokenIndex > cached) {
        await sequence.eraseContextTokenRanges([{ start: cached, end: sequence.nextTokenIndex }]);
    }
    const greedy = !(req.temperature > 0);
    const options = greedy ? { temperature: 0 } : { temperature: req.temperature, seed: req.seed };
    if (req.shift) {
        options.contextShift = { strategy: "eraseBeginning" };
    }
    const promptStart = performance.now();
    let promptMs = 0;
    let predictStart = 0;
    const generated = [];
    let text = "";
    let doneReason = "stop";
    const limit = req.num_predict < 0 ? 10 * req.num_ctx : req.num_predict;
    if (limit === 0) {
        doneReason = "length";
    } else {
        for await (const token of sequence.evaluate(tokens.slice(cached), options)) {
            if (generated.length === 0) {
                promptMs = performance.now() - promptStart;
                predictStart = performance.now();
            }
            generated.push(token);
            const whole = model.detokenize(generated);
            if (!whole.endsWith("\uFFFD")) {  // a character split over tokens waits for its end
                const piece = whole.slice(text.length);
                text = whole;
                if (piece) {
                    send({ id: req.id, piece });
                }
            }
            if (generated.length >= limit || (!req.shift && tokens.length + generated.length >= req.num_ctx)) {
                doneReason = "length";
                break;
            }
        }
    }
    if (generated.length === 0) {
        promptMs = performance.now() - promptStart;
    }
    send({
        id: req.id, done: true, done_reason: doneReason, prompt_n: tokens.length - cached,
        cache_n: cached, eval_n: generated.length, prompt_ms: promptMs,
        predict_ms: generated.length ? performance.now() - predictStart : 0, reloaded,
    });
}

async function handle(req) {
    if (req.op === "tokenize") {
        send({ id: req.id, tokens: Array.from(model.tokenize(req.text, true)) });
    } else if (req.op === "generate") {
        await generate(req);
    } else {
        send({ id: req.id, error: `unknown op ${req.op}` });
    }
}

send({
    ready: true, load_ms: performance.now() - started, eos: model.tokens.eos,
    metadata: flatten("", model.fileInfo.metadata, {}),
});

// Requests are handled one after another, in the order they arrive.
let queue = Promise.resolve();
const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
    if (!line.trim()) {
        return;
    }
    const req = JSON.parse(line);
    queue = queue.then(() => handle(req)).catch((err) => send({ id: req.id, error: String(err) }));
});
lines.on("close", () => {
    queue.then(async () => {
        await model.dispose();
        process.exit(0);
    });
});
