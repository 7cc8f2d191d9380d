"""Type stubs of pagedattn._core, the compiled half of the package (drafted with
pybind11-stubgen, return types refined by hand). Array arguments typed Any
take NumPy arrays, DLPack producers (torch tensors) or buffer-protocol
objects."""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
import typing_extensions
class Error(Exception):
    """Base class of every error raised by pagedattn's C++ library."""
class InvalidArgumentError(Error, ValueError):
    """A bad argument (named in the message); nothing changed."""
class OutOfPagesError(Error, RuntimeError):
    """The page pool cannot hold the request; nothing changed."""
class InvalidStateError(Error, RuntimeError):
    """A call out of order (e.g. attention outside a step)."""
class UnsupportedError(Error, NotImplementedError):
    """A valid request pagedattn does not implement."""
class InternalError(Error, RuntimeError):
    """A broken invariant: a bug in pagedattn."""
__all__: list[str] = ['BatchPlan', 'ChatTemplate', 'Engine', 'EngineStats', 'Error', 'GgufFile', 'GgufModel', 'InternalError', 'InvalidArgumentError', 'InvalidStateError', 'KVCache', 'LayerStorage', 'Model', 'OutOfPagesError', 'RequestOutput', 'SampleOutput', 'SamplingParams', 'StreamingDecoder', 'Tokenizer', 'UnsupportedError', 'gguf_dequantize', 'load_gguf_chat_template', 'load_gguf_tokenizer']
class BatchPlan:
    """
    The plan of one step (returned by KVCache.begin_forward and KVCache.plan).
    
    A snapshot of the cache's C++ BatchPlan taken when the step began. Every
    array is a read-only NumPy view of the snapshot (no copy per access; the
    arrays keep this object alive, so they never dangle). After end_forward or
    cancel_forward the arrays still read the finished step's values; a new
    step has a new BatchPlan. Each array exports DLPack (torch.from_dlpack,
    numpy.from_dlpack) without a copy.
    
    FlashInfer conventions (B = batch_size, T = num_tokens, CSR page table):
        seq_ids          int64 [B]      the caller's order
        qo_indptr        int32 [B + 1]  offsets of each sequence's new tokens
        kv_indptr        int32 [B + 1]  offsets into kv_indices
        kv_indices       int32 [kv_indptr[B]] page ids, logical order
        kv_last_page_len int32 [B]      used slots of the last page (0 if none)
        kv_lens          int32 [B]      keys after the append (vLLM seq_lens)
        positions        int32 [T]      position of each new token
        slot_mapping     int64 [T]      vLLM: page * page_size + offset (-1: none)
        kv_sink_lens, kv_gap_lens int32 [B]  sliding windows with sinks: key j
                         sits at slot j (j < sink) or j + gap (see has_gaps)
        tree_begin, tree_node_indptr [B], [B + 1]; tree_enter, tree_exit,
        tree_positions [nodes]: the token-tree mask (see has_tree)
    block_table(pad=0) gives the padded [B, max_pages] int32 table of vLLM and
    torch_xla (a new array).
    """
    def __repr__(self) -> str:
        ...
    def block_table(self, pad: int = 0) -> numpy.typing.NDArray[numpy.int32]:
        """
        block_table(pad=0) -> int32 [B, max_pages]: row b = sequence b's pages, padded.
        """
    @property
    def batch_size(self) -> int:
        """
        Sequences in the step (B).
        """
    @property
    def has_gaps(self) -> bool:
        """
        Some sequence has a sliding-window gap (kv_gap_lens != 0): its keys are
        not the first kv_lens slots of its pages.
        """
    @property
    def has_tree(self) -> bool:
        """
        Some sequence has an open token tree (the tree_* arrays are filled).
        """
    @property
    def kv_gap_lens(self) -> numpy.ndarray:
        """
        int32 [B]
        """
    @property
    def kv_indices(self) -> numpy.ndarray:
        """
        int32 [kv_indptr[B]] page ids
        """
    @property
    def kv_indptr(self) -> numpy.ndarray:
        """
        int32 [B + 1]
        """
    @property
    def kv_last_page_len(self) -> numpy.ndarray:
        """
        int32 [B]
        """
    @property
    def kv_lens(self) -> numpy.ndarray:
        """
        int32 [B]
        """
    @property
    def kv_sink_lens(self) -> numpy.ndarray:
        """
        int32 [B]
        """
    @property
    def num_tokens(self) -> int:
        """
        New tokens in the step (T).
        """
    @property
    def page_size(self) -> int:
        """
        Tokens per page.
        """
    @property
    def positions(self) -> numpy.ndarray:
        """
        int32 [T]
        """
    @property
    def qo_indptr(self) -> numpy.ndarray:
        """
        int32 [B + 1]
        """
    @property
    def seq_ids(self) -> numpy.ndarray:
        """
        int64 [B]
        """
    @property
    def slot_mapping(self) -> numpy.ndarray:
        """
        int64 [T]
        """
    @property
    def tree_begin(self) -> numpy.ndarray:
        """
        int32 [B]
        """
    @property
    def tree_enter(self) -> numpy.ndarray:
        """
        int32 [nodes]
        """
    @property
    def tree_exit(self) -> numpy.ndarray:
        """
        int32 [nodes]
        """
    @property
    def tree_node_indptr(self) -> numpy.ndarray:
        """
        int32 [B + 1]
        """
    @property
    def tree_positions(self) -> numpy.ndarray:
        """
        int32 [nodes]
        """
class LayerStorage:
    """
    Zero-copy views of one layer's page storage (KVCache.layer_storage).
    
        layout "HND": k [num_pages, Hkv, page_size, D], v [num_pages, Hkv, page_size, Dv]
        layout "NHD": k [num_pages, page_size, Hkv, D], v [num_pages, page_size, Hkv, Dv]
    
    dtype float32 / float16 / int8 as such; bfloat16 and float8 as ml_dtypes
    arrays (raw uint16 / uint8 bits without ml_dtypes). Dequantised value =
    stored * scale: int8 has k_scales / v_scales [num_pages, Hkv, page_size]
    float32 (one per token and head); fp8 has k_scale / v_scale, or per-head
    k_head_scales / v_head_scales [Hkv] (copies). The arrays are writable views
    of the cache's memory and keep the cache alive. They bypass the cache's
    lock: do not write pages other sequences hold, and do not use them while
    another thread runs a call on the cache. A step whose K/V you write
    yourself (through plan.slot_mapping) must be declared with
    KVCache.mark_layer_appended(layer) before end_forward.
    """
    @property
    def dtype(self) -> str:
        """
        Storage dtype name.
        """
    @property
    def k(self) -> numpy.ndarray:
        """
        K pages (writable view).
        """
    @property
    def k_head_scales(self) -> numpy.typing.NDArray[numpy.float32] | None:
        """
        fp8: per-head K scales or None.
        """
    @property
    def k_scale(self) -> float:
        """
        fp8: per-tensor K scale (1 otherwise).
        """
    @property
    def k_scales(self) -> numpy.typing.NDArray[numpy.float32] | None:
        """
        int8: K scales per token and head.
        """
    @property
    def layout(self) -> str:
        """
        "HND" or "NHD".
        """
    @property
    def page_size(self) -> int:
        """
        Tokens per page.
        """
    @property
    def v(self) -> numpy.ndarray:
        """
        V pages (writable view).
        """
    @property
    def v_head_scales(self) -> numpy.typing.NDArray[numpy.float32] | None:
        """
        fp8: per-head V scales or None.
        """
    @property
    def v_scale(self) -> float:
        """
        fp8: per-tensor V scale (1 otherwise).
        """
    @property
    def v_scales(self) -> numpy.typing.NDArray[numpy.float32] | None:
        """
        int8: V scales per token and head.
        """
class KVCache:
    """
    Paged KV cache: pages of K/V for many sequences, with attention.
    
    KVCache(num_layers, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages=0,
            dtype="float16", layout="HND", rope_mode="none", rope_theta=10000.0,
            rope_scale=1.0, support_sliding_window=False, v_head_dim=None, *,
            memory_budget_bytes=0, k_scale=1.0, v_scale=1.0, rotary_dim=0,
            rope_interleaved=False, rope_scaling=None, num_threads=0,
            fixed_kv_chunk=0, enable_prefix_caching=False, host_num_pages=0,
            host_memory_budget_bytes=0)
    
    dtype: storage type, "float32", "float16", "bfloat16", "float8_e4m3fn",
      "float8_e5m2" or "int8". layout: "HND" (page = [Hkv, page_size, D]) or
      "NHD" (page = [page_size, Hkv, D]). rope_mode: "none" (q, k arrive
      rotated), "normal" (q and new k rotated at their positions, K stored
      rotated), "inline" (K stored raw, rotated at its cache index inside
      attention). rope_scale multiplies the rotary frequency. v_head_dim: None
      means head_dim. num_pages = 0: the largest page count whose K+V storage
      (all layers) fits memory_budget_bytes. k_scale / v_scale (fp8 storage):
      value = stored * scale, a float (per tensor) or [num_kv_heads] floats (per
      head). rotary_dim: rotated dimensions (0: head_dim); rope_interleaved:
      pairs (2t, 2t + 1) (GPT-J, GGUF llama) instead of (t, t + R/2) (NeoX);
      rope_scaling: Llama-3 scaling as in a Hugging Face config, {"rope_type":
      "llama3", "factor", "low_freq_factor", "high_freq_factor",
      "original_max_position_embeddings"}. num_threads: attention threads (0:
      OpenMP's maximum); fixed_kv_chunk > 0 splits keys in chunks of exactly
      that size, so a row's result does not depend on its batch (determinism).
    enable_prefix_caching: full pages of told token ids stay cached and are
      shared with later prompts (match_prefix, add_sequence_with_prefix,
      set_sequence_tokens). host_num_pages / host_memory_budget_bytes: a host
      tier for swap_out / swap_in and for cached pages evicted from the device.
    
    A step (the TVM protocol):
        cache.add_sequence(0)
        plan = cache.begin_forward([0], [T])     # reserve pages for T new tokens (BatchPlan)
        out = cache.attention(layer, q, k, v)    # per layer: append k/v, attend
        cache.end_forward()                      # sliding windows trim here
    
    Shapes (T = tokens of the step, in seq_ids order; Hq = num_qo_heads,
    Hkv = num_kv_heads, D = head_dim, Dv = v_head_dim):
        q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, Hq, Dv]
        qkv [T, Hq + 2 Hkv, D]                       -> out [T, Hq, D]
    q, k, v are float32 or float16 (or ml_dtypes.bfloat16) arrays of one dtype;
    use the cache dtype for float32/float16 caches and float32 for the others
    (stored rounded to nearest even). out has q's dtype. Only the last axis needs
    to be contiguous.
    
    Errors: pagedattn.InvalidArgumentError (a ValueError) naming the argument,
    pagedattn.OutOfPagesError (a RuntimeError) when the pool is short (the cache
    is then unchanged), pagedattn.InvalidStateError for calls out of order.
    Every call validates first and changes nothing when it fails.
    
    end_forward refuses a step in which some layer's K/V was not written
    (attention for every layer, or set_kv of every new token); cancel_forward
    abandons a step, restoring the cache exactly.
    
    Threads: a KVCache may be shared by threads. Every call is safe from any
    thread; calls on one cache take turns (the GIL is released while a call
    waits or works, so attention of one thread runs beside other Python code).
    The thread that began a step should be the one to end it.
    """
    def __init__(self, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, num_pages: int = 0, dtype: str = 'float16', layout: str = 'HND', rope_mode: str = 'none', rope_theta: float = 10000.0, rope_scale: float = 1.0, support_sliding_window: bool = False, v_head_dim: int | None = None, *, memory_budget_bytes: int = 0, k_scale: float | collections.abc.Sequence[float] = 1.0, v_scale: float | collections.abc.Sequence[float] = 1.0, rotary_dim: int = 0, rope_interleaved: bool = False, rope_scaling: dict[str, typing.Any] | None = None, num_threads: int = 0, fixed_kv_chunk: int = 0, enable_prefix_caching: bool = False, host_num_pages: int = 0, host_memory_budget_bytes: int = 0) -> None:
        """
        Creates the cache (see the class doc).
        """
    def __repr__(self) -> str:
        ...
    def add_sequence(self, id: int) -> None:
        """
        Adds an empty sequence `id` (InvalidArgumentError if it exists).
        """
    def attention(self, layer: int, q: typing.Any, k: typing.Any, v: typing.Any, sm_scale: float | None = None, *, causal: bool = True, window_left: int = -1, softcap: float = 0.0, alibi_slopes: collections.abc.Sequence[float] | numpy.ndarray | None = None, sinks: collections.abc.Sequence[float] | numpy.ndarray | None = None, return_lse: bool = False) -> numpy.ndarray | tuple[numpy.ndarray, numpy.typing.NDArray[numpy.float32]]:
        """
        attention(layer, q, k, v, sm_scale=None, *, causal=True, window_left=-1,
                  softcap=0.0, alibi_slopes=None, sinks=None, return_lse=False)
            -> out, or (out, lse) with return_lse
        
        For `layer` of the current step: applies RoPE per rope_mode (to copies),
        appends k/v to the cache and attends over each sequence.
        q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, Hq, Dv] (q's dtype).
        sm_scale None: 1/sqrt(D). causal False: every key of the sequence is
        visible; window_left W >= 0: a query at position p sees keys [p - W, p];
        softcap > 0: s = softcap * tanh(s / softcap); alibi_slopes [Hq]: s +=
        slope * (j - p); sinks [Hq]: a learned sink logit per head joins the
        softmax; lse [T, Hq] float32: natural-log log-sum-exp of each row
        (docs/semantics.md). A failed call changes nothing; the step goes on.
        """
    def attention_with_fused_qkv(self, layer: int, qkv: typing.Any, sm_scale: float | None = None, *, causal: bool = True, window_left: int = -1, softcap: float = 0.0, alibi_slopes: collections.abc.Sequence[float] | numpy.ndarray | None = None, sinks: collections.abc.Sequence[float] | numpy.ndarray | None = None, return_lse: bool = False) -> numpy.ndarray | tuple[numpy.ndarray, numpy.typing.NDArray[numpy.float32]]:
        """
        attention_with_fused_qkv(layer, qkv, sm_scale=None, **options) -> out
        
        attention() with q, k, v packed per token: qkv [T, Hq + 2 Hkv, D] (heads
        q..., k..., v...) -> out [T, Hq, D]. Needs v_head_dim == head_dim. The
        keyword options are attention()'s.
        """
    def begin_forward(self, seq_ids: collections.abc.Sequence[int], append_lengths: collections.abc.Sequence[int], token_tree_parents: collections.abc.Sequence[int] | None = None) -> BatchPlan:
        """
        begin_forward(seq_ids, append_lengths, token_tree_parents=None) -> BatchPlan
        
        Starts a step: reserves pages for append_lengths[i] new tokens of seq_ids[i]
        (lists or 1-D integer arrays of length B; lengths may be 0). The step's
        T = sum(append_lengths) tokens are ordered as seq_ids. OutOfPagesError if
        the pool cannot hold them (nothing changes). Returns the step's plan
        (help(pagedattn.BatchPlan)).
        
        token_tree_parents (speculative decoding): one flat list over all T
        tokens, sequence after sequence: the parent of each appended node as an
        index into that sequence's uncommitted tree (-1: a child of the committed
        prefix; parent < node). Each node attends to the committed prefix, its
        ancestors and itself; positions are committed length + depth. The tree
        may grow over several forwards; until commit_accepted_token_tree_nodes
        the sequence refuses plain forwards, forks, pop_n (InvalidStateError).
        """
    def can_append(self, seq_ids: collections.abc.Sequence[int], append_lengths: collections.abc.Sequence[int]) -> bool:
        """
        Whether begin_forward(seq_ids, append_lengths) would succeed now.
        """
    def cancel_forward(self) -> None:
        """
        Abandons the open step (e.g. the model raised half way): the cache
        returns to exactly its state before begin_forward. InvalidStateError
        outside a step.
        """
    def check_invariants(self) -> None:
        """
        Raises pagedattn.InternalError describing the first broken invariant (a bug).
        """
    def commit_accepted_token_tree_nodes(self, seq_ids: collections.abc.Sequence[int], leaf_indices: collections.abc.Sequence[int]) -> None:
        """
        commit_accepted_token_tree_nodes(seq_ids, leaf_indices)
        
        Keeps, per sequence, the root-to-leaf path ending at leaf_indices[i] (a node
        of its open tree; -1 rejects all): the path's K/V move right after the
        committed prefix, the other nodes are dropped, and the tree closes.
        """
    def empty(self) -> bool:
        """
        True when there are no sequences and every page is free.
        """
    def enable_sliding_window(self, id: int, window_size: int, attn_sink_size: int) -> None:
        """
        After every step sequence `id` keeps its first `attn_sink_size` tokens plus
        the most recent ones, `window_size` in all (trimmed at end_forward). Needs
        support_sliding_window=True; 0 <= attn_sink_size < window_size.
        """
    def end_forward(self) -> None:
        """
        Ends the step; sliding windows drop the tokens that fell out.
        InvalidStateError (the step stays open) if some layer's K/V of the
        step's new tokens was not written (attention of that layer, or set_kv of
        every new token): the pages may still hold another sequence's K/V.
        """
    def fork_sequence(self, parent: int, child: int, fork_pos: int = -1) -> None:
        """
        Creates `child` holding the first `fork_pos` tokens of `parent` (-1: all).
        Full pages are shared (copy on write); a partial page at the fork point is
        copied. The child inherits no sliding window.
        """
    def get_kv(self, seq_id: int, start: int, end: int) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.float32]]:
        """
        get_kv(seq_id, start, end) -> (k, v)
        
        Tokens [start, end) of a sequence (retained tokens, with a sliding window)
        as float32 copies: k [num_layers, end-start, Hkv, D], v [num_layers,
        end-start, Hkv, Dv]. K is as stored (rotated with rope_mode="normal").
        """
    def has_open_token_tree(self, id: int) -> bool:
        """
        Whether sequence `id` has an uncommitted token tree (plain forwards refused).
        """
    def has_sequence(self, id: int) -> bool:
        """
        Whether sequence `id` exists.
        """
    def layer_storage(self, layer: int) -> LayerStorage:
        """
        layer_storage(layer) -> LayerStorage: writable zero-copy views of the layer's
        K/V pages (help(pagedattn.LayerStorage) for shapes and rules).
        """
    def mark_layer_appended(self, layer: int) -> None:
        """
        Declares that you wrote every new token's K/V of `layer` yourself (through
        layer_storage(layer) and plan.slot_mapping), so end_forward accepts the
        step. Marking a layer you did not write exposes what its pages held.
        """
    def page_refcount(self, page: int) -> int:
        """
        Sequences holding `page` (forks share pages).
        """
    def pages_needed(self, seq_ids: collections.abc.Sequence[int], append_lengths: collections.abc.Sequence[int]) -> int:
        """
        Pages begin_forward(seq_ids, append_lengths) would take from the pool (a dry
        run; raises what begin_forward would raise for bad arguments).
        """
    def plan(self) -> BatchPlan:
        """
        plan() -> BatchPlan: the current step's plan (a new snapshot; InvalidStateError
        outside a step).
        """
    def pop_n(self, id: int, n: int) -> None:
        """
        Removes the last `n` tokens of sequence `id`.
        """
    def remove_sequence(self, id: int) -> None:
        """
        Removes sequence `id` and frees its pages (shared pages lose a reference).
        """
    def sequence_ids(self) -> list[int]:
        """
        The ids of every sequence, ascending.
        """
    def sequence_length(self, id: int) -> int:
        """
        Tokens sequence `id` holds (retained ones, with a sliding window).
        """
    def sequence_pages(self, id: int) -> list[int]:
        """
        Page ids of sequence `id` in logical order (list of int).
        """
    def set_kv(self, seq_id: int, start: int, end: int, k: typing.Any, v: typing.Any) -> None:
        """
        set_kv(seq_id, start, end, k, v)
        
        Overwrites tokens [start, end) of a sequence: k [num_layers, end-start, Hkv, D],
        v [num_layers, end-start, Hkv, Dv], float32, C-contiguous, rounded to the
        cache dtype. Tokens in pages shared with another sequence are refused.
        """
    def state_digest(self) -> int:
        """
        64-bit hash of the metadata and of the K/V every sequence holds: equal
        before and after a call that failed or was cancelled.
        """
    def token_tree_size(self, id: int) -> int:
        """
        Uncommitted token-tree nodes of sequence `id` (0 when none is open).
        """
    @property
    def bytes_per_page(self) -> int:
        """
        K+V bytes of one page over all layers.
        """
    @property
    def config(self) -> dict[str, typing.Any]:
        """
        The resolved configuration as a dict (num_pages and v_head_dim
        resolved).
        """
    @property
    def in_forward(self) -> bool:
        """
        True between begin_forward and end_forward / cancel_forward.
        """
    @property
    def num_free_pages(self) -> int:
        """
        Pages in the pool not held by any sequence (cached ones included: evictable).
        """
    def match_prefix(self, token_ids: collections.abc.Sequence[int], cache_salt: int = 0) -> dict[str, int]:
        """
        Dry run: the longest cached prefix of token_ids under cache_salt, as a dict
        {num_tokens, device_pages, host_pages, pages_taken}: whole pages, never all of
        token_ids; pages_taken = free pages add_sequence_with_prefix would consume.
        """
    def add_sequence_with_prefix(self, id: int, token_ids: collections.abc.Sequence[int], cache_salt: int = 0) -> int:
        """
        Adds sequence `id` holding the cached prefix of token_ids (device pages shared,
        host pages copied back) and returns its length; compute the rest with
        begin_forward. OutOfPagesError (nothing changed) when pages are short; without
        enable_prefix_caching it is add_sequence and returns 0.
        """
    def set_sequence_tokens(self, id: int, token_ids: collections.abc.Sequence[int]) -> None:
        """
        Tells the token ids of the first len(token_ids) tokens of sequence `id` (call
        after every step; what was told before must not change). Their full pages are
        published for later prompts.
        """
    @property
    def num_cached_pages(self) -> int:
        """
        Cached pages nobody holds (evictable; counted in num_free_pages).
        """
    def prefix_cache_stats(self) -> dict[str, int]:
        """
        Counters since construction as a dict: queries, query_tokens, hit_tokens,
        device_hit_tokens, host_hit_tokens, evictions, demotions, host_evictions,
        swapped_out_pages, swapped_in_pages.
        """
    def reset_prefix_cache(self) -> None:
        """
        Drops every cached page nobody holds (device and host tier).
        """
    def swap_out(self, seq_ids: collections.abc.Sequence[int]) -> None:
        """
        Moves the listed sequences' pages to the host tier (shared pages stay shared);
        they are refused by steps until swap_in. OutOfPagesError if the host lacks room.
        """
    def swap_in(self, seq_ids: collections.abc.Sequence[int]) -> None:
        """
        Copies swapped sequences back into device pages (OutOfPagesError if short).
        """
    def swap_in_pages_needed(self, seq_ids: collections.abc.Sequence[int]) -> int:
        """
        Device pages swap_in(seq_ids) would take.
        """
    def is_swapped(self, id: int) -> bool:
        """
        Whether sequence `id` is swapped out to the host tier.
        """
    @property
    def num_free_host_pages(self) -> int:
        """
        Host-tier pages free or held only by the cache.
        """
    @property
    def num_host_pages(self) -> int:
        """
        Pages of the host tier (0: none).
        """
    @property
    def num_pages(self) -> int:
        """
        Pages in the pool (the constructor's num_pages).
        """
    @property
    def num_sequences(self) -> int:
        """
        Sequences in the cache.
        """
    @property
    def num_step_tokens(self) -> int:
        """
        Tokens of the open step (InvalidStateError outside a step).
        """
    @property
    def storage_bytes(self) -> int:
        """
        K+V (and int8 scale) bytes of the page storage, all layers.
        """
    @property
    def total_sequence_length(self) -> int:
        """
        Sum of sequence_length over all sequences.
        """
class GgufModel:
    def __init__(self, path: str) -> None:
        ...
    def logits(self, token_ids: collections.abc.Sequence[int], kv_dtype: str = 'f32') -> numpy.typing.NDArray[numpy.float32]:
        """
        Teacher-forced logits [len(token_ids)][vocab_size] of one sequence.
        """
    @property
    def name(self) -> str:
        ...
    @property
    def num_layers(self) -> int:
        ...
    @property
    def vocab_size(self) -> int:
        ...
class GgufFile:
    """
    A GGUF model file, memory mapped and validated (include/pagedattn/gguf.h).
    """
    def __init__(self, path: str) -> None:
        ...
    def dequantize(self, name: str) -> numpy.typing.NDArray[numpy.float32]:
        """
        The tensor as float32, shape = dims reversed (NumPy order).
        """
    def get(self, key: str) -> typing.Any:
        """
        The value of a metadata key (int, float, bool, str or list).
        """
    def keys(self) -> list:
        """
        Metadata keys in file order.
        """
    def model_config(self) -> dict:
        """
        The model hyperparameters pagedattn reads (arch, layers, heads, RoPE, ...) as a dict.
        """
    def tensor_bytes(self, name: str) -> bytes:
        """
        A tensor's raw bytes as stored (ggml blocks for quantised types).
        """
    def tensors(self) -> list:
        """
        Tensor infos in file order: dicts of name, type, dims (ggml order), offset, nbytes.
        """
    def value_type(self, key: str) -> str:
        """
        GGUF type name of a metadata key's value (e.g. "uint32", "array").
        """
    @property
    def alignment(self) -> int:
        """
        Tensor data alignment in bytes.
        """
    @property
    def data_offset(self) -> int:
        """
        Byte offset of the tensor data section.
        """
    @property
    def version(self) -> int:
        """
        GGUF format version (2 or 3).
        """
class Tokenizer:
    """
    Byte-level BPE (model='gpt2') or SentencePiece BPE (model='llama') built from GGUF-style tokenizer metadata (tokenizer.ggml.* keys).
    """
    def __init__(self, model: str, tokens: collections.abc.Sequence[str], *, pre: str = 'default', scores: collections.abc.Sequence[float] | None = None, token_type: collections.abc.Sequence[int] | None = None, merges: collections.abc.Sequence[str] | None = None, bos_id: int = -1, eos_id: int = -1, unk_id: int = -1, pad_id: int = -1, add_bos: bool = False, add_eos: bool = False, add_space_prefix: bool = True, space_prefix_after_special: bool = True, chat_template: str = '') -> None:
        ...
    def decode(self, ids: collections.abc.Sequence[int], *, render_special: bool = True) -> bytes:
        """
        bytes
        """
    def encode(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """
        list of token ids
        """
    def is_control(self, id: int) -> bool:
        """
        Whether token `id` is a control token (e.g. <|im_end|>).
        """
    def token_id(self, token_text: str) -> int:
        """
        The id of a token given by its exact text, -1 when the vocabulary has none.
        """
    def token_to_piece(self, id: int, *, render_special: bool = True) -> bytes:
        """
        The bytes of one token (control tokens only with render_special).
        """
    @property
    def bos_id(self) -> int:
        """
        Beginning-of-text token, -1: none.
        """
    @property
    def chat_template(self) -> str:
        """
        The Jinja chat template text from the metadata ("" when none).
        """
    @property
    def eos_id(self) -> int:
        """
        End-of-text token, -1: none.
        """
    @property
    def vocab_size(self) -> int:
        """
        Tokens in the vocabulary.
        """
class StreamingDecoder:
    """
    Decodes token by token, holding back incomplete UTF-8.
    """
    def __init__(self, tokenizer: Tokenizer, *, render_special: bool = True) -> None:
        ...
    def flush(self) -> bytes:
        """
        Returns what is held back (an incomplete UTF-8 tail) and empties the decoder.
        """
    def push(self, id: int) -> bytes:
        """
        Adds a token; returns the bytes that are complete UTF-8 so far.
        """
class ChatTemplate:
    """
    A model's chat template, recognised and rendered natively (ChatML, Qwen3, Llama 3/3.1, Llama 2, Gemma 2/3, Phi-3, Mistral [INST] forms).
    """
    def __init__(self, template: str, bos_text: str = '', eos_text: str = '') -> None:
        ...
    def render(self, messages: collections.abc.Sequence[collections.abc.Mapping[str, str]], *, add_generation_prompt: bool = True, enable_thinking: bool | None = None, date_string: str = '') -> str:
        """
        The prompt text of messages [{"role", "content"}...], ending with the
        assistant's turn header when add_generation_prompt. enable_thinking: Qwen3's
        switch (False writes the empty think block); date_string: Llama 3.1's "Today
        Date" ("": the template's default).
        """
    @property
    def default_system_prompt(self) -> str:
        """
        The system message the template adds when none is given.
        """
    @property
    def kind(self) -> str:
        """
        The template's form: "chatml", "qwen3", "llama3", "llama2", "gemma", "phi3" or "mistral".
        """
    @property
    def variant(self) -> str:
        """
        The form and variant, e.g. "llama3.1", "gemma2", "mistral-v3-tekken".
        """
class SamplingParams:
    """
    How a request samples (vLLM's SamplingParams subset).
    
    max_tokens >= 1 new tokens per sample; temperature 0 is greedy
    (argmax, lowest id on ties); top_k 0 = all tokens; top_p in (0, 1];
    n parallel samples share the prompt's pages; seed None derives one
    from the engine seed and the request id; stop_token_ids end a
    sample (kept in its output); ignore_eos keeps going past EOS;
    cache_salt keeps tenants' cached prefixes apart.
    """
    def __init__(self, *, max_tokens: int = 16, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, n: int = 1, seed: int | None = None, stop_token_ids: collections.abc.Sequence[int] = [], ignore_eos: bool = False, cache_salt: int = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def cache_salt(self) -> int:
        """
        Prefix caching: only requests with the same salt share cached pages.
        """
    @cache_salt.setter
    def cache_salt(self, arg0: int) -> None:
        ...
    @property
    def ignore_eos(self) -> bool:
        """
        Keep sampling past EOS.
        """
    @ignore_eos.setter
    def ignore_eos(self, arg0: bool) -> None:
        ...
    @property
    def max_tokens(self) -> int:
        """
        New tokens per sample, >= 1.
        """
    @max_tokens.setter
    def max_tokens(self, arg0: int) -> None:
        ...
    @property
    def n(self) -> int:
        """
        Parallel samples, [1, 256].
        """
    @n.setter
    def n(self, arg0: int) -> None:
        ...
    @property
    def seed(self) -> int | None:
        """
        Sampling seed; None derives one from the engine seed and request id.
        """
    @seed.setter
    def seed(self, arg0: int | None) -> None:
        ...
    @property
    def stop_token_ids(self) -> list[int]:
        """
        Tokens that end a sample (kept in its output).
        """
    @stop_token_ids.setter
    def stop_token_ids(self, arg0: collections.abc.Sequence[int]) -> None:
        ...
    @property
    def temperature(self) -> float:
        """
        0: greedy.
        """
    @temperature.setter
    def temperature(self, arg0: float) -> None:
        ...
    @property
    def top_k(self) -> int:
        """
        0: all tokens.
        """
    @top_k.setter
    def top_k(self, arg0: int) -> None:
        ...
    @property
    def top_p(self) -> float:
        """
        Nucleus sampling threshold in (0, 1].
        """
    @top_p.setter
    def top_p(self, arg0: float) -> None:
        ...
class SampleOutput:
    """
    One sample's news in one step.
    """
    @property
    def finish_reason(self) -> str | None:
        """
        None while running, else "length", "stop" or "aborted".
        """
    @property
    def index(self) -> int:
        """
        Sample index in [0, n).
        """
    @property
    def new_token_ids(self) -> list[int]:
        """
        Tokens produced this step.
        """
class RequestOutput:
    """
    One request's progress in one step.
    """
    @property
    def finished(self) -> bool:
        """
        Every sample finished (or the request was aborted).
        """
    @property
    def request_id(self) -> int:
        """
        The id add_request returned.
        """
    @property
    def samples(self) -> list[SampleOutput]:
        """
        The samples with news this step.
        """
class EngineStats:
    """
    Counters and the KV picture after the last step.
    """
    @property
    def prefix_query_tokens(self) -> int:
        """
        Prompt tokens looked up in the prefix cache at admission.
        """
    @property
    def prefix_hit_tokens(self) -> int:
        """
        Of those, found cached (their K/V taken, not computed).
        """
    @property
    def prefix_host_hit_tokens(self) -> int:
        """
        Of the hits, found in the host tier.
        """
    @property
    def prefix_hit_rate(self) -> float:
        """
        prefix_hit_tokens / prefix_query_tokens (0 before any query).
        """
    @property
    def cached_pages(self) -> int:
        """
        Device pages holding published prefixes.
        """
    @property
    def prefix_evictions(self) -> int:
        """
        Cached pages reclaimed for new data.
        """
    @property
    def prefix_demotions(self) -> int:
        """
        Of those, kept in the host tier.
        """
    @property
    def num_swap_outs(self) -> int:
        """
        Requests swapped out.
        """
    @property
    def num_swap_ins(self) -> int:
        """
        Requests swapped back in.
        """
    @property
    def swapped_tokens(self) -> int:
        """
        Tokens kept by swapping instead of recomputing.
        """
    @property
    def num_swapped_requests(self) -> int:
        """
        Requests in the host tier now.
        """
    @property
    def num_host_pages(self) -> int:
        """
        Pages of the host tier.
        """
    @property
    def free_host_pages(self) -> int:
        """
        Free host-tier pages.
        """
    @property
    def last_step_decodes(self) -> int:
        """
        Decode tokens in the last step's batch.
        """
    @property
    def last_step_tokens(self) -> int:
        """
        Tokens in the last step's batch.
        """
    @property
    def num_pages(self) -> int:
        """
        Pages of the KV cache.
        """
    @property
    def num_preemptions(self) -> int:
        """
        Requests preempted (by recompute), in total.
        """
    @property
    def num_running_seqs(self) -> int:
        """
        Running sequences (samples).
        """
    @property
    def num_waiting_requests(self) -> int:
        """
        Requests waiting for admission.
        """
    @property
    def pages_if_unshared(self) -> int:
        """
        Pages the sequences would hold without sharing.
        """
    @property
    def pages_in_use(self) -> int:
        """
        Pages held by sequences.
        """
    @property
    def recomputed_tokens(self) -> int:
        """
        Tokens computed again after preemption.
        """
    @property
    def seconds_in_model(self) -> float:
        """
        Of which in the model's forward.
        """
    @property
    def seconds_in_steps(self) -> float:
        """
        Wall time inside step(), in total.
        """
    @property
    def steps(self) -> int:
        """
        step() calls so far.
        """
    @property
    def token_states_stored(self) -> int:
        """
        Distinct tokens held (shared pages counted once).
        """
    @property
    def token_states_unshared(self) -> int:
        """
        Tokens held summed over sequences (as if nothing were shared).
        """
class Model:
    """
    A model the engine runs (Model.preset, Model.from_gguf).
    """
    @staticmethod
    def from_gguf(path: str, max_position: int = 0) -> Model:
        """
        A Llama-family GGUF file (max_position 0: the file's context length).
        """
    @staticmethod
    def preset(name: str) -> Model:
        """
        A synthetic Llama with seeded weights: "tiny", "small" or "1b".
        """
    @property
    def eos_token_id(self) -> int:
        """
        End-of-text token (-1: none); a sample stops there unless ignore_eos.
        """
    @property
    def name(self) -> str:
        """
        The model's name.
        """
    @property
    def num_layers(self) -> int:
        """
        Transformer layers.
        """
    @property
    def vocab_size(self) -> int:
        """
        Logits per token.
        """
class Engine:
    """
    The C++ engine; use pagedattn.Engine.
    """
    def __init__(self, model: Model, *, kv_memory_bytes: int, page_size: int, kv_dtype: str, max_num_seqs: int, max_num_batched_tokens: int, chunked_prefill: bool, deterministic: bool, seed: int, enable_prefix_caching: bool = False, host_kv_memory_bytes: int = 0, bf16_products: bool = False, int8_products: bool = False, f16_products: bool = False) -> None:
        ...
    def abort(self, request_id: int) -> None:
        ...
    def add_request(self, prompt_token_ids: collections.abc.Sequence[int], params: SamplingParams) -> int:
        ...
    def has_unfinished(self) -> bool:
        ...
    def set_stream_callback(self, callback: collections.abc.Callable[[RequestOutput], None] | None) -> None:
        ...
    def stats(self) -> EngineStats:
        ...
    def step(self) -> list[RequestOutput]:
        ...
    @property
    def num_pages(self) -> int:
        ...
def gguf_dequantize(type: str, data: typing_extensions.Buffer, n: int) -> numpy.typing.NDArray[numpy.float32]:
    """
    Dequantises n elements of a ggml type ('Q4_K', 'F16', ...) from raw bytes to float32.
    """
def load_gguf_chat_template(path: str, tokenizer: Tokenizer) -> ChatTemplate:
    """
    The chat template of a GGUF file (UnsupportedError when it has none).
    """
def load_gguf_tokenizer(path: str) -> Tokenizer:
    """
    The Tokenizer of a GGUF file's tokenizer.ggml.* metadata.
    """
__version__: str = '0.1.0'
