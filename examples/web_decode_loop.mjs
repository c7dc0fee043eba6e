// web_decode_loop.mjs: greedy decoding with WebGPU graph capture on onnxruntime-web 1.30 (one file: copy it).
//
// It runs what `rope-passes optimize MODEL -o OUT --preset webgpu-graph --runtime onnxruntime-web` writes (a
// onnxruntime-genai builder folder: model.onnx [+ model.onnx.data] + genai_config.json) the way onnxruntime-genai
// runs a graph-capture model, in the browser:
//   * static KV buffers on the GPU: one buffer per past_key_values.N.{key,value}, [1, kv_heads, max_length, head],
//     bound as both the past input and the present output (genai's past_present_share_buffer), never copied;
//   * two sessions of the same model: the prompt runs on one without capture (its shapes change with the prompt),
//     every later token on one with `enableGraphCapture: true`: its first run is captured, the others replay the
//     captured GPU commands. A captured run reads and writes fixed GPU buffers only: input_ids, position_ids (where
//     the graph has them), the attention mask at max_length (one 1 written per step) and the logits;
//   * greedy: the next token is the argmax of the last logits row (downloaded: vocab floats per step).
// Where a graph cannot be captured (`If`, a Shape -> Expand, ...: `rope-passes inspect` says which), creating the
// captured session fails; `capture: 'auto'` (the default) then decodes on the same static KV buffers without
// capture, with an attention mask as long as the sequence (as genai does without capture), and says so in
// `decoder.captureError`. LongRoPE (Phi-3 128k, ...) is such a graph for onnxruntime-web: see docs/runtimes.md.
//
// The file imports nothing: pass it your onnxruntime-web module (the WebGPU build).
//
//   import * as ort from 'onnxruntime-web/webgpu';
//   import { loadGenaiFolder, generate } from './web_decode_loop.mjs';
//   const decoder = await loadGenaiFolder(ort, 'https://example.com/phi3-web/', { maxLength: 1024 });
//   const { tokens, stepMs } = await generate(decoder, [1, 450, 4996], { maxNewTokens: 32 });
//   await decoder.release();
//
// maxLength (default: genai_config's search.max_length) sizes the KV buffers, and a captured step attends over all
// of it: give it what the app needs, not the model's context (docs/performance.md). In Node, onnxruntime-web runs on
// the `webgpu` npm package (Dawn for Node): set `globalThis.navigator = { gpu: create([]) }` from it, copy
// shared-memory data before `GPUQueue.writeBuffer` (Dawn for Node crashes on it: rope-passes'
// runtime/web/node_driver.mjs has the shim), and serve the folder over HTTP (onnxruntime-web fetches the model).
// Lower level, for any decoder graph: createDecoder(ort, options) -> decoder.prefill(feeds), decoder.step(feeds),
// decoder.read(tensor), decoder.kvBuffers (the static KV tensors); generate() is built on them.

const ELEMENT = { float32: 1, uint8: 2, int8: 3, int32: 6, int64: 7, bool: 9, float16: 10 };  // ONNX TensorProto
const BYTES = { float32: 4, uint8: 1, int8: 1, int32: 4, int64: 8, bool: 1, float16: 2 };
const ARRAY = { float32: Float32Array, uint8: Uint8Array, int8: Int8Array, int32: Int32Array, int64: BigInt64Array,
                bool: Uint8Array, float16: Uint16Array };
const count = (dims) => dims.reduce((a, b) => a * b, 1);

// ---- onnxruntime's own GPU buffers ---------------------------------------------------------------------------------
// The buffers a captured graph is bound to must be onnxruntime's own: with GPUBuffers made by `device.createBuffer`,
// onnxruntime-web 1.30's replays fail in Chrome ("Cannot set properties of undefined (setting
// 'Symbol(gpuBufferMetadata)')"). Each buffer here is the output of a one-node Identity model (written below as
// ONNX protobuf bytes) run with preferredOutputLocation 'gpu-buffer'; its tensor is kept until release().

function protobuf(fields) {  // [[field number, value]]: value a number (varint), string or Uint8Array (bytes)
  const out = [];
  const varint = (n) => { while (n > 127) { out.push((n & 127) | 128); n = Math.floor(n / 128); } out.push(n); };
  for (const [field, value] of fields) {
    if (typeof value === 'number') { varint(field * 8); varint(value); continue; }
    const bytes = typeof value === 'string' ? new TextEncoder().encode(value) : value;
    varint(field * 8 + 2); varint(bytes.length); out.push(...bytes);
  }
  return new Uint8Array(out);
}

function identityModel(dtype) {  // ModelProto: ir_version 8, opset 17, graph y = Identity(x) of element type dtype
  const value = (name) => protobuf([[1, name], [2, protobuf([[1, protobuf([[1, ELEMENT[dtype]]])]])]]);
  const node = protobuf([[1, 'x'], [2, 'y'], [4, 'Identity']]);
  const graph = protobuf([[1, node], [2, 'alloc'], [11, value('x')], [12, value('y')]]);
  return protobuf([[1, 8], [7, graph], [8, protobuf([[1, ''], [2, 17]])]]);
}

class GpuAllocator {
  constructor(ort, ep) {
    Object.assign(this, { ort, ep, sessions: new Map(), tensors: [], buffers: new Set() });
  }

  // a zero-filled GPU buffer owned by onnxruntime, as a tensor to bind (Tensor.fromGpuBuffer: binding it needs no
  // care of its lifetime; the allocating tensor is kept until release())
  async tensor(dtype, dims) {
    if (!(dtype in ELEMENT)) throw new Error(`no GPU buffer type for ${dtype}`);
    let session = this.sessions.get(dtype);
    if (!session) {
      session = await this.ort.InferenceSession.create(identityModel(dtype), {
        executionProviders: [this.ep], preferredOutputLocation: 'gpu-buffer' });
      this.sessions.set(dtype, session);
    }
    const zeros = new this.ort.Tensor(dtype, new ARRAY[dtype](count(dims)), dims);
    const { y } = await session.run({ x: zeros });
    this.tensors.push(y);
    this.buffers.add(y.gpuBuffer);
    return this.ort.Tensor.fromGpuBuffer(y.gpuBuffer, { dataType: dtype, dims });
  }

  async release() {
    for (const t of this.tensors) t.dispose();
    for (const s of this.sessions.values()) await s.release();
    this.tensors = [];
    this.buffers.clear();
    this.sessions.clear();
  }
}

function device(ort, ep) {  // the GPUDevice onnxruntime-web runs on: the EP entry's own, or its default one
  const d = ep.device ?? ort.env.webgpu.device;
  if (!d || typeof d.createBuffer !== 'function') throw new Error('onnxruntime-web has no WebGPU device');
  return d;
}

async function download(dev, tensor) {  // a GPU tensor's data, copied out through a staging buffer (getData() would
                                        // turn the tensor itself into a CPU one, and a captured graph needs it bound)
  const nbytes = count(tensor.dims) * BYTES[tensor.type];
  const size = Math.ceil(nbytes / 4) * 4;
  const staging = dev.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const encoder = dev.createCommandEncoder();
  encoder.copyBufferToBuffer(tensor.gpuBuffer, 0, staging, 0, size);
  dev.queue.submit([encoder.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const bytes = staging.getMappedRange().slice(0, nbytes);
  staging.unmap();
  staging.destroy();
  return new ARRAY[tensor.type](bytes);
}

function write(dev, tensor, data, byteOffset = 0) {  // host data into a GPU tensor's buffer (4-byte aligned sizes)
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
  padded.set(bytes);
  dev.queue.writeBuffer(tensor.gpuBuffer, byteOffset, padded);
}

// ---- the decoder ---------------------------------------------------------------------------------------------------

/**
 * Two sessions of one decoder graph on static GPU KV buffers.
 *   model         a URL (or the model's bytes), as InferenceSession.create takes it
 *   externalData  [{path, data}] as onnxruntime-web takes it (the data file(s) the model names)
 *   maxLength     tokens the KV buffers hold (loadGenaiFolder: genai_config's search.max_length). A captured
 *                 step attends over all maxLength positions (its mask is that long): give it what the app needs
 *   kv            {pastName: presentName}; default: every input past_key_values.* to its present.* output
 *   kvDims        {pastName: [1, kvHeads, maxLength, head]}; default: the inputs' declared heads and head size
 *   capture       true | false | 'auto' (default): capture the decode steps; 'auto' falls back to no capture when
 *                 onnxruntime-web refuses it for this graph (decoder.captureError says why)
 *   sessionOptions  merged into both sessions' options (e.g. {extra: {...}}, logSeverityLevel)
 *   webgpu        the WebGPU EP entry (default {name: 'webgpu'}; e.g. {name: 'webgpu', device} for your own
 *                 GPUDevice); a string is made an object (see below)
 *   decodeOutputDims  {name: dims} of each non-KV output of a one-token step; default: the prompt run's dims with
 *                 the sequence axis (axis 1: [batch, sequence, ...]) set to 1
 */
export async function createDecoder(ort, { model, externalData = [], maxLength, kv = null, kvDims = {},
                                           capture = 'auto', sessionOptions = {}, decodeOutputDims = {},
                                           webgpu = { name: 'webgpu' } }) {
  if (!Number.isInteger(maxLength) || maxLength < 1) throw new Error('createDecoder: maxLength is required');
  // the EP as an object, never the string 'webgpu': onnxruntime-web 1.30 passes enableGraphCapture to the WebGPU EP
  // only from an object entry; with ['webgpu'] the session binds its buffers once as for capture but the EP does
  // not capture, and from the second decode step on the KV and logits are wrong, without an error (docs/runtimes.md)
  const ep = typeof webgpu === 'string' ? { name: webgpu } : webgpu;
  const options = (more = {}) => ({ ...structuredClone(sessionOptions), executionProviders: [ep],
                                    externalData, preferredOutputLocation: 'gpu-buffer', ...more });
  let decode = null;
  let captureError = null;
  if (capture) {
    try {
      decode = await ort.InferenceSession.create(model, options({ enableGraphCapture: true }));
    } catch (e) {
      if (capture !== 'auto') throw e;
      captureError = String(e && e.message || e);
    }
  }
  if (!decode) decode = await ort.InferenceSession.create(model, options());
  const prefillSession = await ort.InferenceSession.create(model, options());
  return new Decoder(ort, { ep, prefillSession, decodeSession: decode, captured: !captureError && !!capture, captureError, maxLength, kv,
                            kvDims, decodeOutputDims });
}

class Decoder {
  constructor(ort, o) {
    Object.assign(this, o);
    this.ort = ort;
    this.meta = Object.fromEntries([...this.prefillSession.inputMetadata, ...this.prefillSession.outputMetadata]
      .map((m) => [m.name, m]));
    this.kv = this.kv ?? Object.fromEntries(this.prefillSession.inputNames.filter((n) => n.startsWith('past_key_values.'))
      .map((n) => [n, n.replace(/^past_key_values\./, 'present.')]));
    this.presents = new Set(Object.values(this.kv));
    this.alloc = new GpuAllocator(ort, this.ep);
    this.kvTensors = null;  // {pastName: GPU tensor [1, kvHeads, maxLength, head]}
    this.bound = null;      // the captured step's fixed tensors: {inputs: {name: tensor}, outputs: {name: tensor}}
    this.length = 0;        // tokens in the KV buffers
    this.maskType = this.meta.attention_mask?.type ?? 'int64';
  }

  get gpu() { return device(this.ort, this.ep); }

  get kvTensorsOrThrow() {
    if (!this.kvTensors) throw new Error('no prompt run yet');
    return this.kvTensors;
  }

  /** The static KV tensors ({pastName: GPU tensor}); they hold `this.length` tokens. */
  get kvBuffers() { return this.kvTensorsOrThrow; }

  async #allocKv() {
    this.kvTensors = {};
    for (const name of Object.keys(this.kv)) {
      const declared = this.meta[name]?.shape ?? [];
      const dims = this.kvDims[name] ?? [1, declared[1], this.maxLength, declared[3]];
      if (!dims.every((d) => Number.isInteger(d) && d > 0)) throw new Error(`${name}: give kvDims (declared ${declared})`);
      this.kvTensors[name] = await this.alloc.tensor(this.meta[name]?.type ?? 'float32', dims);
    }
  }

  #mask(total) {  // a host attention mask of `total` ones
    return new this.ort.Tensor(this.maskType, new ARRAY[this.maskType](total).fill(this.maskType === 'int64' ? 1n : 1),
                               [1, total]);
  }

  #kvFeeds(feeds, fetches) {
    for (const [past, present] of Object.entries(this.kv)) {
      feeds[past] = this.kvTensors[past];
      fetches[present] = this.kvTensors[past];
    }
  }

  /** The prompt: `feeds` holds every input but the attention mask and the KV ({input_ids, position_ids?: host
   *  tensors [1, S]}). Returns the outputs ({logits: GPU tensor [1, S, vocab]}, the KV left out). */
  async prefill(feeds) {
    if (!this.kvTensors) await this.#allocKv();
    const seq = (feeds.input_ids ?? feeds.inputs_embeds ?? Object.values(feeds)[0]).dims[1];
    if (seq > this.maxLength) throw new Error(`a ${seq}-token prompt is longer than maxLength ${this.maxLength}`);
    const all = { ...feeds };
    const fetches = {};
    for (const n of this.prefillSession.outputNames) if (!this.presents.has(n)) fetches[n] = null;
    this.#kvFeeds(all, fetches);
    // captured decode: the mask is the static one at maxLength (written on the GPU); otherwise as long as the run
    if (this.captured) all.attention_mask = await this.#staticMask(seq);
    else all.attention_mask = this.#mask(seq);
    const outs = await this.prefillSession.run(all, fetches);
    this.length = seq;
    this.lastDims = Object.fromEntries(Object.entries(outs).filter(([n]) => !this.presents.has(n))
      .map(([n, t]) => [n, t.dims]));
    return Object.fromEntries(Object.entries(outs).filter(([n]) => !this.presents.has(n)));
  }

  async #staticMask(ones) {  // [1, maxLength]: `ones` ones, then zeros (a new sequence clears the last one's)
    if (!this.staticMask) this.staticMask = await this.alloc.tensor(this.maskType, [1, this.maxLength]);
    const mask = new ARRAY[this.maskType](this.maxLength);
    mask.fill(this.maskType === 'int64' ? 1n : 1, 0, ones);
    write(this.gpu, this.staticMask, mask);
    return this.staticMask;
  }

  /** One token: `feeds` as for prefill ([1, 1] each). Returns the outputs: with capture, the fixed GPU tensors the
   *  captured graph writes (read them before the next step). */
  async step(feeds) {
    if (this.length === 0) throw new Error('step() before prefill()');
    if (this.length >= this.maxLength) throw new Error(`the KV buffers are full (maxLength ${this.maxLength})`);
    const total = this.length + 1;
    let outs;
    if (this.captured) {
      if (!this.bound) await this.#bind(feeds);
      const { inputs, outputs } = this.bound;
      for (const [name, t] of Object.entries(feeds)) write(this.gpu, inputs[name], t.data);
      const one = new ARRAY[this.maskType](1).fill(this.maskType === 'int64' ? 1n : 1);
      write(this.gpu, this.staticMask, one, this.length * BYTES[this.maskType]);  // mask[length] = 1
      await this.decodeSession.run({ ...inputs }, { ...outputs });
      outs = Object.fromEntries(Object.entries(outputs).filter(([n]) => !this.presents.has(n)));
    } else {
      const all = { ...feeds, attention_mask: this.#mask(total) };
      const fetches = {};
      for (const n of this.decodeSession.outputNames) if (!this.presents.has(n)) fetches[n] = null;
      this.#kvFeeds(all, fetches);
      outs = Object.fromEntries(Object.entries(await this.decodeSession.run(all, fetches))
        .filter(([n]) => !this.presents.has(n)));
    }
    this.length = total;
    return outs;
  }

  async #bind(feeds) {  // the captured step's fixed buffers: its inputs, the mask, the KV, its outputs
    const inputs = {};
    const outputs = {};
    for (const [name, t] of Object.entries(feeds)) inputs[name] = await this.alloc.tensor(t.type, t.dims);
    inputs.attention_mask = this.staticMask;
    this.#kvFeeds(inputs, outputs);
    for (const name of this.decodeSession.outputNames) {
      if (this.presents.has(name)) continue;
      const dims = this.decodeOutputDims[name] ?? this.lastDims?.[name]?.map((d, k) => (k === 1 ? 1 : d));
      if (!dims) throw new Error(`${name}: give decodeOutputDims`);
      outputs[name] = await this.alloc.tensor(this.meta[name]?.type ?? 'float32', dims);
    }
    this.bound = { inputs, outputs };
  }

  /** A tensor's data on the host: a fixed buffer (KV, the captured step's outputs) is copied out and stays; a
   *  GPU output of an uncaptured run is downloaded and its buffer released. */
  async read(tensor) {
    if (tensor.location === 'cpu') return tensor.data;
    if (this.alloc.buffers.has(tensor.gpuBuffer)) return download(this.gpu, tensor);
    return tensor.getData(true);
  }

  /** Start a new sequence on the same buffers (the captured graph stays valid: same buffers, same shapes). */
  reset() {
    this.length = 0;
  }

  async release() {
    await this.alloc.release();
    await this.prefillSession.release();
    await this.decodeSession.release();
  }
}

// ---- greedy generation on a genai builder folder -------------------------------------------------------------------

/** A folder's genai_config.json and its decoder, from the folder's URL. */
export async function loadGenaiFolder(ort, folderUrl, { maxLength, capture = 'auto', sessionOptions = {},
                                                        externalData, webgpu } = {}) {
  if (!String(folderUrl).endsWith('/')) folderUrl = `${folderUrl}/`;
  const config = await (await fetch(new URL('genai_config.json', folderUrl))).json();
  const dec = config.model.decoder;
  const filename = dec.filename ?? 'model.onnx';
  if (!externalData) {  // the builder's one data file, where it is there
    const data = new URL(`${filename}.data`, folderUrl).href;
    const head = await fetch(data, { method: 'HEAD' }).catch(() => null);
    externalData = head && head.ok ? [{ path: `${filename}.data`, data }] : [];
  }
  const kv = {};
  for (let i = 0; i < dec.num_hidden_layers; i++) {
    kv[dec.inputs.past_key_names.replace('%d', i)] = dec.outputs.present_key_names.replace('%d', i);
    kv[dec.inputs.past_value_names.replace('%d', i)] = dec.outputs.present_value_names.replace('%d', i);
  }
  const length = maxLength ?? config.search?.max_length ?? config.model.context_length;
  const kvDims = Object.fromEntries(Object.keys(kv).map((n) => [n, [1, dec.num_key_value_heads, length,
                                                                    dec.head_size]]));
  const decoder = await createDecoder(ort, { model: new URL(filename, folderUrl).href, externalData, maxLength: length,
                                             kv, kvDims, capture, sessionOptions, webgpu });
  decoder.config = config;
  return decoder;
}

function half(bits) {  // an IEEE float16 (its bits) as a number
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** The index of the largest of `length` values from `offset` (the first, on a tie; float16 as its bits). */
export function argmax(data, offset, length, dtype = 'float32') {
  const value = dtype === 'float16' ? (k) => half(data[k]) : (k) => data[k];
  let best = 0;
  let top = value(offset);
  for (let k = 1; k < length; k++) {
    const v = value(offset + k);
    if (v > top) { top = v; best = k; }
  }
  return best;
}

function tokenFeeds(decoder, ids, start) {  // input_ids (and position_ids, where the graph has them) for `ids`
  const idType = decoder.meta.input_ids?.type ?? 'int64';
  const big = (v) => (idType === 'int64' ? BigInt(v) : v);
  const feeds = { input_ids: new decoder.ort.Tensor(idType, ARRAY[idType].from(ids, big), [1, ids.length]) };
  const pos = decoder.meta.position_ids;
  if (pos) {
    const rows = pos.shape.length === 3 ? 3 : 1;  // [3, B, S]: text-only mRoPE, three equal axes
    const cast = (v) => (pos.type === 'int64' ? BigInt(v) : v);
    const data = ARRAY[pos.type].from({ length: rows * ids.length }, (_, k) => cast(start + (k % ids.length)));
    feeds.position_ids = new decoder.ort.Tensor(pos.type, data, rows === 3 ? [3, 1, ids.length] : [1, ids.length]);
  }
  return feeds;
}

/**
 * Greedy decoding: the prompt, then up to `maxNewTokens` tokens (stops after an end token: genai_config's
 * eos_token_id, or `eosTokenId`). Returns {tokens (the new ones), prefillMs, stepMs (one per decode step),
 * captured (whether the steps replayed a captured graph)}. `onToken(id, index)` is called as each token comes.
 */
export async function generate(decoder, prompt, { maxNewTokens = 32, eosTokenId, onToken, logits = 'logits' } = {}) {
  const eos = new Set([eosTokenId ?? decoder.config?.model?.eos_token_id ?? []].flat());
  const type = decoder.meta[logits]?.type ?? 'float32';
  const next = async (outs) => {
    const t = outs[logits];
    const vocab = t.dims.at(-1);
    return argmax(await decoder.read(t), (count(t.dims) / vocab - 1) * vocab, vocab, type);
  };
  decoder.reset();
  const tokens = [];
  const now = () => performance.now();
  let t0 = now();
  let token = await next(await decoder.prefill(tokenFeeds(decoder, prompt, 0)));
  const prefillMs = now() - t0;
  const stepMs = [];
  while (true) {
    tokens.push(token);
    onToken?.(token, tokens.length - 1);
    if (tokens.length >= maxNewTokens || eos.has(token) || decoder.length >= decoder.maxLength) break;
    t0 = now();
    token = await next(await decoder.step(tokenFeeds(decoder, [token], decoder.length)));
    stepMs.push(now() - t0);
  }
  return { tokens, prefillMs, stepMs, captured: decoder.captured };
}
