#include "generate.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

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

// A finite number in [min, max] (the whole text must parse).
double parse_number(std::string_view flag, const std::string& text, double min, double max) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  require(end != text.c_str() && *end == '\0' && std::isfinite(x) && x >= min && x <= max,
          "generate: ", flag, " = '", text, "' is not a number in [", min, ", ", max, "]");
  return x;
}

std::int64_t parse_integer(std::string_view flag, const std::string& text, double min, double max) {
  const double x = parse_number(flag, text, min, max);
  require(x == std::floor(x), "generate: ", flag, " = '", text, "' is not an integer");
  return static_cast<std::int64_t>(x);
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
  if (!o.chat) return tokenizer.encode(o.prompt);
  const ChatTemplate chat = read_chat_template(file, tokenizer);
  std::vector<ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  messages.push_back({"user", o.prompt});
  return tokenizer.encode(chat.render(messages, true),
                          {.add_special = false, .parse_special = true});
}

}  // namespace

const char* generate_usage() {
  return "usage: pagedattn generate --model FILE.gguf --prompt TEXT [flags]\n"
         "  --chat               wrap the prompt in the model's chat template\n"
         "  --system TEXT        chat: a system message (default: the template's own)\n"
         "  --max-tokens N       new tokens at most (default 128)\n"
         "  --temperature T      0 = greedy (default 0)\n"
         "  --top-p P            nucleus sampling, (0, 1] (default 1)\n"
         "  --top-k K            0 = all tokens (default 0)\n"
         "  --seed S             sampling seed\n"
         "  --kv-memory-mib M    KV cache budget (default 256)\n"
         "  --ignore-eos         generate --max-tokens tokens even past end-of-text (benchmarks)\n"
         "  --tensor-parallel N  split the model over N MPI ranks:\n"
         "                       mpirun -np N pagedattn generate --tensor-parallel N ...\n"
         "  --disaggregate       under `mpirun -np 2`: rank 0 prefills, rank 1 receives the\n"
         "                       prompt's KV pages over MPI, decodes and prints (MPI builds)\n"
         "Text streams to stdout; timings (prefill and decode tokens/s) go to stderr.\n";
}

GenerateOptions parse_generate_options(int argc, char** argv, int first) {
  GenerateOptions o;
  for (int i = first; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      require(i + 1 < argc, "generate: ", flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--model")
      o.model = value();
    else if (flag == "--prompt")
      o.prompt = value();
    else if (flag == "--chat")
      o.chat = true;
    else if (flag == "--system")
      o.system = value();
    else if (flag == "--max-tokens")
      o.max_tokens = static_cast<std::int32_t>(parse_integer(flag, value(), 1, 1 << 20));
    else if (flag == "--temperature")
      o.temperature = static_cast<float>(parse_number(flag, value(), 0, 100));
    else if (flag == "--top-p")
      o.top_p = static_cast<float>(parse_number(flag, value(), 1e-6, 1));
    else if (flag == "--top-k")
      o.top_k = static_cast<std::int32_t>(parse_integer(flag, value(), 0, 1 << 30));
    else if (flag == "--seed")
      o.seed = static_cast<std::uint64_t>(parse_integer(flag, value(), 0, 9007199254740992.0));
    else if (flag == "--kv-memory-mib")
      o.kv_memory_mib = parse_number(flag, value(), 1, 1 << 20);
    else if (flag == "--ignore-eos")
      o.ignore_eos = true;
    else if (flag == "--tensor-parallel")
      o.tensor_parallel = static_cast<std::int32_t>(parse_integer(flag, value(), 1, 1024));
    else if (flag == "--disaggregate")
      o.disaggregate = true;
    else if (flag == "--help" || flag == "-h")
      o.help = true;
    else
      throw InvalidArgument(detail::concat("generate: unknown flag '", flag, "'"));
  }
  if (o.help) return o;
  require(!o.model.empty(), "generate: --model FILE.gguf is required");
  require(!o.prompt.empty(), "generate: --prompt TEXT is required (and must not be empty)");
  return o;
}

int run_generate(int argc, char** argv) {
  const GenerateOptions o = parse_generate_options(argc, argv, 2);
  if (o.help) {
    std::fputs(generate_usage(), stdout);
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
    return make_gguf_model(file, {.shard = shard});
  });
  if (ec.model == nullptr) return 0;  // a follower rank: rank 0 did the I/O
  ec.kv_memory_bytes = static_cast<std::int64_t>(o.kv_memory_mib * (1 << 20));
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
  while (engine.has_unfinished())
    for (const RequestOutput& out : engine.step())
      for (const SampleOutput& sample : out.samples)
        for (std::int32_t id : sample.new_token_ids) {
          if (generated++ == 0) first_token_seconds = seconds_since(start);
          std::fputs(text.push(id).c_str(), stdout);
          std::fflush(stdout);
        }
  std::fputs(text.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
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
