"""Whether the rewritten model is built for the runtime a check runs it on (issue 26), and the ``optimize`` command
that fits when it is not, in one line.

An output of ``optimize`` for one runtime can rely on a provider option another runtime does not read
(:data:`rope_passes.runtimes.probed.OPTION_PASSES`, what each runtime reads: :meth:`rope_passes.runtimes.probed.ProbedRuntime.reads_option`,
probed): a concatenated LongRoPE cache with ``multiRotaryCacheConcatOffset`` is right on onnxruntime-webgpu and
wrong past the switch in the browser (onnxruntime-web reads no such option). ``check --runtime web`` on such an
output then says what to re-run, instead of a bare "not equivalent".
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rope_passes.runtimes import with_tables
from rope_passes.runtimes.probed import OPTION_PASSES, probed_runtime


def _options(info: Any) -> dict[str, str]:
    return info.genai_config.provider_options("webgpu")


def runtime_fit(original: str | Path, orig: Any, rewritten: Any, runtime: str) -> str | None:
    """One line when ``rewritten`` (a :class:`.models.ModelInfo`) sets a provider option ``runtime`` does not read
    and ``orig`` does not (the rewrite added it): the runtime it was built for and the ``optimize`` command for
    ``runtime``; None when it fits (an option the original sets itself is the original's, not the rewrite's)."""
    target = probed_runtime(runtime)
    options, before = _options(rewritten), _options(orig)
    for option in sorted(set(OPTION_PASSES.values())):
        if option not in options or option in before or target.reads_option(option):
            continue
        built_for = next((r for r in with_tables() if r != runtime and probed_runtime(r).reads_option(option)), None)
        source = shlex.quote(str(original))
        out = shlex.quote(f"{Path(str(original)).name}-{runtime}")
        return (f"the rewritten model is built for {built_for or 'another runtime'} ({option}={options[option]} in "
                f"its genai_config.json, which {target.label} does not read); for {runtime} run: rope-passes "
                f"optimize {source} -o {out} --runtime {runtime}")
    return None


__all__ = ["runtime_fit"]
