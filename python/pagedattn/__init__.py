"""pagedattn: paged KV-cache attention for LLM inference (CPU), from Python.

    KVCache       the cache manager with attention (help(pagedattn.KVCache));
                  begin_forward returns a BatchPlan (zero-copy views of the
                  step's page table), layer_storage a LayerStorage (zero-copy
                  views of the K/V pages)
    Engine        continuous batching (add_request / step / abort, streaming
                  iteration) over a Model (a GGUF file or a synthetic preset)
    LLM           vLLM-style offline generation: LLM(path).generate(prompts,
                  SamplingParams(...))
    Tokenizer     BPE tokenizers from GGUF tokenizer metadata; StreamingDecoder,
                  ChatTemplate (ChatML / Llama-3 / Llama-2 chat prompts)
    ops           peer-compatible operators (ONNX Runtime, vLLM, torch_xla)
    GgufFile      a GGUF model file (metadata, tensors); gguf_dequantize
                  dequantises raw ggml blocks to float32
    Error         base of the library's exceptions; InvalidArgumentError is a
                  ValueError, OutOfPagesError / InvalidStateError /
                  InternalError are RuntimeErrors, UnsupportedError is a
                  NotImplementedError; LLM.generate raises GenerationError
                  (an Error and a RuntimeError) when the model's logits for a
                  request were NaN or Inf

Arrays are NumPy arrays (or buffer-protocol / DLPack objects) used in place;
bfloat16 and float8 travel as uint16 / uint8 arrays with a dtype string, or
as ml_dtypes arrays. See docs/python.md.
"""

from ._core import (
    BatchPlan,
    ChatTemplate,
    EngineStats,
    Error,
    GgufFile,
    InternalError,
    InvalidArgumentError,
    InvalidStateError,
    KVCache,
    LayerStorage,
    Model,
    OutOfPagesError,
    RequestOutput,
    SampleOutput,
    SamplingParams,
    StopMatcher,
    StopMatcherResult,
    StreamingDecoder,
    TokenLogprobs,
    Tokenizer,
    UnsupportedError,
    __version__,
    gguf_dequantize,
)
from . import ops
from .engine import LLM, CompletionOutput, Engine, GenerationError, GenerationOutput, Logprob


def _warn_if_blas_fell_back() -> None:
    # OpenBLAS picks its kernels by CPU model when it loads, and a build older
    # than the CPU falls back to generic SSE3 ones: prefill runs several times
    # slower. It reads OPENBLAS_CORETYPE only then, so only a new process can
    # take it (the `pagedattn` command restarts itself).
    from ._core import _blas_core_instead_of_fallback

    core = _blas_core_instead_of_fallback()
    if core:
        import warnings

        warnings.warn(
            "OpenBLAS chose its generic x86-64 kernels on this CPU (its build predates the "
            f"CPU model), so prefill runs several times slower: set OPENBLAS_CORETYPE={core} "
            "in the environment before starting Python",
            RuntimeWarning,
            stacklevel=2,
        )


_warn_if_blas_fell_back()

__all__ = [
    "BatchPlan",
    "ChatTemplate",
    "CompletionOutput",
    "Engine",
    "EngineStats",
    "GenerationError",
    "GenerationOutput",
    "Error",
    "GgufFile",
    "InternalError",
    "InvalidArgumentError",
    "InvalidStateError",
    "KVCache",
    "LLM",
    "LayerStorage",
    "Logprob",
    "Model",
    "OutOfPagesError",
    "RequestOutput",
    "SampleOutput",
    "SamplingParams",
    "StopMatcher",
    "StopMatcherResult",
    "StreamingDecoder",
    "TokenLogprobs",
    "Tokenizer",
    "UnsupportedError",
    "ops",
    "__version__",
    "gguf_dequantize",
]
