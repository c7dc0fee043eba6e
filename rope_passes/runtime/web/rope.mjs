// The page side of rope-passes' browser runtime (rope_passes/runtime/web/__init__.py): onnxruntime-web sessions on
// WebGPU, driven from Python through driver.cjs (playwright-core over CDP). Tensors travel over the local server:
// GET /io/<id> holds a call's feeds, POST /io/<id> takes its outputs (format: uint32 header length, JSON header
// [{name, dtype, dims, offset, nbytes}], then the raw little-endian data; offsets are from the data's start).
// Every function returns plain JSON; an exception becomes the driver's error line (its message, verbatim).
// In Node (node_driver.mjs) the same functions run with ROPE_HOST set: the server's absolute URL, where
// onnxruntime is imported from, and (onnxruntime-node) models opened from their files.
import * as decodeLoop from './web_decode_loop.mjs';  // examples/web_decode_loop.mjs: the loop users copy

const HOST = globalThis.ROPE_HOST ?? { base: '', ort: '/ort/', wasmPaths: '/ort/' };
const at = (url) => HOST.base + url;

const TYPED = {
  float32: Float32Array, float16: Uint16Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array,
  uint8: Uint8Array, int8: Int8Array, float64: Float64Array,
};
const state = { ort: null, bundle: null, sessions: new Map(), next: 1, buffers: new Map() };

function decode(buf) {
  const view = new DataView(buf);
  const n = view.getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, n)));
  const base = 4 + n;
  const out = {};
  for (const t of header) {
    const bytes = buf.slice(base + t.offset, base + t.offset + t.nbytes);  // aligned copy
    out[t.name] = { dtype: t.dtype, dims: t.dims, data: new TYPED[t.dtype](bytes) };
  }
  return out;
}

function encode(arrays) {  // arrays: [{name, dtype, dims, bytes: Uint8Array}]
  const header = [];
  let offset = 0;
  for (const a of arrays) {
    header.push({ name: a.name, dtype: a.dtype, dims: a.dims, offset, nbytes: a.bytes.byteLength });
    offset += Math.ceil(a.bytes.byteLength / 8) * 8;
  }
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(4 + json.byteLength + offset);
  new DataView(out.buffer).setUint32(0, json.byteLength, true);
  out.set(json, 4);
  const base = 4 + json.byteLength;
  header.forEach((h, k) => out.set(arrays[k].bytes, base + h.offset));
  return out;
}

const bytesOf = (data) => new Uint8Array(data.buffer, data.byteOffset, data.byteLength);

async function feedsOf(io) {
  const r = await fetch(at(`/io/${io}`));
  if (!r.ok) throw new Error(`GET /io/${io}: ${r.status}`);
  return decode(await r.arrayBuffer());
}

async function post(io, arrays) {
  const r = await fetch(at(`/io/${io}`), { method: 'POST', body: encode(arrays) });
  if (!r.ok) throw new Error(`POST /io/${io}: ${r.status}`);
}

function tensor(ort, t) {  // float16 data travels as Uint16Array, which onnxruntime-web takes as float16 bits
  return new ort.Tensor(t.dtype, t.data, t.dims);
}

async function init({ bundle }) {
  if (state.ort) {
    if (bundle !== state.bundle) throw new Error(`this page already loaded ${state.bundle}`);
    return { bundle };
  }
  if (HOST.module) {  // onnxruntime-node
    state.ort = await import(HOST.module);
    state.bundle = bundle;
    state.ort.env.logLevel = 'error';
    return { bundle, version: state.ort.env.versions?.node ?? state.ort.env.versions?.common ?? '' };
  }
  const file = { webgpu: 'ort.webgpu.bundle.min.mjs', all: 'ort.all.bundle.min.mjs' }[bundle];
  if (!file) throw new Error(`unknown onnxruntime-web bundle ${bundle}`);
  state.ort = await import(`${HOST.ort}${file}`);
  state.bundle = bundle;
  if (HOST.wasmPaths) state.ort.env.wasm.wasmPaths = HOST.wasmPaths;
  state.ort.env.logLevel = 'error';
  return { bundle, version: state.ort.env.versions?.web ?? '' };
}

async function adapter() {
  if (!navigator.gpu) return { webgpu: false, reason: 'navigator.gpu is undefined (no WebGPU in this browser)' };
  const a = await navigator.gpu.requestAdapter();
  if (!a) return { webgpu: false, reason: 'navigator.gpu.requestAdapter() returned null' };
  const info = a.info || {};
  const limits = {};
  for (const k in a.limits) limits[k] = a.limits[k];
  return {
    webgpu: true, vendor: info.vendor ?? '', architecture: info.architecture ?? '', device: info.device ?? '',
    description: info.description ?? '', isFallbackAdapter: !!info.isFallbackAdapter,
    features: [...a.features].sort(), limits, userAgent: navigator.userAgent,
    crossOriginIsolated: !!self.crossOriginIsolated,
  };
}

function source(url, file) {  // what InferenceSession.create opens: a URL, or (onnxruntime-node) the file
  return HOST.files ? file : at(url);
}

async function create({ url, file, externalData, ep, capture, webgpuOptions, outputsOnGpu }) {
  const ort = state.ort;
  const provider = ep === 'webgpu' ? [{ name: 'webgpu' }] : [HOST.module ? 'cpu' : 'wasm'];
  const options = { executionProviders: provider, extra: {} };
  if (!HOST.files) options.externalData = externalData.map((d) => ({ path: d.path, data: at(d.url) }));
  if (capture) options.enableGraphCapture = true;
  if (outputsOnGpu) options.preferredOutputLocation = 'gpu-buffer';
  if (webgpuOptions && Object.keys(webgpuOptions).length) {
    options.extra.ep = { webgpuexecutionprovider: { ...webgpuOptions } };
  }
  const t0 = performance.now();
  const session = await ort.InferenceSession.create(source(url, file), options);
  const id = state.next++;
  state.sessions.set(id, session);
  return { id, inputs: session.inputNames, outputs: session.outputNames, ms: performance.now() - t0 };
}

async function run({ session, io, names, runOptions }) {
  const ort = state.ort;
  const s = state.sessions.get(session);
  const feeds = {};
  for (const [name, t] of Object.entries(await feedsOf(io))) feeds[name] = tensor(ort, t);
  const t0 = performance.now();
  const outs = await s.run(feeds, names, runOptions || {});
  const ms = performance.now() - t0;
  const arrays = [];
  for (const name of names) {
    const t = outs[name];
    const data = t.location === 'cpu' ? t.data : await t.getData(true);
    arrays.push({ name, dtype: t.type, dims: t.dims, bytes: bytesOf(data) });
  }
  for (const t of Object.values(feeds)) t.dispose?.();
  await post(io, arrays);
  return { ms };
}

async function releaseSession({ session }) {
  const s = state.sessions.get(session);
  if (s) await s.release();
  state.sessions.delete(session);
  return {};
}

// --- graph capture: fixed GPU buffers, bound by name on every call --------------------------------------------
const SIZE = { float32: 4, float16: 2, int64: 8, int32: 4, bool: 1, uint8: 1, int8: 1, float64: 8 };

function device() {
  const d = state.ort.env.webgpu.device;
  if (!d || typeof d.createBuffer !== 'function') {
    throw new Error(HOST.module ? 'onnxruntime-node exposes no WebGPU device (no GPU-buffer tensors to bind)'
                                : 'onnxruntime-web has no WebGPU device yet');
  }
  return d;
}

// Fixed GPU buffers for graph capture ([{key, dtype, dims}]), in one of two ways:
// * allocators ({dtype: url of a one-node Identity model}): each buffer is the output of a run of that model with
//   preferredOutputLocation 'gpu-buffer' (onnxruntime's own buffer, the tensor kept alive). onnxruntime-web's native
//   WebGPU bundle registers such a buffer once, under onnxruntime's own handle, and never unregisters it, so a
//   captured graph that reads it still finds it on replay;
// * no allocators: GPUBuffers created here with device.createBuffer. The native bundle registers a buffer of ours
//   for one run and releases its handle when the run ends, so a captured graph replays with a handle that is gone:
//   "TypeError: Failed to execute 'createBindGroup' on 'GPUDevice': ... Required member is undefined."
//   (docs/runtimes.md: the repro).
async function gpuAlloc({ buffers, allocators }) {
  const dev = device();
  const ort = state.ort;
  for (const b of buffers) {
    const nbytes = b.dims.reduce((x, y) => x * y, 1) * SIZE[b.dtype];
    let entry;
    if (allocators) {
      if (!state.allocators) state.allocators = new Map();
      let alloc = state.allocators.get(b.dtype);
      if (!alloc) {
        alloc = await ort.InferenceSession.create(at(allocators[b.dtype]), {
          executionProviders: [{ name: 'webgpu' }], preferredOutputLocation: 'gpu-buffer' });
        state.allocators.set(b.dtype, alloc);
      }
      const zeros = new ort.Tensor(b.dtype, new TYPED[b.dtype](nbytes / SIZE[b.dtype]), b.dims);
      const out = (await alloc.run({ x: zeros })).y;
      entry = { buffer: out.gpuBuffer, tensor: out, dtype: b.dtype, dims: b.dims, nbytes };
    } else {
      const size = Math.max(16, Math.ceil(nbytes / 16) * 16);
      const buffer = dev.createBuffer({ size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
      entry = { buffer, dtype: b.dtype, dims: b.dims, nbytes };
    }
    release(state.buffers.get(b.key));
    state.buffers.set(b.key, entry);
  }
  return {};
}

function release(entry) {
  if (!entry) return;
  if (entry.tensor) entry.tensor.dispose(); else entry.buffer.destroy();
}

function gpuTensor(key) {
  const b = state.buffers.get(key);
  if (!b) throw new Error(`no GPU buffer ${key}`);
  return state.ort.Tensor.fromGpuBuffer(b.buffer, { dataType: b.dtype, dims: b.dims });
}

async function download(b) {
  const dev = device();
  const size = Math.max(16, Math.ceil(b.nbytes / 16) * 16);
  const staging = dev.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = dev.createCommandEncoder();
  enc.copyBufferToBuffer(b.buffer, 0, staging, 0, size);
  dev.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const bytes = new Uint8Array(staging.getMappedRange().slice(0, b.nbytes));
  staging.unmap();
  staging.destroy();
  return bytes;
}

// one call on fixed buffers: write `io`'s arrays into the buffers they name (feeds named by buffer key), run with
// inputs/outputs bound to buffers ({name: key}), then post the buffers `read` names to `io`
async function runBound({ session, io, inputs, outputs, read, runOptions }) {
  const dev = device();
  for (const [key, t] of Object.entries(await feedsOf(io))) {
    const b = state.buffers.get(key);
    if (!b) throw new Error(`no GPU buffer ${key}`);
    const bytes = bytesOf(t.data);
    if (bytes.byteLength !== b.nbytes) throw new Error(`${key}: ${bytes.byteLength} bytes for a ${b.nbytes}-byte buffer`);
    const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
    padded.set(bytes);
    dev.queue.writeBuffer(b.buffer, 0, padded);
  }
  const s = state.sessions.get(session);
  const feeds = {};
  const fetches = {};
  for (const [name, key] of Object.entries(inputs)) feeds[name] = gpuTensor(key);
  for (const [name, key] of Object.entries(outputs)) fetches[name] = gpuTensor(key);
  const t0 = performance.now();
  await s.run(feeds, fetches, runOptions || {});
  const ms = performance.now() - t0;
  const arrays = [];
  for (const key of read) {
    const b = state.buffers.get(key);
    arrays.push({ name: key, dtype: b.dtype, dims: b.dims, bytes: await download(b) });
  }
  await post(io, arrays);
  return { ms };
}

async function gpuFree() {
  for (const b of state.buffers.values()) release(b);
  state.buffers.clear();
  return {};
}

// A session created with verbose logging and released at once (tools/probe_web_runtime.py reads the placement
// lines from the console): its error, input/output names and output element types.
async function probeCreate({ url, file, webgpuOptions, capture, optimize }) {
  const ort = state.ort;
  const options = { executionProviders: [{ name: 'webgpu' }], logSeverityLevel: 0, logVerbosityLevel: 0, extra: {} };
  if (capture) options.enableGraphCapture = true;
  if (optimize === false) options.graphOptimizationLevel = 'disabled';
  if (webgpuOptions && Object.keys(webgpuOptions).length) {
    options.extra.ep = { webgpuexecutionprovider: { ...webgpuOptions } };
  }
  let session;
  try {
    session = await ort.InferenceSession.create(source(url, file), options);
  } catch (e) {
    return { error: String(e && e.message || e) };
  }
  const outputs = {};
  for (const m of session.outputMetadata || []) outputs[m.name] = m.isTensor ? m.type : null;
  await session.release();
  return { error: null, inputs: session.inputNames, outputs };
}

// --- the decode loop users copy (examples/web_decode_loop.mjs): static GPU KV, the decode steps captured ---------
function sessionOptions(webgpuOptions) {
  const extra = webgpuOptions && Object.keys(webgpuOptions).length ? { ep: { webgpuexecutionprovider: { ...webgpuOptions } } } : {};
  return { extra };
}

async function loopCreate({ url, file, externalData, capture, webgpuOptions, maxLength, kv, kvDims, decodeOutputDims }) {
  const decoder = await decodeLoop.createDecoder(state.ort, {
    model: source(url, file), externalData: HOST.files ? [] : externalData.map((d) => ({ path: d.path, data: at(d.url) })),
    maxLength, kv, kvDims, capture, decodeOutputDims, sessionOptions: sessionOptions(webgpuOptions) });
  const id = state.next++;
  state.sessions.set(id, decoder);
  return { id, captured: decoder.captured, captureError: decoder.captureError };
}

// one call of the loop (the prompt when its KV is empty, else one step) on `io`'s feeds (every input but the mask
// and the KV); posts its outputs and each KV buffer ([1, heads, maxLength, head]: the caller cuts what it holds)
async function loopRun({ decoder, io }) {
  const d = state.sessions.get(decoder);
  const feeds = {};
  for (const [name, t] of Object.entries(await feedsOf(io))) feeds[name] = tensor(state.ort, t);
  const t0 = performance.now();
  const outs = d.length === 0 ? await d.prefill(feeds) : await d.step(feeds);
  const ms = performance.now() - t0;
  const arrays = [];
  for (const [name, t] of Object.entries(outs)) arrays.push({ name, dtype: t.type, dims: t.dims, bytes: bytesOf(await d.read(t)) });
  for (const [name, t] of Object.entries(d.kvBuffers)) arrays.push({ name, dtype: t.type, dims: t.dims, bytes: bytesOf(await d.read(t)) });
  await post(io, arrays);
  return { ms, length: d.length };
}

// a genai folder the server serves (`folder`: its URL path), as a user loads one: loadGenaiFolder
async function loopLoad({ folder, maxLength, capture }) {
  const url = HOST.base ? at(folder) : new URL(folder, location.href).href;
  const decoder = await decodeLoop.loadGenaiFolder(state.ort, url, { maxLength, capture });
  const id = state.next++;
  state.sessions.set(id, decoder);
  return { id, captured: decoder.captured, captureError: decoder.captureError, maxLength: decoder.maxLength };
}

async function loopGenerate({ decoder, prompt, maxNewTokens, eosTokenId }) {
  return decodeLoop.generate(state.sessions.get(decoder), prompt, { maxNewTokens, eosTokenId });
}

async function loopRelease({ decoder }) {
  const d = state.sessions.get(decoder);
  if (d) await d.release();
  state.sessions.delete(decoder);
  return {};
}

async function mark({ text }) {
  console.log(text);
  return {};
}

window.rope = { probeCreate, mark, init, adapter, create, run, release: releaseSession, gpuAlloc, runBound, gpuFree,
                loopCreate, loopLoad, loopRun, loopGenerate, loopRelease, ready: true };
