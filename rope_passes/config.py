"""A typed view of ``genai_config.json``: every read and write of it goes through :class:`GenaiConfig`.

onnxruntime-genai's config is a large, loosely specified JSON document. rope-passes reads a handful of facts from it
(context length, head size, the decoder's graph-input names, the WebGPU provider options and the LongRoPE cache
offset in them) and writes three kinds of things into it (the offset, or its removal where no layer can honour
it; a removed decoder input; our own ``rope_passes.*`` session-option markers). This module is the one place that
knows where those live.

The view wraps the parsed dict without copying it: keys we do not know are kept and written back unchanged, and a
change is made in place and described by a one-line string that the pass puts into its report.

    config = GenaiConfig.load("model_dir/genai_config.json")   # GenaiConfig(None) when there is none
    config.context_length            # 4096 or None
    config.set_provider_option("webgpu", "multiRotaryCacheConcatOffset", "32")   # -> change line or None
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rope_passes.errors import ModelLoadError
from rope_passes.errors import show_value as _show

#: the file name onnxruntime-genai reads beside the model
GENAI_CONFIG = "genai_config.json"
#: the WebGPU provider option onnxruntime reads the LongRoPE concatenated-cache offset from
CONCAT_OFFSET_OPTION = "multiRotaryCacheConcatOffset"
#: the same offset as a plain session config entry (``model.decoder.session_options[...]``): onnxruntime-genai passes
#: session_options strings it does not know to onnxruntime as session config entries, and the WebGPU EP reads its
#: options from those entries (the provider options are stored under this prefix too)
CONCAT_OFFSET_SESSION_ENTRY = "ep.webgpuexecutionprovider." + CONCAT_OFFSET_OPTION
#: the largest offset onnxruntime's WebGPU EP holds (a uint32; the TensorRT-RTX EP's int32 range, the smaller)
MAX_CONCAT_OFFSET = 2**31 - 1
#: ``model.decoder`` fields rope-passes reads as positive integers (the builder writes JSON integers)
DECODER_INT_FIELDS = ("head_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers")
#: the WebGPU provider option that turns graph capture on ("1") or off ("0"; absent: off)
GRAPH_CAPTURE_OPTION = "enableGraphCapture"
#: the provider name onnxruntime-genai's config uses for the WebGPU EP
WEBGPU_PROVIDER = "webgpu"
#: what onnxruntime-genai's builder (0.18) writes for a WebGPU build with ``enable_webgpu_graph=true``
#: (``{"webgpu": {"enableGraphCapture": "1", "validationMode": "disabled"}}``, the corpus's ``*_graph`` folders)
BUILDER_GRAPH_ENTRY = {GRAPH_CAPTURE_OPTION: "1", "validationMode": "disabled"}


def _int(value: Any) -> int | None:
    """A positive int from a JSON value (ints, or strings of ASCII digits as provider options are), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value) or None
    return None


#: the genai_config keys a context length is read from (``model.context_length``, else ``search.max_length``)
CONTEXT_LENGTH_FIELDS = (("model", "context_length"), ("search", "max_length"))
#: the largest context length rope-passes takes (a table row count: onnxruntime's int32 sizes)
MAX_CONTEXT_LENGTH = 2**31 - 1


def _is_provider(name: Any, provider: str) -> bool:
    """Whether a provider_options key names ``provider`` (onnxruntime-genai matches provider names ignoring case)."""
    return isinstance(name, str) and name.lower() == provider.lower()


def parse_concat_offset(value: Any, where: str = CONCAT_OFFSET_OPTION) -> int:
    """The offset a ``multiRotaryCacheConcatOffset`` value sets (0: none), the one parser of it. A JSON integer or a
    decimal-integer string (trailing spaces allowed, leading ones not: onnxruntime-webgpu 1.27 takes ``"32 "`` and
    refuses ``" 32"``, falling back to the CPU EP); an integral float or a string like ``"32.0"`` is the same integer
    (onnxruntime-webgpu 1.27 applies ``"32.0"`` as 32). Anything else (``true``, ``null``, a list, ``"-32"``,
    ``" 32"``, ``"3.2e1"``, past the int32 range): ModelLoadError naming ``where`` and the value, one line."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        text = value.rstrip()
        head, dot, tail = text.partition(".")
        if head.isascii() and head.isdigit() and (not dot or (tail == "" or set(tail) == {"0"})):
            number = int(head)
    if number is None or not 0 <= number <= MAX_CONCAT_OFFSET:
        raise ModelLoadError(f"{where} = {_show(value)}: not an offset (a non-negative integer "
                             f"up to {MAX_CONCAT_OFFSET}, e.g. \"32\")")
    return number


class GenaiConfig:
    """The parsed ``genai_config.json`` of one model (or none: every read is then ``None``, writes are refused)."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data = data if isinstance(data, dict) else None
        self._original = copy.deepcopy(self.data)

    # -- files ---------------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike) -> GenaiConfig:
        """Read ``path`` (a genai_config.json, or a folder holding one); ``GenaiConfig(None)`` when it is absent."""
        p = Path(path)
        if p.is_dir():
            p = p / GENAI_CONFIG
        if not p.is_file():
            return cls(None)
        try:
            data = json.loads(p.read_text())
        except ValueError as exc:
            line = getattr(exc, "lineno", None)
            where = f" ({exc.msg} at line {line})" if hasattr(exc, "msg") and line else ""
            raise ModelLoadError(f"{p}: not valid JSON{where}") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{p}: not a genai_config (the top level is not an object)")
        config = cls(data)
        config.validate(str(p))
        return config

    def validate(self, where: str = GENAI_CONFIG) -> None:
        """ModelLoadError (one line, naming the key) for a config whose parts rope-passes reads or writes have the
        wrong JSON type: ``model`` / ``model.decoder`` / ``session_options`` not objects, ``provider_options`` not
        a list of ``{provider: {options}}`` objects, a decoder size that is not a positive integer, or an offset
        :func:`parse_concat_offset` refuses."""
        if self.data is None:
            return
        model = self.data.get("model")
        if model is not None and not isinstance(model, dict):
            raise ModelLoadError(f"{where}: model is {_show(model)}, not an object")
        for section, key in CONTEXT_LENGTH_FIELDS:
            value = self._section(section).get(key)
            number = _int(value) if value is not None else None
            if value is not None and (number is None or number > MAX_CONTEXT_LENGTH):
                raise ModelLoadError(f"{where}: {section}.{key} is {_show(value)}, not a positive integer "
                                     f"(at most {MAX_CONTEXT_LENGTH})")
        decoder = (model or {}).get("decoder")
        if decoder is None:
            return
        if not isinstance(decoder, dict):
            raise ModelLoadError(f"{where}: model.decoder is {_show(decoder)}, not an object")
        for key in DECODER_INT_FIELDS:
            value = decoder.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ModelLoadError(f"{where}: model.decoder.{key} is {_show(value)}, not a positive integer")
        session = decoder.get("session_options")
        if session is None:
            return
        if not isinstance(session, dict):
            raise ModelLoadError(f"{where}: model.decoder.session_options is {_show(session)}, not an object")
        providers = session.get("provider_options")
        if providers is not None:
            if not isinstance(providers, list):
                raise ModelLoadError(f"{where}: model.decoder.session_options.provider_options is {_show(providers)}, "
                                     "not a list of {provider: {options}} objects")
            for i, entry in enumerate(providers):
                if not isinstance(entry, dict) or not all(isinstance(v, dict) for v in entry.values()):
                    raise ModelLoadError(f"{where}: model.decoder.session_options.provider_options[{i}] is "
                                         f"{_show(entry)}, not a {{provider: {{options}}}} object")
        try:
            self.concat_offset  # noqa: B018 - parsed for its error
        except ModelLoadError as exc:
            raise ModelLoadError(f"{where}: {exc}") from None

    def dumps(self) -> str:
        """The text written to disk (the layout onnxruntime-genai's builder uses: 4-space indent)."""
        return json.dumps(self.data, indent=4) + "\n"

    @property
    def present(self) -> bool:
        return self.data is not None

    @property
    def changed(self) -> bool:
        return self.data != self._original

    def __bool__(self) -> bool:  # ``if ctx.genai_config:`` reads as "the model came with one"
        return self.present

    def __repr__(self) -> str:
        return f"GenaiConfig({'present' if self.present else 'absent'}{', changed' if self.changed else ''})"

    # -- sections ------------------------------------------------------------------------------------------------
    def _section(self, *keys: str) -> dict[str, Any]:
        node: Any = self.data or {}
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    @property
    def _model(self) -> dict[str, Any]:
        """``model`` (read-only use; {} when absent)."""
        return self._section("model")

    @property
    def _decoder(self) -> dict[str, Any]:
        """``model.decoder`` (read-only use; {} when absent)."""
        return self._section("model", "decoder")

    @property
    def has_decoder(self) -> bool:
        """Whether the config has a ``model.decoder`` section (where the passes write their options)."""
        return bool(self._decoder)

    @property
    def decoder_filename(self) -> str | None:
        """``model.decoder.filename``: the decoder model of the folder, or None."""
        name = self._decoder.get("filename")
        return name if isinstance(name, str) and name else None

    # -- facts ---------------------------------------------------------------------------------------------------
    @property
    def context_length_with_source(self) -> tuple[int | None, str | None]:
        """(context length, where it was read): ``model.context_length``, else ``search.max_length``."""
        value = _int(self._model.get("context_length"))
        if value is not None:
            return value, "genai_config model.context_length"
        value = _int(self._section("search").get("max_length"))
        if value is not None:
            return value, "genai_config search.max_length"
        return None, None

    @property
    def context_length(self) -> int | None:
        return self.context_length_with_source[0]

    @property
    def head_size(self) -> int | None:
        """``model.decoder.head_size``, else hidden_size / num_attention_heads."""
        decoder = self._decoder
        value = _int(decoder.get("head_size"))
        if value is not None:
            return value
        hidden, heads = _int(decoder.get("hidden_size")), _int(decoder.get("num_attention_heads"))
        return hidden // heads if hidden and heads else None

    @property
    def original_context_length(self) -> int | None:
        """LongRoPE's original (short-factor) context, where the builder or the user recorded it."""
        decoder = self._decoder
        for source in (decoder, self._model, decoder.get("rope_scaling") or {}):
            for key in ("original_max_position_embeddings", "original_context_length"):
                value = source.get(key) if isinstance(source, dict) else None
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
        return None

    @property
    def decoder_inputs(self) -> dict[str, str]:
        """``model.decoder.inputs``: role (``position_ids``, ``attention_mask``, …) -> graph input name."""
        inputs = self._decoder.get("inputs")
        return {k: v for k, v in inputs.items() if isinstance(v, str)} if isinstance(inputs, dict) else {}

    @property
    def decoder_outputs(self) -> dict[str, str]:
        """``model.decoder.outputs``: role (``logits``, ``present_key_names``, …) -> graph output name (pattern)."""
        outputs = self._decoder.get("outputs")
        return {k: v for k, v in outputs.items() if isinstance(v, str)} if isinstance(outputs, dict) else {}

    def decoder_int(self, field: str) -> int | None:
        """An integer field of ``model.decoder`` (:data:`DECODER_INT_FIELDS`), or None."""
        return _int(self._decoder.get(field))

    def _provider_entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        session = self._decoder.get("session_options")
        providers = session.get("provider_options") if isinstance(session, dict) else None
        for entry in providers if isinstance(providers, list) else []:
            if isinstance(entry, dict):
                for provider, options in entry.items():
                    if isinstance(options, dict):
                        yield provider, options

    def provider_options(self, provider: str = "webgpu") -> dict[str, str]:
        """The decoder's options for ``provider`` as strings (what onnxruntime receives); {} when none."""
        out: dict[str, str] = {}
        for name, options in self._provider_entries():
            if _is_provider(name, provider):
                out.update({k: str(v) for k, v in options.items()})
        return out

    @property
    def concat_offset(self) -> int | None:
        """The ``multiRotaryCacheConcatOffset`` in effect (0 or absent: None): the WebGPU provider options' (the first
        WebGPU entry that sets it; another provider's options never reach the WebGPU EP), else the plain session
        config entry
        ``session_options["ep.webgpuexecutionprovider.multiRotaryCacheConcatOffset"]`` (onnxruntime-genai passes it to
        onnxruntime as the same session config entry). ModelLoadError for a value :func:`parse_concat_offset`
        refuses, or where the two places set different offsets (which one onnxruntime keeps is not ours to guess)."""
        found = [(f".provider_options.{provider}.{CONCAT_OFFSET_OPTION}", options[CONCAT_OFFSET_OPTION])
                 for provider, options in self._provider_entries()
                 if _is_provider(provider, WEBGPU_PROVIDER) and CONCAT_OFFSET_OPTION in options][:1]
        session = self._decoder.get("session_options")
        if isinstance(session, dict) and CONCAT_OFFSET_SESSION_ENTRY in session:
            found.append((f"[{CONCAT_OFFSET_SESSION_ENTRY!r}]", session[CONCAT_OFFSET_SESSION_ENTRY]))
        where = "model.decoder.session_options"
        offsets = [parse_concat_offset(value, f"{where}{key}") for key, value in found]
        if len(set(offsets)) > 1:
            raise ModelLoadError(f"two different offsets: {where}{found[0][0]} = {offsets[0]} and "
                                 f"{where}{found[1][0]} = {offsets[1]}")
        return (offsets[0] or None) if offsets else None

    @property
    def concat_offset_session_entry(self) -> bool:
        """Whether the offset is (also) set as the plain session config entry :data:`CONCAT_OFFSET_SESSION_ENTRY`."""
        session = self._decoder.get("session_options")
        return isinstance(session, dict) and CONCAT_OFFSET_SESSION_ENTRY in session

    @property
    def graph_capture(self) -> bool | None:
        """Whether the WebGPU provider options turn graph capture on: ``enableGraphCapture`` is exactly ``"1"``, the
        one value onnxruntime-genai accepts (``IsGraphCaptureEnabled`` in its ``src/config.cpp`` compares the string
        with ``"1"``; ``"true"`` is off there, and onnxruntime's WebGPU EP refuses it); False: a WebGPU entry without
        it or with another value; None: no WebGPU provider entry (onnxruntime-genai does not use WebGPU). The one
        answer lint, inspect, optimize and check read."""
        if not any(_is_provider(name, WEBGPU_PROVIDER) for name, _ in self._provider_entries()):
            return None
        return self.provider_options(WEBGPU_PROVIDER).get(GRAPH_CAPTURE_OPTION, "0") == "1"

    @property
    def vocab_size(self) -> int | None:
        """``model.vocab_size`` (a positive integer), or None."""
        return _int(self._model.get("vocab_size"))

    @property
    def pad_token_id(self) -> int:
        """``model.pad_token_id`` (the first of a list), the id onnxruntime-genai pads a batch with; 0 when absent."""
        pad = self._model.get("pad_token_id", 0)
        pad = pad[0] if isinstance(pad, list) and pad else pad
        return int(pad) if isinstance(pad, int) and not isinstance(pad, bool) else 0

    @property
    def share_buffer(self) -> bool:
        """``search.past_present_share_buffer`` is ``true``: past and present share one ``max_length`` buffer."""
        return self._section("search").get("past_present_share_buffer") is True

    @property
    def max_length(self) -> int | None:
        """``search.max_length`` (a positive integer), or None."""
        return _int(self._section("search").get("max_length"))

    def session_option(self, key: str) -> Any:
        session = self._decoder.get("session_options")
        return session.get(key) if isinstance(session, dict) else None

    # -- changes (each returns the report line, or None when nothing changed / nowhere to write) ----------------
    def _writable_decoder(self) -> dict[str, Any] | None:
        model = (self.data or {}).get("model")
        decoder = model.get("decoder") if isinstance(model, dict) else None
        return decoder if isinstance(decoder, dict) else None

    def set_provider_option(self, provider: str, key: str, value: str) -> str | None:
        """Set ``model.decoder.session_options.provider_options[{provider: {key: value}}]`` (created if missing; an
        existing entry is found ignoring case, as onnxruntime-genai matches it, and keeps its spelling)."""
        decoder = self._writable_decoder()
        if decoder is None:
            return None
        session = decoder.setdefault("session_options", {})
        providers = session.setdefault("provider_options", []) if isinstance(session, dict) else None
        if not isinstance(providers, list):
            raise ModelLoadError("genai_config.json: model.decoder.session_options.provider_options is not a list "
                                 "(or session_options not an object): cannot write a provider option")
        name, options = next(((k, v) for e in providers if isinstance(e, dict) for k, v in e.items()
                              if _is_provider(k, provider) and isinstance(v, dict)), (provider, None))
        if options is None:
            options = {}
            providers.append({provider: options})
        old = options.get(key)
        if old == value:
            return None
        options[key] = value
        return (f"model.decoder.session_options.provider_options.{name}.{key} = '{value}'"
                + (f" (was {old!r})" if old is not None else ""))

    def set_graph_capture(self, on: bool) -> str | None:
        """Turn WebGPU graph capture on ("1") or off ("0") in the decoder's WebGPU provider options; the report line,
        or None when nothing changed (or there is no config). Turning it on where there is no WebGPU entry adds one
        as onnxruntime-genai's builder writes it for a graph-capture build (:data:`BUILDER_GRAPH_ENTRY`); turning it
        off where there is none changes nothing (absent is off)."""
        if self._writable_decoder() is None:
            return None
        if not on:
            if self.graph_capture is None:
                return None
            return self.set_provider_option(WEBGPU_PROVIDER, GRAPH_CAPTURE_OPTION, "0")
        if self.graph_capture is None:
            lines = [self.set_provider_option(WEBGPU_PROVIDER, k, v) for k, v in BUILDER_GRAPH_ENTRY.items()]
            return "; ".join(line for line in lines if line) + " (new WebGPU provider entry, as the builder writes it)"
        return self.set_provider_option(WEBGPU_PROVIDER, GRAPH_CAPTURE_OPTION, "1")

    def set_session_option(self, key: str, value: str, why: str = "") -> str | None:
        """Set ``model.decoder.session_options[key]`` (our ``rope_passes.*`` markers: onnxruntime ignores them)."""
        decoder = self._writable_decoder()
        if decoder is None:
            return None
        session = decoder.setdefault("session_options", {})
        if not isinstance(session, dict):
            raise ModelLoadError("genai_config.json: model.decoder.session_options is not an object: cannot write "
                                 f"{key!r}")
        if session.get(key) == value:
            return None
        session[key] = value
        return f"model.decoder.session_options[{key!r}] = '{value}'" + (f" ({why})" if why else "")

    def remove_provider_option(self, key: str, why: str = "", provider: str = WEBGPU_PROVIDER) -> list[str]:
        """Remove ``key`` from ``provider``'s options (every entry naming it, ignoring case) in
        ``model.decoder.session_options.provider_options``; another provider's options are not ours to change (a
        provider entry left empty is kept: onnxruntime-genai reads its presence as "use this provider")."""
        changes = []
        for name, options in list(self._provider_entries()):
            if _is_provider(name, provider) and key in options:
                old = options.pop(key)
                changes.append(f"removed model.decoder.session_options.provider_options.{name}.{key} (was "
                               f"{str(old)!r})" + (f": {why}" if why else ""))
        return changes

    def remove_session_option(self, key: str, why: str = "") -> list[str]:
        """Remove ``model.decoder.session_options[key]`` (one of our ``rope_passes.*`` markers)."""
        session = self._decoder.get("session_options")
        if not isinstance(session, dict) or key not in session:
            return []
        del session[key]
        return [f"removed model.decoder.session_options[{key!r}]" + (f" ({why})" if why else "")]

    def drop_decoder_input(self, graph_input: str) -> list[str]:
        """Remove every ``model.decoder.inputs`` entry naming ``graph_input``; the report lines."""
        inputs = self._decoder.get("inputs")
        if not isinstance(inputs, dict):
            return []
        changes = []
        for key in [k for k, v in inputs.items() if v == graph_input]:
            del inputs[key]
            changes.append(f"removed model.decoder.inputs.{key} ({graph_input!r} is no longer a graph input)")
        return changes
