// pagedattn._core.Engine and friends: the continuous-batching engine of
// include/pagedattn/engine.h (the package's pagedattn.Engine and
// pagedattn.LLM wrap it in Python).
//
// Threads: the engine is internally synchronized (see engine.h); every call
// here releases the GIL while the engine works, so one Python thread may
// loop on step() while others add or abort requests. A stream callback runs
// on the stepping thread and takes the GIL for the Python call; its first
// exception is raised by that step() once the step is over.
#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "array_conversion.h"
#include "bindings.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/gguf_tokenizer.h"
#include "pagedattn/llama.h"
#include "type_hints.h"

namespace pagedattn::python {
namespace {

namespace py = pybind11;

// A model the engine can own: a synthetic preset or a GGUF file.
struct ModelHandle {
  std::shared_ptr<Model> model;
};

ModelHandle preset_model(const std::string& name) {
  py::gil_scoped_release release;
  return {make_llama_model(llama_preset(name))};
}

ModelHandle gguf_model(const std::string& path, std::int32_t max_position, bool check_tensors) {
  py::gil_scoped_release release;
  return {make_gguf_model(path, {.max_position = max_position, .check_tensors = check_tensors})};
}

std::optional<std::string> finish_reason(FinishReason reason) {
  if (reason == FinishReason::kNone) return std::nullopt;
  return std::string(finish_reason_name(reason));
}

// A Python callable called with the GIL held, whatever thread calls it; it
// is also released with the GIL held.
class PythonCallback {
 public:
  explicit PythonCallback(py::function f)
      : f_(new py::function(std::move(f)), [](py::function* p) {
          py::gil_scoped_acquire gil;
          delete p;
        }) {}

  // Calls f(output); the first exception is kept for rethrow() and the
  // calls after it are skipped (the step itself carries on).
  void operator()(const RequestOutput& output) {
    py::gil_scoped_acquire gil;
    if (error_) return;
    try {
      (*f_)(output);
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  // Raises the kept exception, once (GIL held).
  void rethrow() {
    std::exception_ptr e = std::exchange(error_, nullptr);
    if (e) std::rethrow_exception(e);
  }

 private:
  std::shared_ptr<py::function> f_;
  std::exception_ptr error_;  // guarded by the GIL
};

// set_stream_callback's argument: called with each RequestOutput, or None.
struct StreamCallbackHint {
  static constexpr auto name = py::detail::const_name("collections.abc.Callable[[") +
                               py::detail::make_caster<RequestOutput>::name +
                               py::detail::const_name("], None] | None");
};
using OptionalStreamCallback = Typed<StreamCallbackHint>;

class PyEngine {
 public:
  explicit PyEngine(const EngineConfig& config) {
    py::gil_scoped_release release;
    engine_ = std::make_unique<Engine>(config);
  }
  ~PyEngine() {
    py::gil_scoped_release release;  // a stream callback may be waiting for the GIL
    engine_.reset();
  }

  RequestId add_request(const IndexSequence& prompt, const SamplingParams& params) {
    const std::vector<std::int64_t> ids =
        int_list_arg(prompt, "Engine.add_request", "prompt_token_ids");
    std::vector<std::int32_t> tokens;
    tokens.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < INT32_MIN || ids[i] > INT32_MAX)
        throw InvalidArgument(detail::concat("Engine.add_request: prompt_token_ids[", i,
                                             "] = ", ids[i], " is not a token id"));
      tokens.push_back(static_cast<std::int32_t>(ids[i]));
    }
    py::gil_scoped_release release;
    return engine_->add_request(tokens, params);
  }

  std::vector<RequestOutput> step() {
    std::vector<RequestOutput> outputs;
    {
      py::gil_scoped_release release;
      outputs = engine_->step();
    }
    if (callback_) callback_->rethrow();
    return outputs;
  }

  void set_stream_callback(const OptionalStreamCallback& f) {
    std::shared_ptr<PythonCallback> callback;
    if (!f.is_none()) callback = std::make_shared<PythonCallback>(f.cast<py::function>());
    const std::shared_ptr<PythonCallback> old = std::exchange(callback_, callback);
    py::gil_scoped_release release;  // the engine waits for a running step
    engine_->set_stream_callback(
        callback ? StreamCallback([callback](const RequestOutput& o) { (*callback)(o); })
                 : StreamCallback());
  }

  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<PythonCallback> callback_;  // the GIL guards it
};

using ReleaseGil = py::call_guard<py::gil_scoped_release>;

void register_sampling(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams",
                             "How a request samples (vLLM's SamplingParams subset).\n\n"
                             "max_tokens >= 1 new tokens per sample; temperature 0 is greedy\n"
                             "(argmax, lowest id on ties); top_k 0 = all tokens; top_p in (0, 1];\n"
                             "n parallel samples share the prompt's pages; seed None derives one\n"
                             "from the engine seed and the request id; stop_token_ids end a\n"
                             "sample (kept in its output); ignore_eos keeps going past EOS;\n"
                             "cache_salt keeps tenants' cached prefixes apart.")
      .def(py::init([](std::int32_t max_tokens, float temperature, std::int32_t top_k, float top_p,
                       std::int32_t n, std::optional<std::uint64_t> seed,
                       std::vector<std::int32_t> stop_token_ids, bool ignore_eos,
                       std::uint64_t cache_salt) {
             SamplingParams p{
                 max_tokens, temperature, top_k, top_p, n, seed, std::move(stop_token_ids),
                 ignore_eos};
             p.cache_salt = cache_salt;
             return p;
           }),
           py::kw_only(), py::arg("max_tokens") = 16, py::arg("temperature") = 0.0f,
           py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("n") = 1,
           py::arg("seed") = py::none(), py::arg("stop_token_ids") = std::vector<std::int32_t>{},
           py::arg("ignore_eos") = false, py::arg("cache_salt") = 0)
      .def_readwrite("max_tokens", &SamplingParams::max_tokens, "New tokens per sample, >= 1.")
      .def_readwrite("temperature", &SamplingParams::temperature, "0: greedy.")
      .def_readwrite("top_k", &SamplingParams::top_k, "0: all tokens.")
      .def_readwrite("top_p", &SamplingParams::top_p, "Nucleus sampling threshold in (0, 1].")
      .def_readwrite("n", &SamplingParams::n, "Parallel samples, [1, 256].")
      .def_readwrite("seed", &SamplingParams::seed,
                     "Sampling seed; None derives one from the engine seed and request id.")
      .def_readwrite("stop_token_ids", &SamplingParams::stop_token_ids,
                     "Tokens that end a sample (kept in its output).")
      .def_readwrite("ignore_eos", &SamplingParams::ignore_eos, "Keep sampling past EOS.")
      .def_readwrite("cache_salt", &SamplingParams::cache_salt,
                     "Prefix caching: only requests with the same salt share cached pages.")
      .def("__repr__", [](const SamplingParams& p) {
        return detail::concat("SamplingParams(max_tokens=", p.max_tokens,
                              ", temperature=", p.temperature, ", top_k=", p.top_k,
                              ", top_p=", p.top_p, ", n=", p.n, ")");
      });

  py::class_<SampleOutput>(m, "SampleOutput", "One sample's news in one step.")
      .def_readonly("index", &SampleOutput::index, "Sample index in [0, n).")
      .def_readonly("new_token_ids", &SampleOutput::new_token_ids, "Tokens produced this step.")
      .def_property_readonly(
          "finish_reason", [](const SampleOutput& s) { return finish_reason(s.finish_reason); },
          "None while running, else \"length\", \"stop\", \"aborted\" or \"error\" (the\n"
          "model's logits were NaN or Inf: RequestOutput.error says where).");

  py::class_<RequestOutput>(m, "RequestOutput", "One request's progress in one step.")
      .def_readonly("request_id", &RequestOutput::request_id, "The id add_request returned.")
      .def_readonly("samples", &RequestOutput::samples, "The samples with news this step.")
      .def_readonly("finished", &RequestOutput::finished,
                    "Every sample finished (or the request was aborted).")
      .def_property_readonly(
          "error",
          [](const RequestOutput& o) {
            return o.error.empty() ? std::nullopt : std::optional<std::string>(o.error);
          },
          "None, or why the request ended with finish_reason \"error\" (non-finite\n"
          "logits: the request, engine step, sample and how many were NaN / Inf).");
}

void register_engine_class(py::module_& m) {
  py::class_<EngineStats>(m, "EngineStats", "Counters and the KV picture after the last step.")
      .def_readonly("steps", &EngineStats::steps, "step() calls so far.")
      .def_readonly("num_preemptions", &EngineStats::num_preemptions,
                    "Requests preempted (by recompute), in total.")
      .def_readonly("recomputed_tokens", &EngineStats::recomputed_tokens,
                    "Tokens computed again after preemption.")
      .def_readonly("num_running_seqs", &EngineStats::num_running_seqs,
                    "Running sequences (samples).")
      .def_readonly("num_waiting_requests", &EngineStats::num_waiting_requests,
                    "Requests waiting for admission.")
      .def_readonly("last_step_tokens", &EngineStats::last_step_tokens,
                    "Tokens in the last step's batch.")
      .def_readonly("last_step_decodes", &EngineStats::last_step_decodes,
                    "Decode tokens in the last step's batch.")
      .def_readonly("num_pages", &EngineStats::num_pages, "Pages of the KV cache.")
      .def_readonly("pages_in_use", &EngineStats::pages_in_use, "Pages held by sequences.")
      .def_readonly("token_states_stored", &EngineStats::token_states_stored,
                    "Distinct tokens held (shared pages counted once).")
      .def_readonly("token_states_unshared", &EngineStats::token_states_unshared,
                    "Tokens held summed over sequences (as if nothing were shared).")
      .def_readonly("pages_if_unshared", &EngineStats::pages_if_unshared,
                    "Pages the sequences would hold without sharing.")
      .def_readonly("seconds_in_steps", &EngineStats::seconds_in_steps,
                    "Wall time inside step(), in total.")
      .def_readonly("seconds_in_model", &EngineStats::seconds_in_model,
                    "Of which in the model's forward.")
      .def_readonly("prefix_query_tokens", &EngineStats::prefix_query_tokens,
                    "Prompt tokens looked up in the prefix cache at admission.")
      .def_readonly("prefix_hit_tokens", &EngineStats::prefix_hit_tokens,
                    "Of those, found cached (their K/V taken, not computed).")
      .def_readonly("prefix_host_hit_tokens", &EngineStats::prefix_host_hit_tokens,
                    "Of the hits, found in the host tier.")
      .def_property_readonly("prefix_hit_rate", &EngineStats::prefix_hit_rate,
                             "prefix_hit_tokens / prefix_query_tokens (0 before any query).")
      .def_readonly("cached_pages", &EngineStats::cached_pages,
                    "Device pages holding published prefixes.")
      .def_readonly("prefix_evictions", &EngineStats::prefix_evictions,
                    "Cached pages reclaimed for new data.")
      .def_readonly("prefix_demotions", &EngineStats::prefix_demotions,
                    "Of those, kept in the host tier.")
      .def_readonly("num_swap_outs", &EngineStats::num_swap_outs, "Requests swapped out.")
      .def_readonly("num_swap_ins", &EngineStats::num_swap_ins, "Requests swapped back in.")
      .def_readonly("swapped_tokens", &EngineStats::swapped_tokens,
                    "Tokens kept by swapping instead of recomputing.")
      .def_readonly("num_swapped_requests", &EngineStats::num_swapped_requests,
                    "Requests in the host tier now.")
      .def_readonly("num_host_pages", &EngineStats::num_host_pages, "Pages of the host tier.")
      .def_readonly("free_host_pages", &EngineStats::free_host_pages, "Free host-tier pages.");

  py::class_<ModelHandle>(m, "Model", "A model the engine runs (Model.preset, Model.from_gguf).")
      .def_static("preset", &preset_model, py::arg("name"),
                  "A synthetic Llama with seeded weights: \"tiny\", \"small\" or \"1b\".")
      .def_static("from_gguf", &gguf_model, py::arg("path"), py::arg("max_position") = 0,
                  py::arg("check_tensors") = false,
                  "A Llama-family GGUF file (max_position 0: the file's context length).\n"
                  "check_tensors: scan every weight for NaN / Inf first (one more pass over\n"
                  "the weights) and raise InvalidArgumentError naming the tensor.")
      .def_property_readonly(
          "name", [](const ModelHandle& h) { return h.model->spec().name; }, "The model's name.")
      .def_property_readonly(
          "num_layers", [](const ModelHandle& h) { return h.model->spec().num_layers; },
          "Transformer layers.")
      .def_property_readonly(
          "vocab_size", [](const ModelHandle& h) { return h.model->spec().vocab_size; },
          "Logits per token.")
      .def_property_readonly(
          "eos_token_id", [](const ModelHandle& h) { return h.model->spec().eos_token_id; },
          "End-of-text token (-1: none); a sample stops there unless ignore_eos.");

  py::class_<PyEngine>(m, "Engine", "The C++ engine; use pagedattn.Engine.")
      .def(py::init([](const ModelHandle& model, std::int64_t kv_memory_bytes,
                       std::int32_t page_size, const std::string& kv_dtype,
                       std::int32_t max_num_seqs, std::int32_t max_num_batched_tokens,
                       bool chunked_prefill, bool deterministic, std::uint64_t seed,
                       bool enable_prefix_caching, std::int64_t host_kv_memory_bytes,
                       bool bf16_products, bool int8_products, bool f16_products) {
             EngineConfig c;
             c.model = model.model;
             c.kv_memory_bytes = kv_memory_bytes;
             c.page_size = page_size;
             c.kv_dtype = parse_dtype(kv_dtype);
             c.max_num_seqs = max_num_seqs;
             c.max_num_batched_tokens = max_num_batched_tokens;
             c.chunked_prefill = chunked_prefill;
             c.deterministic = deterministic;
             c.seed = seed;
             c.enable_prefix_caching = enable_prefix_caching;
             c.host_kv_memory_bytes = host_kv_memory_bytes;
             c.bf16_products = bf16_products;
             c.int8_products = int8_products;
             c.f16_products = f16_products;
             return std::make_unique<PyEngine>(c);
           }),
           py::arg("model"), py::kw_only(), py::arg("kv_memory_bytes"), py::arg("page_size"),
           py::arg("kv_dtype"), py::arg("max_num_seqs"), py::arg("max_num_batched_tokens"),
           py::arg("chunked_prefill"), py::arg("deterministic"), py::arg("seed"),
           py::arg("enable_prefix_caching") = false, py::arg("host_kv_memory_bytes") = 0,
           py::arg("bf16_products") = false, py::arg("int8_products") = false,
           py::arg("f16_products") = false, "The engine over model (see pagedattn.Engine).")
      .def("add_request", &PyEngine::add_request, py::arg("prompt_token_ids"), py::arg("params"),
           "Queues a request; returns its id.")
      .def("step", &PyEngine::step,
           "Runs one iteration; returns the requests with new tokens or a finish.")
      .def(
          "abort", [](PyEngine& e, RequestId id) { e.engine().abort(id); }, ReleaseGil(),
          py::arg("request_id"),
          "Stops a request; the next step reports it with finish_reason \"aborted\".")
      .def(
          "has_unfinished", [](PyEngine& e) { return e.engine().has_unfinished(); }, ReleaseGil(),
          "Whether some request is waiting or running.")
      .def(
          "stats", [](PyEngine& e) { return e.engine().stats(); }, ReleaseGil(),
          "Counters and the KV picture after the last step.")
      .def("set_stream_callback", &PyEngine::set_stream_callback, py::arg("callback"),
           "Calls callback(output) from step() for each output as it is made (None: no\n"
           "callback); step() raises the callback's first exception.")
      .def_property_readonly(
          "num_pages", [](PyEngine& e) { return e.engine().cache().num_pages(); },
          "Pages of the KV cache.");

  m.def(
      "load_gguf_tokenizer",
      [](const std::string& path) {
        py::gil_scoped_release release;
        return Tokenizer(read_tokenizer_vocab(GgufFile::open(path)));
      },
      py::arg("path"), "The Tokenizer of a GGUF file's tokenizer.ggml.* metadata.");
  m.def(
      "load_gguf_chat_template",
      [](const std::string& path, const Tokenizer& tokenizer) {
        py::gil_scoped_release release;
        return read_chat_template(GgufFile::open(path), tokenizer);
      },
      py::arg("path"), py::arg("tokenizer"),
      "The chat template of a GGUF file (UnsupportedError when it has none).");
}

}  // namespace

void register_engine(py::module_& m) {
  register_sampling(m);
  register_engine_class(m);
}

}  // namespace pagedattn::python
