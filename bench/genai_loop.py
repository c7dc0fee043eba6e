"""onnxruntime-genai's own generate loop on one model folder: greedy tokens, and (``--contexts``) its speed.

The one place this project drives onnxruntime-genai (tests/test_genai_generate.py runs it for tokens,
bench/gpu_evidence.py for tokens/s). ``mode`` says which execution provider and options the folder's genai_config is
run with (onnxruntime-genai's config override: ``og.Config``, ``clear_providers``, ``append_provider``,
``set_provider_option``):

* ``cpu``     - the CPU EP;
* ``webgpu0`` - WebGPU with the folder's own provider options and ``enableGraphCapture=0`` (the original as users
  have it: a graph that cannot be captured runs without);
* ``webgpu1`` - WebGPU with the folder's options and ``enableGraphCapture=1``;
* ``config``  - the folder's genai_config.json as it is (what ``optimize`` wrote).

Greedy search (``do_sample=False``), a fixed prompt (``(7 i + 11) mod 400 + 4``), ``max_length`` = prompt + new.
With ``--contexts 128,1024`` each prompt length gets a warm-up generator (shaders compiled, capture made) and then a
timed one: prefill seconds (``append_tokens``: the prompt in one call) and every decode step's seconds
(``generate_next_token``). Prints one line ``RESULT <json>``; run it in a child process (a crash in onnxruntime-genai
is then a failed run, not a dead parent).

    python bench/genai_loop.py FOLDER MODE --prompt 6 --new 40            # tokens only
    python bench/genai_loop.py FOLDER webgpu0 --contexts 128,1024 --new 32  # timed
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("cpu", "webgpu0", "webgpu1", "config")


def prompt_tokens(n: int) -> list[int]:
    return [(7 * i + 11) % 400 + 4 for i in range(n)]


def load_model(folder: str | Path, mode: str):
    import onnxruntime_genai as og

    if mode not in MODES:
        raise ValueError(f"genai_loop: mode {mode!r} is not one of {MODES}")
    config = og.Config(str(folder))
    if mode == "cpu":
        config.clear_providers()
    elif mode in ("webgpu0", "webgpu1"):
        options: dict[str, Any] = {}
        decoder = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["decoder"]
        for entry in decoder.get("session_options", {}).get("provider_options", []):
            options.update(entry.get("webgpu", {}))
        config.clear_providers()
        config.append_provider("webgpu")
        for key, value in {**options, "enableGraphCapture": mode[-1]}.items():
            config.set_provider_option("webgpu", key, str(value))
    return og, og.Model(config)


def generate(og, model, prompt: int, new: int) -> dict[str, Any]:
    """One greedy generation: its tokens, the prefill's seconds and each decode step's seconds."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt + new, min_length=prompt + new, do_sample=False)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt_tokens(prompt))
    prefill_s = time.perf_counter() - start
    steps = []
    while not generator.is_done():
        start = time.perf_counter()
        generator.generate_next_token()
        steps.append(time.perf_counter() - start)
    tokens = [int(t) for t in generator.get_sequence(0)]
    del generator
    return {"prompt": prompt, "new": new, "prefill_s": prefill_s, "decode_s": steps, "tokens": tokens}


def run(folder: str | Path, mode: str, prompts: list[int], new: int, warm: bool) -> dict[str, Any]:
    start = time.perf_counter()
    og, model = load_model(folder, mode)
    load_s = time.perf_counter() - start
    runs = []
    for prompt in prompts:
        if warm:
            generate(og, model, prompt, min(new, 4))
        runs.append(generate(og, model, prompt, new))
    return {"folder": str(folder), "mode": mode, "load_s": load_s, "runs": runs}


def run_child(folder: str | Path, mode: str, prompts: list[int], new: int, warm: bool = False,
              timeout: float = 600, python: str | None = None) -> dict[str, Any]:
    """:func:`run` in a child process. Raises RuntimeError with the child's stderr tail when it gives no result."""
    cmd = [python or sys.executable, str(Path(__file__).resolve()), str(folder), mode,
           "--contexts", ",".join(map(str, prompts)), "--new", str(new)] + (["--warm"] if warm else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{folder} ({mode}): exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(line.split(" ", 1)[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("mode", choices=MODES)
    ap.add_argument("--prompt", type=int, default=6, help="prompt tokens (one generation)")
    ap.add_argument("--contexts", help="comma-separated prompt lengths (one generation each; overrides --prompt)")
    ap.add_argument("--new", type=int, default=40, help="tokens generated after the prompt")
    ap.add_argument("--warm", action="store_true", help="a short warm-up generation before each timed one")
    args = ap.parse_args(argv)
    prompts = [int(x) for x in args.contexts.split(",")] if args.contexts else [args.prompt]
    print("RESULT " + json.dumps(run(args.folder, args.mode, prompts, args.new, args.warm)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
