// The parts of the extension module pagedattn._core, each registered by one
// file: errors.cc, kv_cache_bindings.cc, ops_bindings.cc, tokenizer_bindings.cc,
// cuda_bindings.cc (builds with the CUDA backend only).
#pragma once

#include <pybind11/pybind11.h>

namespace pagedattn::python {

// pagedattn.Error and its subclasses, and the translation of the C++
// exceptions of errors.h into them.
void register_errors(pybind11::module_& m);
// pagedattn.BatchPlan and pagedattn.LayerStorage (plan_views.cc).
void register_plan_views(pybind11::module_& m);
// pagedattn.KVCache over PagedKVCache.
void register_kv_cache(pybind11::module_& m);
// The peer-compatible operators (pagedattn.ops) and merge_states.
void register_ops(pybind11::module_& m);
// GgufModel: a GGUF model's teacher-forced logits (model_bindings.cc).
void register_models(pybind11::module_& m);
// pagedattn.GgufFile and pagedattn.gguf_dequantize (gguf_bindings.cc).
void register_gguf(pybind11::module_& m);
// pagedattn.Tokenizer, StreamingDecoder, ChatTemplate.
void register_tokenizer(pybind11::module_& m);
// Engine, SamplingParams, RequestOutput, Model (engine_bindings.cc); needs
// register_tokenizer first.
void register_engine(pybind11::module_& m);
#if defined(PAGEDATTN_HAVE_CUDA)
// pagedattn._core.cuda: the CUDA backend on CUDA tensors (cuda_bindings.cc);
// needs register_errors first.
void register_cuda(pybind11::module_& m);
#endif

}  // namespace pagedattn::python
