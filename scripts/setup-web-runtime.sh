#!/usr/bin/env bash
# Set up the JavaScript WebGPU runtimes (check --runtime web | onnxruntime-node; docs/runtimes.md "The browser",
# "The JavaScript runtimes beside the browser"): Debian's chromium (apt, as root or with sudo, only when
# /usr/bin/chromium is missing) and the pinned npm packages of .web-runtime/ (onnxruntime-web, playwright-core,
# webgpu: Dawn for Node, onnxruntime-node; @huggingface/transformers 4.3.1 for the transformers.js client tests;
# package-lock.json committed, node_modules/ ignored), installed with `npm ci`. onnxruntime-node's install script
# downloads CUDA binaries from api.nuget.org (outside npm) and fails without them: ONNXRUNTIME_NODE_INSTALL=skip
# keeps the files its npm package bundles (CPU and WebGPU on Linux x64), all the runtimes and tests use.
# Idempotent. Fails loudly. Needs Node.js >= 18 with npm.
#   chromium: $ROPE_PASSES_CHROMIUM (default /usr/bin/chromium) - when set, nothing is installed with apt
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.web-runtime
CHROMIUM=${ROPE_PASSES_CHROMIUM:-/usr/bin/chromium}

if [ ! -x "$CHROMIUM" ]; then
  if [ -n "${ROPE_PASSES_CHROMIUM:-}" ]; then
    echo "setup-web: \$ROPE_PASSES_CHROMIUM=$CHROMIUM is not an executable" >&2
    exit 1
  fi
  echo "setup-web: installing Debian's chromium (apt-get)"
  SUDO=
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup-web: need root to apt-get install chromium" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q --no-install-recommends chromium >/tmp/setup-web-apt.log 2>&1; then
    $SUDO apt-get update -q >>/tmp/setup-web-apt.log 2>&1 || true
    $SUDO apt-get install -y -q --no-install-recommends chromium >>/tmp/setup-web-apt.log 2>&1 || {
      tail -20 /tmp/setup-web-apt.log >&2
      echo "setup-web: apt-get install chromium failed (log: /tmp/setup-web-apt.log)" >&2
      exit 1
    }
  fi
fi
"$CHROMIUM" --version >/dev/null 2>&1 || { echo "setup-web: $CHROMIUM does not run" >&2; exit 1; }

command -v npm >/dev/null || { echo "setup-web: npm not found (install Node.js >= 18 with npm)" >&2; exit 1; }
installed() {
  node -e '
    const lock = require("./package-lock.json").packages;
    const fs = require("fs");
    for (const name of ["onnxruntime-web", "playwright-core", "@huggingface/transformers", "webgpu", "onnxruntime-node"]) {
      const want = lock["node_modules/" + name].version;
      const file = "./node_modules/" + name + "/package.json";  // not exported by the packages: read the file
      const have = JSON.parse(fs.readFileSync(file, "utf8")).version;
      if (want !== have) process.exit(1);
    }
    // the native parts the runtimes load (rope_passes/runtime/web/install.py PACKAGES)
    for (const file of ["webgpu/dist/linux-x64/dawn.node", "onnxruntime-node/bin/napi-v6/linux/x64/onnxruntime_binding.node"])
      if (!fs.existsSync("./node_modules/" + file)) process.exit(1);' 2>/dev/null
}
if (cd "$DIR" && installed); then
  echo "setup-web: $DIR/node_modules is up to date"
else
  echo "setup-web: npm ci in $DIR (onnxruntime-web, playwright-core, webgpu, onnxruntime-node, @huggingface/transformers)"
  (cd "$DIR" && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error >npm-install.log 2>&1) || {
    tail -20 "$DIR/npm-install.log" >&2
    echo "setup-web: npm ci failed (log: $DIR/npm-install.log)" >&2
    exit 1
  }
  (cd "$DIR" && installed) || { echo "setup-web: installed, but the versions do not match package-lock.json" >&2; exit 1; }
fi
version() { (cd "$DIR" && node -p "JSON.parse(require('fs').readFileSync('node_modules/$1/package.json', 'utf8')).version"); }
echo "setup-web: $("$CHROMIUM" --version 2>/dev/null), onnxruntime-web $(version onnxruntime-web), webgpu $(version webgpu)," \
  "onnxruntime-node $(version onnxruntime-node), transformers.js $(version @huggingface/transformers)"
