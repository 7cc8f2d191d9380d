"""The continuous-batching engine from Python: Engine (step by step) and LLM
(vLLM-style offline generation).

    engine = pagedattn.Engine(model="tiny", deterministic=True)
    rid = engine.add_request([1, 2, 3], pagedattn.SamplingParams(max_tokens=4))
    for output in engine:              # steps until every request finished
        print(output.request_id, output.samples[0].new_token_ids)

Every call releases the GIL while the C++ engine works; the engine is
internally synchronized, so other threads may add or abort requests while
one thread steps (see Engine's docstring).
"""

from __future__ import annotations

import copy
import numbers
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _core
from ._core import (Error, Model, RequestOutput, SampleOutput, SamplingParams, StopMatcher,
                    StreamingDecoder, TokenLogprobs, UnsupportedError)

Prompt = Union[str, Sequence[int]]
# What LLM.generate takes per prompt: text, token ids, or vLLM's dict forms
# {"prompt": text} (TextPrompt) and {"prompt_token_ids": ids} (TokensPrompt).
PromptInput = Union[str, Sequence[int], Dict[str, Any]]
# LLM.chat: one conversation [{"role", "content"}...] or a list of them.
Conversation = Sequence[Dict[str, str]]

# The end-of-turn control tokens a chat model stops at (besides EOS), as the
# `pagedattn generate` CLI does.
_END_OF_TURN_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>")


def _resolve_model(model, max_position: int = 0, check_tensors: bool = False):
    """A Model, a path to a .gguf file, or a synthetic preset name
    (check_tensors applies to a file; presets' weights are always finite)."""
    if isinstance(model, Model):
        return model, None
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a pagedattn.Model, a .gguf path or a preset name, got {type(model).__name__}")
    name = os.fspath(model)
    if name.endswith(".gguf") or os.path.isfile(name):
        return Model.from_gguf(name, max_position, check_tensors), _core.load_gguf_tokenizer(name)
    return Model.preset(name), None


def stop_token_ids(tokenizer) -> List[int]:
    """EOS and every end-of-turn control token of the tokenizer's vocabulary."""
    ids = [tokenizer.eos_id] if tokenizer.eos_id >= 0 else []
    for text in _END_OF_TURN_TOKENS:
        token = tokenizer.token_id(text)
        if token >= 0 and tokenizer.is_control(token) and token not in ids:
            ids.append(token)
    return ids


class Engine:
    """Continuous batching over one paged KV cache (include/pagedattn/engine.h).

    Engine(model, *, kv_memory_bytes=256 MiB, page_size=16, kv_dtype="float16",
           max_num_seqs=256, max_num_batched_tokens=2048, chunked_prefill=True,
           deterministic=False, seed=0, max_position=0, tokenizer=None,
           enable_prefix_caching=False, host_kv_memory_bytes=0, bf16_products=False,
           int8_products=False, f16_products=False, int8_activations=False,
           exact_products=False, pin_threads=False, check_tensors=False,
           parse_special_tokens=True)

    model: a pagedattn.Model, a path to a Llama-family .gguf file (its
    tokenizer comes with it) or a synthetic preset name ("tiny", "small",
    "1b"). deterministic: a request's tokens do not depend on what is batched
    with it (fixed KV chunks and row blocks). max_position caps a GGUF model's
    context (0: the file's). enable_prefix_caching: prompts that start with a
    cached prefix (full pages of earlier requests with the same
    SamplingParams.cache_salt) take its K/V instead of computing it;
    host_kv_memory_bytes: a host-memory tier preempted requests are swapped
    to (0: preemption recomputes). docs/prefix_caching.md. bf16_products:
    attention, and the weight products of batches of more than 8
    rows, on bf16 dot products where the CPU has AVX512-BF16 (faster;
    queries, softmax weights, f16 K/V, activations and dequantised weights
    rounded to bf16; ignored in deterministic mode). int8_products: int8 KV decode on AVX512-VNNI dot
    products (kv_dtype="int8"; queries and softmax weights rounded to 8 bits).
    f16_products: fp8 e4m3 and float16 KV decode on AVX512-FP16
    multiply-adds where the CPU has them (queries and softmax weights rounded
    to f16, short f16 sums; under 1% of a row's largest output).
    exact_products: f32 products in every step. By default three fast paths
    are taken where a one-time timing finds them faster on this CPU:
    prefill attention over float16, bfloat16 and int8 K/V on bf16 products
    (queries, softmax weights and float16 K/V rounded to bf16; decode keeps
    f32), fp8 KV attention on bf16 or f16 products (their rounding is below
    the fp8 values' own; docs/design.md, "Product paths" states both
    bounds), and int8 activations in the model products of steps that
    decode at least 8 sequences (16 or 32 where the timing says so) and
    compute no prompt token (see int8_activations; a request alone, and
    every prompt, keeps f32 weight products; docs/models.md). Deterministic
    mode keeps f32.
    pin_threads: bind the OpenMP threads of the thread that calls step(),
    one each, to the CPUs the process may run on, at the first step (for a
    machine or cpuset the engine has to itself; docs/engine.md, "Threads").
    int8_activations: a GGUF model's quantised weights take the activations
    rounded to int8 per 32 values, as llama.cpp, on integer dot products, in
    every step, prompts too (batches of more than 8 rows on the int8 tiles:
    AVX512-VNNI, AVX-VNNI or AVX2; faster decode and prefill; logits move:
    top-1 agreement ~0.9 with f32 on SmolLM2-135M, docs/models.md; ignored in
    deterministic mode).
    check_tensors: with a .gguf path, scan every weight for NaN / Inf before
    loading (one more pass over the weights) and raise InvalidArgumentError
    naming the tensor and its first bad element. parse_special_tokens: in
    text prompts, control-token text such as "<|im_start|>" becomes that
    token, as vLLM and Hugging Face tokenizers do; False keeps it plain text
    (for untrusted text; chat messages never parse it, see LLM.chat).

    Non-finite logits (broken weights) end only the request they occur in:
    its samples finish with finish_reason "error" and its RequestOutput's
    error names the request, engine step and the NaN / Inf count.

    Threads: add_request never waits for a running step; step() calls take
    turns; abort, has_unfinished, stats and set_stream_callback wait for a
    running step. The GIL is released while the engine works. A stream
    callback runs on the stepping thread (with the GIL) for every
    RequestOutput as the step produces it; an exception it raises is raised
    by that step() (the step itself completed).
    """

    def __init__(self, model, *, kv_memory_bytes: int = 256 << 20, page_size: int = 16,
                 kv_dtype: str = "float16", max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, chunked_prefill: bool = True,
                 deterministic: bool = False, seed: int = 0, max_position: int = 0,
                 tokenizer=None, enable_prefix_caching: bool = False,
                 host_kv_memory_bytes: int = 0, bf16_products: bool = False,
                 int8_products: bool = False, f16_products: bool = False,
                 int8_activations: bool = False, exact_products: bool = False,
                 pin_threads: bool = False,
                 check_tensors: bool = False,
                 parse_special_tokens: bool = True):
        self.model, own_tokenizer = _resolve_model(model, max_position, check_tensors)
        self.tokenizer = tokenizer if tokenizer is not None else own_tokenizer
        self.parse_special_tokens = parse_special_tokens
        self._engine = _core.Engine(
            self.model, kv_memory_bytes=kv_memory_bytes, page_size=page_size, kv_dtype=kv_dtype,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            chunked_prefill=chunked_prefill, deterministic=deterministic, seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            host_kv_memory_bytes=host_kv_memory_bytes, bf16_products=bf16_products,
            int8_products=int8_products, f16_products=f16_products,
            int8_activations=int8_activations, exact_products=exact_products,
            pin_threads=pin_threads)

    def encode(self, prompt: Prompt) -> List[int]:
        """Token ids of a prompt: a list of ids as given, text through the
        tokenizer (control-token text parsed unless parse_special_tokens=False)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("Engine.add_request: a text prompt needs a tokenizer "
                                 "(a GGUF model or tokenizer=...); pass token ids instead")
            return self.tokenizer.encode(prompt, parse_special=self.parse_special_tokens)
        return list(prompt)

    def add_request(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> int:
        """Queues a request (token ids or text) and returns its id."""
        return self._engine.add_request(self.encode(prompt), params if params is not None else SamplingParams())

    def step(self) -> List[RequestOutput]:
        """Runs one iteration; returns the requests with new tokens or a finish."""
        return self._engine.step()

    def abort(self, request_id: int) -> None:
        """Stops a request; the next step reports it with finish_reason "abort"."""
        self._engine.abort(request_id)

    def has_unfinished(self) -> bool:
        """Whether some request is waiting or running."""
        return self._engine.has_unfinished()

    def stats(self) -> "_core.EngineStats":
        """Counters and the KV picture after the last step."""
        return self._engine.stats()

    def set_stream_callback(self, callback: Optional[Callable[[RequestOutput], None]]) -> None:
        """Calls callback(output) for every RequestOutput as a step produces it (None: stop)."""
        self._engine.set_stream_callback(callback)

    def __iter__(self) -> Iterator[RequestOutput]:
        """Streams: steps until no request is unfinished, yielding every RequestOutput."""
        while self.has_unfinished():
            yield from self.step()


@dataclass
class Logprob:
    """A token's log-probability in vLLM's shape (vllm.logprobs.Logprob): the
    natural log under the model's raw distribution (its logits before bias,
    penalties and temperature), the token's rank among all tokens (1: the
    most likely) and its text (None without a tokenizer)."""

    logprob: float
    rank: Optional[int]
    decoded_token: Optional[str]


# Per position: {token id: Logprob} of the chosen token and the most likely ones.
PositionLogprobs = Dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One sample of a finished request (vLLM's CompletionOutput).

    text: the sample's text (None without a tokenizer); it ends before the
    stop string that ended it unless include_stop_str_in_output, and never
    shows stop_token_ids. finish_reason: "length", "stop", "abort" or "error"
    (error then says why). logprobs: with SamplingParams.logprobs, one dict
    per token of token_ids; cumulative_logprob their sum (else both None).
    stop_reason: the stop string, or the id of the SamplingParams.stop_token_ids
    token, that ended the sample (None for EOS and other reasons)."""

    index: int
    token_ids: List[int]
    text: Optional[str]
    finish_reason: Optional[str]
    error: Optional[str]  # with finish_reason "error": why (see RequestOutput.error); else None
    logprobs: Optional[List[PositionLogprobs]]
    cumulative_logprob: Optional[float]
    stop_reason: Union[int, str, None]


@dataclass
class GenerationOutput:
    """A finished request (vLLM's RequestOutput): its prompt and its samples.
    prompt_logprobs: with SamplingParams.prompt_logprobs, [None, then a dict per
    prompt token from the second on] (vLLM's shape); else None."""

    request_id: int
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[List[Optional[PositionLogprobs]]]
    outputs: List[CompletionOutput] = field(default_factory=list)


class GenerationError(Error, RuntimeError):
    """LLM.generate: the model's logits for some request were NaN or Inf (broken
    weights), so that request ended with finish_reason "error" instead of a
    token. The message gives each failed request's reason; `outputs` holds
    the whole call's results (the other requests finished normally)."""

    def __init__(self, message: str, outputs: List["GenerationOutput"]):
        super().__init__(message)
        self.outputs = outputs


class _Sample:
    """One sample's tokens and raw TokenLogprobs so far, its text (through a
    StreamingDecoder and the request's StopMatcher) and how it ended. After a
    stop string matched, later tokens are dropped (vLLM keeps the token that
    completed the stop string and nothing after it)."""

    __slots__ = ("token_ids", "logprobs", "finish_reason", "stop_reason", "text", "decoder",
                 "matcher")

    def __init__(self, tokenizer, stops: List[str], keep_stop: bool):
        self.token_ids: List[int] = []
        self.logprobs: List[TokenLogprobs] = []
        self.finish_reason: Optional[str] = None
        self.stop_reason: Union[int, str, None] = None
        self.text = b""
        self.decoder = None if tokenizer is None else StreamingDecoder(tokenizer, render_special=False)
        self.matcher = None if tokenizer is None else StopMatcher(stops, keep_stop)

    def absorb(self, output: SampleOutput, request: "_Request") -> None:
        if self.finish_reason is not None:
            return  # ended by a stop string; the engine may still run it
        logprobs = output.logprobs if request.params.logprobs is not None else []
        for i, token in enumerate(output.new_token_ids):
            self.token_ids.append(token)
            if i < len(logprobs):
                self.logprobs.append(logprobs[i])
            if self.decoder is not None and token not in request.hidden_tokens:
                if self._feed(self.decoder.push(token)):
                    return
        if output.finish_reason is not None:
            if self.decoder is not None and not self._feed(self.decoder.flush()):
                self.text += self.matcher.finish()
            if self.finish_reason is None:
                self.finish_reason = output.finish_reason
                last = self.token_ids[-1] if self.token_ids else None
                if output.finish_reason == "stop" and last in request.user_stop_token_ids:
                    self.stop_reason = last

    def _feed(self, chunk: bytes) -> bool:
        """Adds decoded text; True (and the sample ends) when a stop string matched."""
        result = self.matcher.feed(chunk)
        self.text += result.text
        if not result.stopped:
            return False
        self.finish_reason = "stop"
        self.stop_reason = result.matched.decode("utf-8", errors="replace")
        return True


class _Request:
    """One request of an LLM.generate call: the params it runs with, the
    tokens whose text is not shown (its stop_token_ids, unless
    include_stop_str_in_output), its samples and its prompt logprobs."""

    __slots__ = ("params", "hidden_tokens", "user_stop_token_ids", "samples", "prompt_logprobs",
                 "tokenizer", "aborted")

    def __init__(self, params: SamplingParams, user_params: Optional[SamplingParams], tokenizer):
        self.params = params
        self.hidden_tokens = (frozenset() if params.include_stop_str_in_output
                              else frozenset(params.stop_token_ids))
        self.user_stop_token_ids = frozenset(user_params.stop_token_ids if user_params else ())
        self.tokenizer = tokenizer
        self.samples: Dict[int, _Sample] = {}
        self.prompt_logprobs: List[TokenLogprobs] = []
        self.aborted = False  # every sample met a stop string: the engine was told to stop

    def sample(self, index: int) -> _Sample:
        if index not in self.samples:
            self.samples[index] = _Sample(self.tokenizer, list(self.params.stop),
                                          self.params.include_stop_str_in_output)
        return self.samples[index]

    def all_samples_ended(self) -> bool:
        return (len(self.samples) == self.params.n and
                all(s.finish_reason is not None for s in self.samples.values()))


class _Call:
    """One LLM.generate call's requests ({request id: _Request}), the requests
    not finished yet, the error that ended the call in another thread, the
    engine's reasons for requests it failed ({request id: message}) and its
    progress bar (updated by the call's own thread)."""

    __slots__ = ("requests", "unfinished", "error", "failed", "progress", "reported")

    def __init__(self, progress=None):
        self.requests: Dict[int, _Request] = {}
        self.unfinished: set = set()
        self.error: Optional[BaseException] = None
        self.failed: Dict[int, str] = {}
        self.progress = progress
        self.reported = 0  # finished requests shown on the progress bar

    def report_progress(self) -> None:
        if self.progress is not None:
            done = len(self.requests) - len(self.unfinished)
            if done > self.reported:
                self.progress.update(done - self.reported)
                self.reported = done


def _progress_bar(use_tqdm: Union[bool, Callable[..., Any]], total: int):
    """A tqdm bar over `total` requests (vLLM's "Processed prompts"), or None:
    use_tqdm False, a single prompt, or tqdm not installed. A callable
    use_tqdm is used in tqdm's place."""
    if not use_tqdm or total <= 1:
        return None
    factory = use_tqdm
    if not callable(factory):
        try:
            from tqdm import tqdm as factory  # optional: no bar without it
        except ImportError:
            return None
    return factory(total=total, desc="Processed prompts", dynamic_ncols=True)


def _tensor_parallel_error(tensor_parallel_size: int) -> Exception:
    if not isinstance(tensor_parallel_size, numbers.Integral) or tensor_parallel_size < 1:
        return ValueError(f"LLM: tensor_parallel_size = {tensor_parallel_size!r} must be an int >= 1")
    return UnsupportedError(
        f"LLM: tensor_parallel_size = {tensor_parallel_size}: the Python LLM runs in one process. "
        f"Tensor parallelism runs the C++ engine over MPI ranks, one per shard: "
        f"`mpirun -np {tensor_parallel_size} pagedattn generate --model MODEL.gguf --prompt ... "
        f"--tensor-parallel {tensor_parallel_size}` (or `serve` for the OpenAI server and query it "
        f"over HTTP); see docs/tensor_parallel.md")


class LLM:
    """vLLM-style offline generation (vllm.LLM).

    LLM(model, *, kv_memory_bytes=256 MiB, deterministic=True, seed=0,
        tensor_parallel_size=1, parse_special_tokens=True, **engine_options)

    model: a .gguf path (with its tokenizer and chat template) or a preset
    name (prompts are then token ids and outputs have text None).
    generate(prompts, sampling_params, use_tqdm=True) runs the prompts (text,
    token ids, {"prompt": text} or {"prompt_token_ids": ids}) as one batch and
    returns a GenerationOutput per prompt, in order. Without explicit
    stop_token_ids a GGUF model stops at EOS and its end-of-turn tokens, like
    the `pagedattn generate` CLI. SamplingParams.stop strings end a sample
    where its text contains one (finish_reason "stop"); once every sample of
    a request has, the request is aborted in the engine. With
    SamplingParams.logprobs / prompt_logprobs the outputs carry vLLM's
    {token id: Logprob} dicts. use_tqdm shows a progress bar over the
    requests when tqdm is installed and there is more than one prompt.
    tensor_parallel_size > 1 is refused (UnsupportedError naming the mpirun
    command of the C++ engine); parse_special_tokens: see Engine.

    Threads: generate and chat may be called from several threads at once.
    Their requests share the engine's batches; one thread at a time steps the
    engine and hands every output to the call that added its request, so each
    call returns exactly its own results (with deterministic=True, the same
    tokens as alone). A call that raises (a refused prompt or parameter, an
    exception such as KeyboardInterrupt while it waits) aborts its requests
    and leaves none behind; the next call works. If a step raises, its outputs
    are lost: that step's thread raises its exception and every other call
    waiting at that moment raises RuntimeError (never a truncated result).
    A request whose logits are NaN or Inf (broken weights) ends with
    finish_reason "error"; once every request of the call has finished,
    generate raises GenerationError naming it (its `outputs` hold every
    result, the others complete). Load with check_tensors=True to refuse such
    a model up front.
    Do not step or iterate llm.engine yourself while generate runs (those
    outputs would not reach their calls); requests added to llm.engine
    directly are stepped along and their outputs dropped.
    """

    def __init__(self, model, *, kv_memory_bytes: int = 256 << 20, deterministic: bool = True,
                 seed: int = 0, tensor_parallel_size: int = 1, parse_special_tokens: bool = True,
                 **engine_options):
        if tensor_parallel_size != 1 or isinstance(tensor_parallel_size, bool):
            raise _tensor_parallel_error(tensor_parallel_size)
        self.engine = Engine(model, kv_memory_bytes=kv_memory_bytes, deterministic=deterministic,
                             seed=seed, parse_special_tokens=parse_special_tokens,
                             **engine_options)
        self.tokenizer = self.engine.tokenizer
        self._model_path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        # Guards _owners, _stepping and every _Call; notified after each step.
        self._cond = threading.Condition()
        self._owners: Dict[int, _Call] = {}  # unfinished request id -> its call
        self._stepping = False  # a thread is stepping the engine
        self._delivered = 0  # steps handed out (_deliver calls)

    def get_tokenizer(self) -> Optional["_core.Tokenizer"]:
        """The model's Tokenizer (None for a preset), as vLLM's LLM.get_tokenizer."""
        return self.tokenizer

    def _params(self, params: Optional[SamplingParams]) -> SamplingParams:
        """The params a request runs with: a GGUF model's end-of-turn tokens
        added as stop_token_ids when none are given (on a copy: every other
        field stays as given)."""
        params = params if params is not None else SamplingParams()
        if params.stop and self.tokenizer is None:
            raise ValueError("LLM.generate: SamplingParams.stop needs text, and a preset model "
                             "has no tokenizer (use stop_token_ids)")
        if self.tokenizer is not None and not params.stop_token_ids and not params.ignore_eos:
            params = copy.copy(params)
            params.stop_token_ids = stop_token_ids(self.tokenizer)
        return params

    def _prompt(self, prompt: PromptInput, index: int) -> Tuple[Optional[str], List[int]]:
        """(text or None, token ids) of one prompt of generate."""
        if isinstance(prompt, dict):
            unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
            if unknown:
                raise ValueError(f"LLM.generate: prompts[{index}] has keys {unknown}; supported: "
                                 "{'prompt': text} or {'prompt_token_ids': ids}")
            if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
                raise ValueError(f"LLM.generate: prompts[{index}] needs exactly one of 'prompt' "
                                 "and 'prompt_token_ids'")
            if "prompt" in prompt:
                text = prompt["prompt"]
                if not isinstance(text, str):
                    raise TypeError(f"LLM.generate: prompts[{index}]['prompt'] must be a str, "
                                    f"not {type(text).__name__}")
                return text, self.engine.encode(text)
            return None, self.engine.encode(prompt["prompt_token_ids"])
        return (prompt if isinstance(prompt, str) else None), self.engine.encode(prompt)

    def _text(self, sample: _Sample) -> Optional[str]:
        if self.tokenizer is None:
            return None
        return sample.text.decode("utf-8", errors="replace")

    def _piece(self, token: int) -> Optional[str]:
        if self.tokenizer is None:
            return None
        return self.tokenizer.token_to_piece(token).decode("utf-8", errors="replace")

    def _logprob_dict(self, entry: TokenLogprobs) -> PositionLogprobs:
        """vLLM's {token id: Logprob} of one position: the chosen token with its
        rank, then the most likely tokens ranked 1, 2, ... in order."""
        result = {entry.token: Logprob(entry.logprob, entry.rank, self._piece(entry.token))}
        for rank, (token, logprob) in enumerate(entry.top, start=1):
            result[token] = Logprob(logprob, rank, self._piece(token))
        return result

    def _completion(self, index: int, sample: _Sample, request: _Request,
                    error: Optional[str]) -> CompletionOutput:
        logprobs = cumulative = None
        if request.params.logprobs is not None:
            logprobs = [self._logprob_dict(entry) for entry in sample.logprobs]
            cumulative = float(sum(entry.logprob for entry in sample.logprobs))
        reason = sample.finish_reason
        return CompletionOutput(index, list(sample.token_ids), self._text(sample), reason,
                                error if reason == "error" else None, logprobs, cumulative,
                                sample.stop_reason)

    def generate(self, prompts: Union[PromptInput, Sequence[PromptInput]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: Union[bool, Callable[..., Any]] = True) -> List[GenerationOutput]:
        """Generates for every prompt (text, token ids, {"prompt": text} or
        {"prompt_token_ids": ids}; one prompt or a list) with one SamplingParams
        or one per prompt. use_tqdm: a progress bar over the requests (tqdm, if
        installed, for more than one prompt). Safe to call from several threads
        at once (see LLM)."""
        single = isinstance(prompts, (str, dict)) or (
            len(prompts) > 0 and isinstance(prompts[0], numbers.Integral))
        prompt_list = [prompts] if single else list(prompts)  # type: ignore[list-item, arg-type]
        parsed = [self._prompt(prompt, i) for i, prompt in enumerate(prompt_list)]
        return self._run([text for text, _ in parsed], [ids for _, ids in parsed],
                         sampling_params, use_tqdm)

    def _run(self, texts: List[Optional[str]], ids_list: List[List[int]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None],
             use_tqdm: Union[bool, Callable[..., Any]]) -> List[GenerationOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            user_params = [sampling_params] * len(ids_list)
        else:
            user_params = list(sampling_params)
            if len(user_params) != len(ids_list):
                raise ValueError(f"LLM.generate: {len(user_params)} sampling_params for "
                                 f"{len(ids_list)} prompts")
        # Everything checkable here is checked before a request is queued.
        params_list = [self._params(params) for params in user_params]
        call = _Call(_progress_bar(use_tqdm, len(ids_list)))
        request_ids = []
        try:
            for ids, params, user in zip(ids_list, params_list, user_params):
                # Under the lock: no step's outputs for rid are handed out
                # before rid is registered as this call's.
                with self._cond:
                    rid = self.engine.add_request(ids, params)
                    self._owners[rid] = call
                    call.unfinished.add(rid)
                    call.requests[rid] = _Request(params, user, self.tokenizer)
                request_ids.append(rid)
            self._drive(call)
        except BaseException:
            self._abandon(call)
            raise
        finally:
            if call.progress is not None:
                call.progress.close()
        results = [self._result(rid, call, text, ids)
                   for rid, text, ids in zip(request_ids, texts, ids_list)]
        if call.failed:
            raise GenerationError("LLM.generate: " + "; ".join(call.failed.values()), results)
        return results

    def _result(self, rid: int, call: _Call, text: Optional[str],
                ids: List[int]) -> GenerationOutput:
        request = call.requests[rid]
        prompt_logprobs = None
        if request.params.prompt_logprobs is not None:
            prompt_logprobs = [None] + [self._logprob_dict(e) for e in request.prompt_logprobs]
        result = GenerationOutput(rid, text, ids, prompt_logprobs)
        error = call.failed.get(rid)
        for index in sorted(request.samples):
            result.outputs.append(self._completion(index, request.samples[index], request, error))
        return result

    def _drive(self, call: _Call, raise_error: bool = True) -> None:
        """Returns once every request of call finished: steps the engine while
        no other thread does, else waits for the stepping thread's outputs."""
        while True:
            stepping = False
            outputs: Optional[List[RequestOutput]] = None
            failure: Optional[BaseException] = None
            try:
                with self._cond:
                    while True:
                        call.report_progress()
                        if raise_error and call.error is not None:
                            raise call.error
                        if not call.unfinished:
                            return
                        if not self._stepping:
                            self._stepping = stepping = True
                            break
                        self._cond.wait()
                outputs = self.engine.step()
            except BaseException as e:
                failure = e
                raise
            finally:
                if stepping:
                    with self._cond:
                        self._stepping = False
                        try:
                            self._deliver(outputs, call, failure)
                        except BaseException as e:  # an interrupt: some outputs went nowhere
                            self._deliver(None, call, e)
                            raise
                        finally:
                            self._cond.notify_all()

    def _deliver(self, outputs: Optional[List[RequestOutput]], stepper: _Call,
                 failure: Optional[BaseException]) -> None:
        """Hands a step's outputs to their calls (self._cond held). outputs None:
        the step raised (or was interrupted) and its outputs are lost."""
        self._delivered += 1
        if outputs is None:
            for call in set(self._owners.values()):
                if call is not stepper and call.error is None:
                    call.error = RuntimeError(
                        "LLM.generate: a step of the engine raised in another thread "
                        f"({failure!r}); this call's outputs are incomplete")
                    call.error.__cause__ = failure
            return
        for output in outputs:
            call = self._owners.get(output.request_id)
            if call is None:
                continue  # not added by generate, or abandoned
            request = call.requests[output.request_id]
            if output.error is not None:
                call.failed[output.request_id] = output.error
            prompt_logprobs = output.prompt_logprobs
            if prompt_logprobs:
                request.prompt_logprobs = prompt_logprobs
            for sample in output.samples:
                request.sample(sample.index).absorb(sample, request)
            if output.finished:
                del self._owners[output.request_id]
                call.unfinished.discard(output.request_id)
            elif not request.aborted and request.all_samples_ended():
                # Every sample met a stop string: the engine need not go on.
                # Its abort is reported by the next step, which finishes the request.
                request.aborted = True
                try:
                    self.engine.abort(output.request_id)
                except Error:  # noqa: BLE001 - it ended on its own meanwhile
                    pass
        # Requests registered under this lock that the engine no longer has
        # ended without their last output reaching us (llm.engine stepped
        # elsewhere): fail their calls rather than step forever.
        if self._owners and not self.engine.has_unfinished():
            for rid, call in list(self._owners.items()):
                if call.error is None:
                    call.error = RuntimeError(
                        f"LLM.generate: request {rid} ended without its outputs reaching "
                        "generate (was llm.engine stepped directly?)")
                call.unfinished.discard(rid)
                del self._owners[rid]

    def _abandon(self, call: _Call) -> None:
        """After an exception in generate: aborts call's unfinished requests and
        steps until the engine has reported them, so none is left behind."""
        try:
            with self._cond:
                left = list(call.unfinished)
            ended = []  # no longer in the engine: finished, or its last output was lost
            for rid in left:
                try:
                    self.engine.abort(rid)  # reported by the next step
                except Exception:  # noqa: BLE001 - not waiting or running
                    ended.append(rid)
            if ended:
                with self._cond:
                    # The step that ended them has been delivered once the step
                    # running now (if any) has been; what is still missing is lost.
                    delivered = self._delivered
                    while self._stepping and self._delivered == delivered:
                        self._cond.wait()
                    for rid in ended:
                        if rid in call.unfinished:
                            call.unfinished.discard(rid)
                            self._owners.pop(rid, None)
            self._drive(call, raise_error=False)
        except Exception:  # noqa: BLE001 - the exception being handled is raised
            pass
        finally:
            with self._cond:
                for rid in call.unfinished:
                    self._owners.pop(rid, None)
                call.unfinished.clear()

    def chat(self, messages: Union[Conversation, Sequence[Conversation]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: Union[bool, Callable[..., Any]] = True) -> List[GenerationOutput]:
        """Generates the assistant's reply to one conversation ([{"role",
        "content"}...]) or to each of a list of them, rendered with the GGUF
        file's chat template; returns a list with one GenerationOutput per
        conversation (vLLM's LLM.chat), whose prompt is the rendered text.
        Special-token text inside a message (e.g. "<|im_end|>") is tokenized
        as plain text, whatever parse_special_tokens says."""
        if self._model_path is None or self.tokenizer is None:
            raise ValueError("LLM.chat needs a GGUF model (its chat template)")
        if isinstance(messages, dict) or len(messages) == 0:
            raise ValueError("LLM.chat: messages must be a conversation [{'role', 'content'}...] "
                             "or a list of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        template = _core.load_gguf_chat_template(self._model_path, self.tokenizer)
        # Message text stays plain text: a message cannot forge control tokens.
        ids_list = [template.encode(self.tokenizer, list(c), add_generation_prompt=True)
                    for c in conversations]
        texts = [template.render(list(c), add_generation_prompt=True) for c in conversations]
        return self._run(texts, ids_list, sampling_params, use_tqdm)
