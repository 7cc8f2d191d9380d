#include "generate.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_flags.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf_tokenizer.h"
#include "pagedattn/llama.h"
#include "tensor_parallel_cli.h"

namespace pagedattn::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using flags::add_bf16_products_flag, flags::add_int8_activations_flag,
    flags::add_tensor_parallel_flag, flags::integer_in, flags::number_in;

void add_sampling_flags(CLI::App& app, GenerateOptions& o) {
  app.add_option("--max-tokens", o.max_tokens, "new tokens at most")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 20));
  app.add_option("--temperature", o.temperature, "0 = greedy")
      ->type_name("T")
      ->check(number_in(0, 100));
  app.add_option("--top-p", o.top_p, "nucleus sampling, (0, 1]")
      ->type_name("P")
      ->check(number_in(1e-6, 1));
  app.add_option("--top-k", o.top_k, "0 = all tokens")
      ->type_name("K")
      ->transform(integer_in(0, 1 << 30));
  app.add_option_function<std::uint64_t>(
         "--seed", [&o](std::uint64_t seed) { o.seed = seed; }, "sampling seed")
      ->type_name("S")
      ->transform(integer_in(0, std::int64_t{1} << 53));
  app.add_flag("--ignore-eos", o.ignore_eos,
               "generate --max-tokens tokens even past end-of-text (benchmarks)");
}

// generate's flags, bound to `o` (whose initial values are the defaults).
std::unique_ptr<CLI::App> generate_flags(GenerateOptions& o) {
  auto app = flags::make_app("generate", "Text from a GGUF model, streamed as it is made.");
  app->add_option("--model", o.model, "a Llama-family GGUF model")
      ->type_name("FILE.gguf")
      ->required()
      ->check(flags::non_empty());
  app->add_option("--prompt", o.prompt, "the prompt")
      ->type_name("TEXT")
      ->required()
      ->check(flags::non_empty());
  app->add_flag("--chat", o.chat, "wrap the prompt in the model's chat template");
  app->add_flag("--parse-special,!--no-parse-special", o.parse_special,
                "control-token text in the prompt (<|im_start|>, ...) becomes control tokens, as "
                "in vLLM and llama.cpp; the --no- form keeps it plain text (default on; with "
                "--chat the prompt is a message and stays plain text)");
  app->add_option("--system", o.system, "chat: a system message (default: the template's own)")
      ->type_name("TEXT");
  add_sampling_flags(*app, o);
  app->add_option("--kv-memory-mib", o.kv_memory_mib, "KV cache budget")
      ->type_name("M")
      ->check(number_in(1, 1 << 20));
  add_tensor_parallel_flag(*app, o.tensor_parallel);
  add_int8_activations_flag(*app, o.int8_activations);
  add_bf16_products_flag(*app, o.bf16_products);
  flags::add_exact_products_flag(*app, o.exact_products);
  flags::add_pin_threads_flag(*app, o.pin_threads);
  flags::add_kv_cache_dtype_flag(*app, o.kv_dtype);
  app->add_flag("--check-tensors", o.check_tensors,
                "refuse a model whose weights hold NaN or Inf, naming the tensor (one more pass "
                "over the weights at load)");
  app->add_flag("--disaggregate", o.disaggregate,
                "under `mpirun -np 2`: rank 0 prefills, rank 1 receives the prompt's KV pages "
                "over MPI, decodes and prints (MPI builds)");
  app->footer("Text streams to stdout; timings (prefill and decode tokens/s) go to stderr.");
  return app;
}

// Tokens after which a model stops: EOS and every end-of-turn control token
// the vocabulary has.
std::vector<std::int32_t> stop_tokens(const Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  for (const char* text :
       {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>"}) {
    const std::int32_t id = tokenizer.token_id(text);
    if (id >= 0 && tokenizer.is_control(id) && id != tokenizer.eos_id()) ids.push_back(id);
  }
  return ids;
}

std::vector<std::int32_t> prompt_tokens(const GenerateOptions& o, const GgufFile& file,
                                        const Tokenizer& tokenizer) {
  if (!o.chat) return tokenizer.encode(o.prompt, {.parse_special = o.parse_special});
  const ChatTemplate chat = read_chat_template(file, tokenizer);
  std::vector<ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  messages.push_back({"user", o.prompt});
  return chat.encode(tokenizer, messages);
}

}  // namespace

GenerateOptions parse_generate_options(int argc, char** argv, int first) {
  GenerateOptions o;
  o.help = flags::parse(*generate_flags(o), argc, argv, first);
  return o;
}

std::string generate_help() {
  GenerateOptions defaults;
  return generate_flags(defaults)->help();
}

int run_generate(int argc, char** argv) {
  const GenerateOptions o = parse_generate_options(argc, argv, 2);
  if (o.help) {
    std::fputs(generate_help().c_str(), stdout);
    return 0;
  }
#ifndef PAGEDATTN_HAVE_MPI
  require<Unsupported>(!o.disaggregate,
                       "generate --disaggregate: this pagedattn was built without MPI (install "
                       "libopenmpi-dev openmpi-bin and configure with PAGEDATTN_WITH_MPI=ON)");
#endif
  const auto load_start = Clock::now();
  const GgufFile file = GgufFile::open(o.model);
  const Tokenizer tokenizer(read_tokenizer_vocab(file));
  const std::vector<std::int32_t> prompt = prompt_tokens(o, file, tokenizer);
  EngineConfig ec;
  ec.model = make_cli_model(o.tensor_parallel, o.model, [&](const TensorParallelShard& shard) {
    return make_gguf_model(file, {.shard = shard, .check_tensors = o.check_tensors});
  });
  if (ec.model == nullptr) return 0;  // a follower rank: rank 0 did the I/O
  ec.kv_memory_bytes = static_cast<std::int64_t>(o.kv_memory_mib * (1 << 20));
  ec.int8_activations = o.int8_activations;
  ec.bf16_products = o.bf16_products;
  ec.exact_products = o.exact_products;
  ec.pin_threads = o.pin_threads;
  ec.kv_dtype = o.kv_dtype;
  SamplingParams params;
  params.max_tokens = o.max_tokens;
  params.temperature = o.temperature;
  params.top_p = o.top_p;
  params.top_k = o.top_k;
  params.seed = o.seed;
  if (o.ignore_eos)
    params.ignore_eos = true;
  else
    params.stop_token_ids = stop_tokens(tokenizer);
#ifdef PAGEDATTN_HAVE_MPI
  if (o.disaggregate) return run_generate_disaggregated(ec, prompt, params, tokenizer);
#endif
  Engine engine(ec);
  const double load_seconds = seconds_since(load_start);
  StreamingDecoder text(tokenizer, {.render_special = false});
  std::int64_t generated = 0;
  double first_token_seconds = 0.0;
  const auto start = Clock::now();
  engine.add_request(prompt, params);
  std::string error;  // the engine ended the request (FinishReason::kError)
  while (engine.has_unfinished())
    for (const RequestOutput& out : engine.step()) {
      if (!out.error.empty()) error = out.error;
      for (const SampleOutput& sample : out.samples)
        for (std::int32_t id : sample.new_token_ids) {
          if (generated++ == 0) first_token_seconds = seconds_since(start);
          std::fputs(text.push(id).c_str(), stdout);
          std::fflush(stdout);
        }
    }
  std::fputs(text.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!error.empty()) {
    std::fprintf(stderr, "pagedattn generate: %s\n", error.c_str());
    return 1;
  }
  const double total = seconds_since(start);
  const double decode_seconds = total - first_token_seconds;
  std::fprintf(stderr,
               "[%s: loaded in %.2f s | prompt %zu tokens, prefill %.1f ms = %.1f tokens/s | "
               "%lld new tokens, decode %.1f tokens/s]\n",
               engine.config().model->spec().name.c_str(), load_seconds, prompt.size(),
               first_token_seconds * 1e3, double(prompt.size()) / first_token_seconds,
               static_cast<long long>(generated),
               generated > 1 ? double(generated - 1) / decode_seconds : 0.0);
  const TensorParallelTimes tp = tensor_parallel_times();
  if (tp.size > 1)
    std::fprintf(stderr,
                 "[tensor parallel %d: %lld all-reduces, %.1f ms = %.1f%% of the run; "
                 "step broadcasts %.1f ms]\n",
                 tp.size, static_cast<long long>(tp.all_reduce_calls), tp.all_reduce_seconds * 1e3,
                 100.0 * tp.all_reduce_seconds / total, tp.broadcast_seconds * 1e3);
  return 0;
}

}  // namespace pagedattn::tools
