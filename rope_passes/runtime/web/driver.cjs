// rope-passes' browser driver: launches Debian's chromium with playwright-core (no browser download), opens the
// runner page on the local server, and evaluates window.rope.<fn>(args) for each JSON line on stdin
// ({"id", "fn", "args"}), answering one JSON line each on stdout ({"id", "ok", "value"} or {"id", "ok": false,
// "error"}). Page console errors and crashes come as {"event": ...} lines. Usage:
//   node driver.cjs CONFIG_JSON   (CONFIG: {"node_modules", "chromium", "args", "url", "timeout_ms"})
'use strict';
const path = require('path');
const readline = require('readline');

const config = JSON.parse(process.argv[2]);
const { chromium } = require(path.join(config.node_modules, 'playwright-core'));
const say = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');

async function main() {
  const browser = await chromium.launch({ executablePath: config.chromium, headless: true, args: config.args,
                                          timeout: config.timeout_ms });
  let page = null;
  async function open() {
    if (page) await page.close().catch(() => {});
    page = await browser.newPage();
    page.setDefaultTimeout(0);
    page.on('console', (m) => { say({ event: 'console', type: m.type(), text: m.text() }); });
    page.on('pageerror', (e) => say({ event: 'pageerror', text: String(e && e.stack || e) }));
    page.on('crash', () => say({ event: 'crash', text: 'the page crashed' }));
    await page.goto(config.url, { timeout: config.timeout_ms });
    await page.waitForFunction(() => window.rope && window.rope.ready, null, { timeout: config.timeout_ms });
  }
  await open();
  say({ event: 'ready', version: browser.version() });
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const { id, fn, args } = JSON.parse(line);
    try {
      let value;
      if (fn === '__reload') { await open(); value = {}; }
      else if (fn === '__close') { break; }
      else if (fn === '__eval') { value = await page.evaluate(args.expr); }  // an async function's source, for probes
      else value = await page.evaluate(([f, a]) => window.rope[f](a), [fn, args]);
      say({ id, ok: true, value });
    } catch (e) {
      say({ id, ok: false, error: String(e && e.message || e) });
    }
  }
  await browser.close().catch(() => {});
}

main().then(() => process.exit(0), (e) => { say({ event: 'fatal', text: String(e && e.stack || e) }); process.exit(1); });
