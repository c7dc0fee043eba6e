// Greedy generation in transformers.js (Node), the way a user runs a model folder: AutoModelForCausalLM over a
// local folder laid out as transformers.js loads it (config.json, onnx/model.onnx), then generate().
// Used by tests/test_transformers_js.py. Usage:
//   node transformers_js_generate.mjs WEB_RUNTIME_DIR JOBS_JSON
// JOBS_JSON: [{"root": folder holding the model folders, "name": model folder, "device": "cpu" | "webgpu",
//             "prompt": [token ids], "new_tokens": n, "logits": true | false}, ...]
// Prints one JSON line per job: {"tokens": [n generated ids], "logits": [rows][vocab] of one forward pass over
// prompt + generated tokens (when asked), "ms": {"load", "generate", "forward"}} or {"error": message}.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [runtimeDir, jobsJson] = process.argv.slice(2);
const entry = join(runtimeDir, 'node_modules', '@huggingface', 'transformers', 'dist', 'transformers.node.mjs');
const { AutoModelForCausalLM, Tensor, env } = await import(pathToFileURL(entry).href);
env.allowRemoteModels = false;  // local folders only: no network, no cache of the Hub's files

const ids = (tokens) => new Tensor('int64', BigInt64Array.from(tokens.map(BigInt)), [1, tokens.length]);
const ones = (n) => new Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]);

for (const job of JSON.parse(jobsJson)) {
  const ms = {};
  let start = Date.now();
  const lap = (name) => { ms[name] = Date.now() - start; start = Date.now(); };
  try {
    env.localModelPath = job.root;
    const model = await AutoModelForCausalLM.from_pretrained(job.name, {
      dtype: 'fp32', device: job.device, local_files_only: true,
    });
    lap('load');
    const n = job.prompt.length;
    const out = await model.generate({
      input_ids: ids(job.prompt), attention_mask: ones(n), max_new_tokens: job.new_tokens, do_sample: false,
    });
    const all = Array.from(out.data, Number);
    lap('generate');
    let table = null;
    if (job.logits) {
      const { logits } = await model({ input_ids: ids(all), attention_mask: ones(all.length) });
      const [, rows, vocab] = logits.dims;
      const data = Array.from(logits.data);
      table = Array.from({ length: rows }, (_, r) => data.slice(r * vocab, (r + 1) * vocab));
      lap('forward');
    }
    await model.dispose();
    console.log(JSON.stringify({ tokens: all.slice(n), logits: table, ms }));
  } catch (error) {
    lap('failed');
    console.log(JSON.stringify({ error: String(error?.message ?? error).split('\n')[0], ms }));
  }
}
