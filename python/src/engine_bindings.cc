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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
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

// vLLM spells "all tokens" top_k = -1 as well as 0; the engine takes 0.
void normalize_vllm_spellings(SamplingParams& p) {
  if (p.top_k == -1) p.top_k = 0;
}

using LogitBias = std::vector<std::pair<std::int32_t, float>>;
using LogitBiasDict = std::map<std::int32_t, float>;

// SamplingParams.stop: one string, a list of them, or None.
struct StopHint {
  static constexpr auto name = py::detail::const_name("str | collections.abc.Sequence[str] | None");
};
using StopArg = Typed<StopHint>;

std::vector<std::string> stop_strings(const StopArg& stop) {
  if (stop.is_none()) return {};
  if (py::isinstance<py::str>(stop)) return {stop.cast<std::string>()};
  if (py::isinstance<py::bytes>(stop) || !py::isinstance<py::sequence>(stop))
    throw py::type_error("SamplingParams: stop must be a str, a list of str or None");
  std::vector<std::string> strings;
  for (const py::handle item : stop) {
    if (!py::isinstance<py::str>(item))
      throw py::type_error(detail::concat("SamplingParams: stop[", strings.size(),
                                          "] must be a str, not ", Py_TYPE(item.ptr())->tp_name));
    strings.push_back(item.cast<std::string>());
  }
  return strings;
}

// Python exposes logit_bias as vLLM and OpenAI write it, {token_id: bias}.
// A dict cannot repeat a token, and the sorted list keeps == and pickling
// independent of the order the dict was written in.
LogitBias logit_bias_list(const LogitBiasDict& bias) {
  return {bias.begin(), bias.end()};
}
LogitBiasDict logit_bias_dict(const LogitBias& bias) {
  return {bias.begin(), bias.end()};
}

// A field's Python value: logit_bias as a dict, the others as they are.
template <typename T>
const T& python_value(const T& value) {
  return value;
}
LogitBiasDict python_value(const LogitBias& value) {
  return logit_bias_dict(value);
}
// The Python type a field is set from, and its conversion: logit_bias from
// a dict or None, stop from a str, a list of str or None.
template <typename T>
struct FieldArg {
  using type = T;
  static T convert(T value) { return value; }
};
template <>
struct FieldArg<LogitBias> {
  using type = std::optional<LogitBiasDict>;
  static LogitBias convert(const type& value) {
    return value ? logit_bias_list(*value) : LogitBias{};
  }
};
template <>
struct FieldArg<std::vector<std::string>> {
  using type = StopArg;
  static std::vector<std::string> convert(const StopArg& value) { return stop_strings(value); }
};

// Every field of SamplingParams with its docstring, in declaration order:
// visit(name, member pointer, doc). Equality, pickling, repr and the
// properties all go through this one list.
template <typename Visit>
void for_each_sampling_field(Visit&& visit) {
  using P = SamplingParams;
  visit("max_tokens", &P::max_tokens, "New tokens per sample, >= 1.");
  visit("temperature", &P::temperature, "0: greedy (argmax, lowest token id on ties).");
  visit("top_k", &P::top_k, "0 (or -1, taken as 0): all tokens.");
  visit("top_p", &P::top_p, "Nucleus sampling threshold in (0, 1].");
  visit("n", &P::n, "Parallel samples sharing the prompt's pages, [1, 256].");
  visit("seed", &P::seed, "Sampling seed; None derives one from the engine seed and request id.");
  visit("stop_token_ids", &P::stop_token_ids, "Tokens that end a sample (kept in its token ids).");
  visit("ignore_eos", &P::ignore_eos, "Keep sampling past EOS.");
  visit("cache_salt", &P::cache_salt,
        "Prefix caching: only requests with the same salt share cached pages.");
  visit("repetition_penalty", &P::repetition_penalty,
        "> 0, 1 = off: logits of tokens in the prompt or output so far are divided\n"
        "by it when positive, multiplied when negative.");
  visit("presence_penalty", &P::presence_penalty,
        "[-2, 2]: subtracted once from the logit of every token already output.");
  visit("frequency_penalty", &P::frequency_penalty,
        "[-2, 2]: subtracted from a token's logit once per time it was output.");
  visit("min_p", &P::min_p,
        "[0, 1], 0 = off: tokens less likely than min_p x the most likely one's\n"
        "probability are dropped (after temperature).");
  visit("min_tokens", &P::min_tokens,
        "[0, max_tokens]: EOS and stop_token_ids cannot end a sample before it has\n"
        "this many new tokens.");
  visit("logit_bias", &P::logit_bias,
        "{token_id: bias in [-100, 100]} added to the logits first (a copy: assign a\n"
        "new dict to change it).");
  visit("logprobs", &P::logprobs,
        "[0, 20] or None: report each new token's log-probability with this many most\n"
        "likely tokens (SampleOutput.logprobs).");
  visit("prompt_logprobs", &P::prompt_logprobs,
        "[0, 20] or None: the same for prompt tokens 1.. (RequestOutput.prompt_logprobs);\n"
        "the request then takes no cached prefix.");
  visit("stop", &P::stop,
        "Strings that end a sample where its text contains them (applied by LLM and\n"
        "the server, which turn tokens into text; the engine does not read them).");
  visit("include_stop_str_in_output", &P::include_stop_str_in_output,
        "Keep the stop string that ended a sample at the end of its text.");
}

bool same_sampling_params(const SamplingParams& a, const SamplingParams& b) {
  bool same = true;
  for_each_sampling_field(
      [&](const char*, auto member, const char*) { same = same && a.*member == b.*member; });
  return same;
}

// {field name: Python value} of every field: the pickled state.
py::dict sampling_state(const SamplingParams& p) {
  py::dict state;
  for_each_sampling_field([&](const char* name, auto member, const char*) {
    state[name] = py::cast(python_value(p.*member));
  });
  return state;
}

SamplingParams sampling_from_state(const py::dict& state) {
  SamplingParams p;
  for_each_sampling_field([&](const char* name, auto member, const char*) {
    using T = std::remove_cvref_t<decltype(p.*member)>;
    if (state.contains(name))
      p.*member = FieldArg<T>::convert(state[name].template cast<typename FieldArg<T>::type>());
  });
  check_sampling_params(p);
  return p;
}

template <typename T>
std::string field_repr(const T& value) {
  const py::str text = py::repr(py::cast(python_value(value)));
  return text.cast<std::string>();
}
// 0.9, not the float32 value's full expansion 0.8999999761581543.
std::string field_repr(float value) {
  return detail::concat(value);
}

// SamplingParams(field=value, ...) of the fields that differ from the defaults.
std::string sampling_repr(const SamplingParams& p) {
  const SamplingParams defaults;
  std::string fields;
  for_each_sampling_field([&](const char* name, auto member, const char*) {
    if (p.*member == defaults.*member) return;
    if (!fields.empty()) fields += ", ";
    fields += detail::concat(name, "=", field_repr(p.*member));
  });
  return "SamplingParams(" + fields + ")";
}

std::string token_logprobs_repr(const TokenLogprobs& t) {
  return detail::concat("TokenLogprobs(token=", t.token, ", logprob=", t.logprob, ", rank=", t.rank,
                        ", top=", py::repr(py::cast(t.top)).cast<std::string>(), ")");
}

void register_sampling_params(py::module_& m) {
  py::class_<SamplingParams> cls(
      m, "SamplingParams",
      "How a request samples: vLLM's SamplingParams (docs/python.md lists what differs).\n\n"
      "Every field is a keyword argument; the values are checked when the object is\n"
      "made and when a field is set (InvalidArgumentError naming the field). Per step\n"
      "a sample's logits go through logit_bias, min_tokens, the repetition / frequency /\n"
      "presence penalties, then greedy argmax (temperature 0) or temperature, min_p,\n"
      "top_k and top_p. stop strings are applied by LLM and the server. Picklable,\n"
      "copyable; == compares every field.");
  cls.def(py::init([](std::int32_t max_tokens, float temperature, std::int32_t top_k, float top_p,
                      std::int32_t n, std::optional<std::uint64_t> seed,
                      std::optional<std::vector<std::int32_t>> stop_token_ids, bool ignore_eos,
                      std::uint64_t cache_salt, float repetition_penalty, float presence_penalty,
                      float frequency_penalty, float min_p, std::int32_t min_tokens,
                      std::optional<LogitBiasDict> logit_bias, std::optional<std::int32_t> logprobs,
                      std::optional<std::int32_t> prompt_logprobs, const StopArg& stop,
                      bool include_stop_str_in_output) {
            SamplingParams p;
            p.max_tokens = max_tokens;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.n = n;
            p.seed = seed;
            p.stop_token_ids = stop_token_ids.value_or(std::vector<std::int32_t>{});
            p.ignore_eos = ignore_eos;
            p.cache_salt = cache_salt;
            p.repetition_penalty = repetition_penalty;
            p.presence_penalty = presence_penalty;
            p.frequency_penalty = frequency_penalty;
            p.min_p = min_p;
            p.min_tokens = min_tokens;
            if (logit_bias) p.logit_bias = logit_bias_list(*logit_bias);
            p.logprobs = logprobs;
            p.prompt_logprobs = prompt_logprobs;
            p.stop = stop_strings(stop);
            p.include_stop_str_in_output = include_stop_str_in_output;
            normalize_vllm_spellings(p);
            check_sampling_params(p);
            return p;
          }),
          py::kw_only(), py::arg("max_tokens") = 16, py::arg("temperature") = 0.0f,
          py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("n") = 1,
          py::arg("seed") = py::none(), py::arg("stop_token_ids") = py::none(),
          py::arg("ignore_eos") = false, py::arg("cache_salt") = 0,
          py::arg("repetition_penalty") = 1.0f, py::arg("presence_penalty") = 0.0f,
          py::arg("frequency_penalty") = 0.0f, py::arg("min_p") = 0.0f, py::arg("min_tokens") = 0,
          py::arg("logit_bias") = py::none(), py::arg("logprobs") = py::none(),
          py::arg("prompt_logprobs") = py::none(), py::arg("stop") = py::none(),
          py::arg("include_stop_str_in_output") = false);
  for_each_sampling_field([&](const char* name, auto member, const char* doc) {
    using T = std::remove_cvref_t<decltype(SamplingParams{}.*member)>;
    using Python = std::remove_cvref_t<decltype(python_value(std::declval<const T&>()))>;
    cls.def_property(
        name, [member](const SamplingParams& p) -> Python { return python_value(p.*member); },
        [member](SamplingParams& p, const typename FieldArg<T>::type& value) {
          SamplingParams changed = p;  // p stays as it was if the value is refused
          changed.*member = FieldArg<T>::convert(value);
          normalize_vllm_spellings(changed);
          check_sampling_params(changed);
          p = std::move(changed);
        },
        doc);
  });
  cls.def(py::pickle(&sampling_state, &sampling_from_state), py::arg("state"))
      .def("__copy__", [](const SamplingParams& p) { return p; })
      .def(
          "__deepcopy__", [](const SamplingParams& p, const py::dict&) { return p; },
          py::arg("memo"))
      .def("__eq__", &same_sampling_params, py::is_operator(), py::arg("other"))
      .def("__repr__", &sampling_repr);
}

void register_sampling(py::module_& m) {
  register_sampling_params(m);

  py::class_<TokenLogprobs>(
      m, "TokenLogprobs",
      "Log-probabilities (natural log) of one token position under the model's raw\n"
      "distribution: the log-softmax of its logits before bias, penalties, temperature\n"
      "and truncation (vLLM's default raw logprobs).")
      .def_readonly("token", &TokenLogprobs::token,
                    "The token that came (sampled, or the prompt's).")
      .def_readonly("logprob", &TokenLogprobs::logprob, "Log-probability of token.")
      .def_readonly("rank", &TokenLogprobs::rank,
                    "1 + the number of tokens with a larger log-probability.")
      .def_readonly("top", &TokenLogprobs::top,
                    "The k most likely (token, logprob), most likely first, the lower id first\n"
                    "on ties (k: SamplingParams.logprobs or prompt_logprobs).")
      .def("__repr__", &token_logprobs_repr);

  py::class_<SampleOutput>(m, "SampleOutput", "One sample's news in one step.")
      .def_readonly("index", &SampleOutput::index, "Sample index in [0, n).")
      .def_readonly("new_token_ids", &SampleOutput::new_token_ids, "Tokens produced this step.")
      .def_property_readonly(
          "finish_reason", [](const SampleOutput& s) { return finish_reason(s.finish_reason); },
          "None while running, else \"length\", \"stop\", \"abort\" or \"error\" (the\n"
          "model's logits were NaN or Inf: RequestOutput.error says where).")
      .def_readonly("logprobs", &SampleOutput::logprobs,
                    "With SamplingParams.logprobs: one TokenLogprobs per new token, in order;\n"
                    "else empty.");

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
          "logits: the request, engine step, sample and how many were NaN / Inf).")
      .def_readonly("prompt_logprobs", &RequestOutput::prompt_logprobs,
                    "With SamplingParams.prompt_logprobs: entry i is prompt token i + 1's\n"
                    "TokenLogprobs (the first token has no context), all in the request's\n"
                    "first output that carries tokens; empty in the others.");
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
                       bool bf16_products, bool int8_products, bool f16_products,
                       bool int8_activations, bool exact_products, bool pin_threads) {
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
             c.int8_activations = int8_activations;
             c.exact_products = exact_products;
             c.pin_threads = pin_threads;
             return std::make_unique<PyEngine>(c);
           }),
           py::arg("model"), py::kw_only(), py::arg("kv_memory_bytes"), py::arg("page_size"),
           py::arg("kv_dtype"), py::arg("max_num_seqs"), py::arg("max_num_batched_tokens"),
           py::arg("chunked_prefill"), py::arg("deterministic"), py::arg("seed"),
           py::arg("enable_prefix_caching") = false, py::arg("host_kv_memory_bytes") = 0,
           py::arg("bf16_products") = false, py::arg("int8_products") = false,
           py::arg("f16_products") = false, py::arg("int8_activations") = false,
           py::arg("exact_products") = false, py::arg("pin_threads") = false,
           "The engine over model (see pagedattn.Engine).")
      .def("add_request", &PyEngine::add_request, py::arg("prompt_token_ids"), py::arg("params"),
           "Queues a request; returns its id.")
      .def("step", &PyEngine::step,
           "Runs one iteration; returns the requests with new tokens or a finish.")
      .def(
          "abort", [](PyEngine& e, RequestId id) { e.engine().abort(id); }, ReleaseGil(),
          py::arg("request_id"),
          "Stops a request; the next step reports it with finish_reason \"abort\".")
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
