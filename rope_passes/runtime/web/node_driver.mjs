// rope-passes' Node driver: the page's functions (rope.mjs) evaluated in Node itself, one JSON line on stdin each
// ({"id", "fn", "args"}), answered as driver.cjs answers ({"id", "ok", "value"} or {"id", "ok": false, "error"});
// console lines and uncaught errors come as {"event": ...} lines. Two hosts (rope_passes/runtime/web/browser.py):
//   dawn              onnxruntime-web's bundle on the `webgpu` npm package (Dawn for Node): the browser's wasm and
//                     kernels on Dawn's adapter (Mesa lavapipe here, which has shader-f16), not the browser
//   onnxruntime-node  onnxruntime-node's own WebGPU EP (native, its own Dawn); navigator.gpu (the `webgpu` package,
//                     where installed) only says which adapters Dawn sees
// Usage: node node_driver.mjs CONFIG_JSON   (CONFIG: {"host", "node_modules", "url"})
import path from 'node:path';
import readline from 'node:readline';
import { pathToFileURL } from 'node:url';
import fs from 'node:fs';

const config = JSON.parse(process.argv[2]);
const out = process.stdout;
const say = (obj) => out.write(JSON.stringify(obj) + '\n');
for (const type of ['log', 'info', 'warn', 'error', 'debug']) {  // stdout is the protocol: the console is events
  console[type] = (...a) => say({ event: 'console', type, text: a.map((x) => (typeof x === 'string' ? x : String(x))).join(' ') });
}
process.on('unhandledRejection', (e) => say({ event: 'pageerror', text: String(e && e.stack || e) }));
const modules = config.node_modules;
const moduleUrl = (...parts) => pathToFileURL(path.join(modules, ...parts)).href;

// Dawn for Node rejects queue.writeBuffer data backed by a SharedArrayBuffer (onnxruntime-web's wasm memory is one
// when its threads are on): "TypeError: ... must not be shared" (docs/runtimes.md). Copy such data first.
function shimWriteBuffer() {
  const write = GPUQueue.prototype.writeBuffer;
  GPUQueue.prototype.writeBuffer = function (buffer, offset, data, dataOffset, size) {
    if (ArrayBuffer.isView(data) && data.buffer instanceof SharedArrayBuffer) {
      const unit = data.BYTES_PER_ELEMENT || 1;
      const start = data.byteOffset + (dataOffset || 0) * unit;
      const length = size !== undefined ? size * unit : data.byteLength - (dataOffset || 0) * unit;
      return write.call(this, buffer, offset, new Uint8Array(data.buffer, start, length).slice());
    }
    return write.call(this, buffer, offset, data, dataOffset, size);
  };
}

async function gpu() {
  if (!fs.existsSync(path.join(modules, 'webgpu', 'package.json'))) return null;
  const { create, globals } = await import(moduleUrl('webgpu', 'index.js'));
  Object.assign(globalThis, globals);
  return create([]);
}

async function main() {
  globalThis.window = globalThis;
  globalThis.self = globalThis;
  const navigator = { gpu: await gpu(), userAgent: `Node.js ${process.version}` };
  Object.defineProperty(globalThis, 'navigator', { value: navigator, configurable: true, writable: true });
  if (config.host === 'dawn') {
    if (!navigator.gpu) throw new Error('the webgpu npm package is not installed');
    shimWriteBuffer();
    // onnxruntime-web in Node: the bundle imported from its file, its wasm found beside it (no wasmPaths), the
    // model, external data and each call's tensors fetched from the server by absolute URL
    globalThis.ROPE_HOST = { base: config.url.replace(/\/$/, ''), ort: moduleUrl('onnxruntime-web', 'dist') + '/', wasmPaths: null };
  } else if (config.host === 'onnxruntime-node') {
    // onnxruntime-node: models opened from their files (it reads the external data beside them), tensors as above
    globalThis.ROPE_HOST = { base: config.url.replace(/\/$/, ''), module: moduleUrl('onnxruntime-node', 'dist', 'index.js'), files: true,
                             nodeGpu: !!navigator.gpu };
    if (!navigator.gpu) navigator.gpu = undefined;
  } else {
    throw new Error(`unknown host ${config.host}`);
  }
  await import('./rope.mjs');
  say({ event: 'ready', version: process.version });
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const { id, fn, args } = JSON.parse(line);
    try {
      let value;
      if (fn === '__reload') value = {};  // no page to reopen: the process is the page
      else if (fn === '__close') break;
      else if (fn === '__eval') value = await (0, eval)(`(${args.expr})`)();
      else value = await window.rope[fn](args);
      say({ id, ok: true, value });
    } catch (e) {
      say({ id, ok: false, error: String(e && e.message || e) });
    }
  }
}

main().then(() => process.exit(0), (e) => { say({ event: 'fatal', text: String(e && e.stack || e) }); process.exit(1); });
