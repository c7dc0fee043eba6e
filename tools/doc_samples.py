"""Write the doc samples that are a command's output from a real run of it (issue 32: docs/inspect.md's sample
had gone stale). ``python tools/doc_samples.py`` rewrites them; tests/test_doc_commands.py checks they are current.

Each sample is a fenced block whose first line is ``$ <command>``; the command runs in the shared genai corpus
(``../shared/corpus/genai``, or ``ROPE_PASSES_SHARED``), its output as a pipe gets it (120 columns), trailing spaces
removed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the docs with samples, and the commands whose output they show
SAMPLES = {"docs/inspect.md": ["rope-passes inspect current/phi3_mini_128k/cpu_fp32 legacy/qwen35/cpu_fp32_text"]}


def _genai() -> Path:
    return Path(os.environ.get("ROPE_PASSES_SHARED", REPO.parent / "shared")) / "corpus" / "genai"


def run(command: str, cwd: Path) -> str:
    """``command``'s output (stdout, then stderr), as a pipe receives it, each line's trailing spaces removed."""
    from rope_passes.cli import main

    out = io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        main(shlex.split(command)[1:])
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())


def _block(command: str) -> re.Pattern[str]:
    return re.compile(r"^```\n\$ " + re.escape(command) + r"\n(.*?)^```", flags=re.S | re.M)


def samples(genai: Path | None = None) -> Iterator[tuple[str, str, str]]:
    """(doc, the sample in it, the output of a run now) for each sample."""
    for doc, commands in SAMPLES.items():
        text = (REPO / doc).read_text(encoding="utf-8")
        for command in commands:
            found = _block(command).search(text)
            assert found is not None, f"{doc}: no sample block for {command!r}"
            yield doc, found.group(1).rstrip("\n"), run(command, genai or _genai())


def write(genai: Path | None = None) -> list[str]:
    """Rewrite every sample from a run now; returns the docs changed."""
    changed = []
    for doc, commands in SAMPLES.items():
        path = REPO / doc
        text = path.read_text(encoding="utf-8")
        new = text
        for command in commands:
            sample = f"```\n$ {command}\n{run(command, genai or _genai())}\n```"
            new = _block(command).sub(lambda _m, text=sample: text, new, count=1)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(doc)
    return changed


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    sys.path.insert(0, str(REPO))
    for doc in write():
        print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
