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

import numbers
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

from . import _core
from ._core import Error, Model, RequestOutput, SamplingParams

Prompt = Union[str, Sequence[int]]

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
           int8_products=False, f16_products=False, check_tensors=False)

    model: a pagedattn.Model, a path to a Llama-family .gguf file (its
    tokenizer comes with it) or a synthetic preset name ("tiny", "small",
    "1b"). deterministic: a request's tokens do not depend on what is batched
    with it (fixed KV chunks and row blocks). max_position caps a GGUF model's
    context (0: the file's). enable_prefix_caching: prompts that start with a
    cached prefix (full pages of earlier requests with the same
    SamplingParams.cache_salt) take its K/V instead of computing it;
    host_kv_memory_bytes: a host-memory tier preempted requests are swapped
    to (0: preemption recomputes). docs/prefix_caching.md. bf16_products:
    attention on bf16 dot products where the CPU has AVX512-BF16 (faster;
    queries, softmax weights and f16 K/V rounded to bf16; ignored in
    deterministic mode). int8_products: int8 KV decode on AVX512-VNNI dot
    products (kv_dtype="int8"; queries and softmax weights rounded to 8 bits).
    f16_products: fp8 e4m3 and float16 KV decode on AVX512-FP16
    multiply-adds where the CPU has them (queries and softmax weights rounded
    to f16, short f16 sums; under 1% of a row's largest output).
    check_tensors: with a .gguf path, scan every weight for NaN / Inf before
    loading (one more pass over the weights) and raise InvalidArgumentError
    naming the tensor and its first bad element.

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
                 check_tensors: bool = False):
        self.model, own_tokenizer = _resolve_model(model, max_position, check_tensors)
        self.tokenizer = tokenizer if tokenizer is not None else own_tokenizer
        self._engine = _core.Engine(
            self.model, kv_memory_bytes=kv_memory_bytes, page_size=page_size, kv_dtype=kv_dtype,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            chunked_prefill=chunked_prefill, deterministic=deterministic, seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            host_kv_memory_bytes=host_kv_memory_bytes, bf16_products=bf16_products,
            int8_products=int8_products, f16_products=f16_products)

    def encode(self, prompt: Prompt) -> List[int]:
        """Token ids of a prompt: a list of ids as given, text through the tokenizer."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("Engine.add_request: a text prompt needs a tokenizer "
                                 "(a GGUF model or tokenizer=...); pass token ids instead")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def add_request(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> int:
        """Queues a request (token ids or text) and returns its id."""
        return self._engine.add_request(self.encode(prompt), params if params is not None else SamplingParams())

    def step(self) -> List[RequestOutput]:
        """Runs one iteration; returns the requests with new tokens or a finish."""
        return self._engine.step()

    def abort(self, request_id: int) -> None:
        """Stops a request; the next step reports it with finish_reason "aborted"."""
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
class CompletionOutput:
    """One sample of a finished request (vLLM's CompletionOutput)."""

    index: int
    token_ids: List[int]
    text: Optional[str]
    finish_reason: Optional[str]
    error: Optional[str]  # with finish_reason "error": why (see RequestOutput.error); else None


@dataclass
class GenerationOutput:
    """A finished request (vLLM's RequestOutput): its prompt and its samples."""

    request_id: int
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)


class GenerationError(Error, RuntimeError):
    """LLM.generate: the model's logits for some request were NaN or Inf (broken
    weights), so that request ended with finish_reason "error" instead of a
    token. The message gives each failed request's reason; `outputs` holds
    the whole call's results (the other requests finished normally)."""

    def __init__(self, message: str, outputs: List["GenerationOutput"]):
        super().__init__(message)
        self.outputs = outputs


class _Call:
    """One LLM.generate call's requests: the samples received so far
    ({request id: {sample index: [token ids, finish reason]}}), the requests
    not finished yet, the error that ended the call in another thread, and
    the engine's reasons for requests it failed ({request id: message})."""

    __slots__ = ("samples", "unfinished", "error", "failed")

    def __init__(self):
        self.samples: Dict[int, Dict[int, list]] = {}
        self.unfinished: set = set()
        self.error: Optional[BaseException] = None
        self.failed: Dict[int, str] = {}


class LLM:
    """vLLM-style offline generation.

    LLM(model, *, kv_memory_bytes=256 MiB, deterministic=True, seed=0, **engine_options)

    model: a .gguf path (with its tokenizer and chat template) or a preset
    name (prompts are then token ids and outputs have text None).
    generate(prompts, sampling_params) runs the prompts as one batch and
    returns a GenerationOutput per prompt, in order. Without explicit
    stop_token_ids a GGUF model stops at EOS and its end-of-turn tokens, like
    the `pagedattn generate` CLI.

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
                 seed: int = 0, **engine_options):
        self.engine = Engine(model, kv_memory_bytes=kv_memory_bytes, deterministic=deterministic,
                             seed=seed, **engine_options)
        self.tokenizer = self.engine.tokenizer
        self._model_path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        # Guards _owners, _stepping and every _Call; notified after each step.
        self._cond = threading.Condition()
        self._owners: Dict[int, _Call] = {}  # unfinished request id -> its call
        self._stepping = False  # a thread is stepping the engine
        self._delivered = 0  # steps handed out (_deliver calls)

    def _params(self, params: Optional[SamplingParams]) -> SamplingParams:
        params = params if params is not None else SamplingParams()
        if self.tokenizer is not None and not params.stop_token_ids and not params.ignore_eos:
            params = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                    top_k=params.top_k, top_p=params.top_p, n=params.n,
                                    seed=params.seed, stop_token_ids=stop_token_ids(self.tokenizer),
                                    cache_salt=params.cache_salt)
        return params

    def _text(self, ids: List[int]) -> Optional[str]:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, render_special=False).decode("utf-8", errors="replace")

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None
                 ) -> List[GenerationOutput]:
        """Generates for every prompt (text or token ids; one prompt or a list).
        Safe to call from several threads at once (see LLM)."""
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], numbers.Integral))
        prompt_list: List[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item, arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"LLM.generate: {len(params_list)} sampling_params for {len(prompt_list)} prompts")
        # Everything checkable here is checked before a request is queued.
        ids_list = [self.engine.encode(prompt) for prompt in prompt_list]
        params_list = [self._params(params) for params in params_list]
        results: List[GenerationOutput] = []
        call = _Call()
        try:
            for prompt, ids, params in zip(prompt_list, ids_list, params_list):
                # Under the lock: no step's outputs for rid are handed out
                # before rid is registered as this call's.
                with self._cond:
                    rid = self.engine.add_request(ids, params)
                    self._owners[rid] = call
                    call.unfinished.add(rid)
                    call.samples[rid] = {}
                results.append(GenerationOutput(rid, prompt if isinstance(prompt, str) else None, ids))
            self._drive(call)
        except BaseException:
            self._abandon(call)
            raise
        for result in results:
            samples = call.samples[result.request_id]
            error = call.failed.get(result.request_id)
            for index in sorted(samples):
                ids, reason = samples[index]
                result.outputs.append(CompletionOutput(index, ids, self._text(ids), reason,
                                                       error if reason == "error" else None))
        if call.failed:
            raise GenerationError("LLM.generate: " + "; ".join(call.failed.values()), results)
        return results

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
            samples = call.samples[output.request_id]
            if output.error is not None:
                call.failed[output.request_id] = output.error
            for sample in output.samples:
                done = samples.setdefault(sample.index, [[], None])
                done[0].extend(sample.new_token_ids)
                if sample.finish_reason is not None:
                    done[1] = sample.finish_reason
            if output.finished:
                del self._owners[output.request_id]
                call.unfinished.discard(output.request_id)
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

    def chat(self, messages, sampling_params: Optional[SamplingParams] = None) -> GenerationOutput:
        """Generates the assistant's reply to `messages` ([{"role", "content"}...])
        rendered with the GGUF file's chat template. Special-token text inside
        a message (e.g. "<|im_end|>") is tokenized as plain text."""
        if self._model_path is None or self.tokenizer is None:
            raise ValueError("LLM.chat needs a GGUF model (its chat template)")
        template = _core.load_gguf_chat_template(self._model_path, self.tokenizer)
        # Message text stays plain text: a message cannot forge control tokens.
        ids = template.encode(self.tokenizer, messages, add_generation_prompt=True)
        return self.generate([ids], sampling_params)[0]
