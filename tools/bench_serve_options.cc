#include "bench_serve_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <system_error>

#include "bench_serve_url.h"
#include "pagedattn/errors.h"

namespace pagedattn::tools {

const char* bench_serve_usage() {
  return "usage: pagedattn bench-serve [flags]\n"
         "  --model tiny|small|1b          built-in Llama preset, synthetic weights (default "
         "tiny)\n"
         "  --model FILE.gguf              a real Llama-family model (defaults as small)\n"
         "  --workload NAME|FILE.jsonl     sharegpt-like (default), alpaca-like, "
         "parallel-sampling,\n"
         "                                 long-context, shared-prefix, multi-turn (in-process "
         "only),\n"
         "                                 or a trace of {prompt_len, output_len, n, arrival}\n"
         "                                 (integer lengths and n; arrival: seconds in [0, "
         "86400])\n"
         "  --num-requests N               default: 300 (tiny), 16 (small), 12 (1b); at most 10^6\n"
         "  --request-rate R               Poisson arrivals, requests/s (default: all at once)\n"
         "  --kv-memory-mib M              KV cache budget, at most this machine's memory\n"
         "                                 (default: 64 tiny, 256 small, 1024 1b)\n"
         "  --page-size P                  tokens per page (default 16)\n"
         "  --max-num-seqs N               running sequences (default 256)\n"
         "  --max-num-batched-tokens N     token budget per step (default 2048)\n"
         "  --no-chunked-prefill           prompts run whole\n"
         "  --deterministic                batch-independent results\n"
         "  --shared-prefixes K            shared-prefix: distinct system prompts (default 4)\n"
         "  --shared-prefix-len L          shared-prefix: tokens per system prompt (default 1024\n"
         "                                 tiny, 512 small and .gguf, 256 1b)\n"
         "  --turns T                      multi-turn: turns per conversation (default 4); the\n"
         "                                 requests are conversations x T\n"
         "  --prefix-caching on|off        reuse cached pages of earlier prompts (default off)\n"
         "  --host-kv-memory-mib M         host-memory tier preempted sequences are swapped to\n"
         "                                 (default 0: preemption always recomputes)\n"
         "  --bf16-products                attention on bf16 dot products where the CPU has\n"
         "                                 AVX512-BF16 (inputs rounded to bf16; default off)\n"
         "  --tensor-parallel N            split the model over N MPI ranks (mpirun -np N ...)\n"
         "  --seed S                       workload and sampling seed (default 1)\n"
         "  --json FILE                    write every figure and the timeline as JSON\n"
         "                                 (FILE is opened before the run starts)\n"
         "  --quick                        a few-second run for CI (40 short requests)\n"
         "Against a running OpenAI-compatible server (pagedattn serve, llama-server, ...):\n"
         "  --url http://HOST[:PORT]       stream /v1/completions over HTTP instead of serving\n"
         "                                 in-process (--model and the engine flags do not apply;\n"
         "                                 workload defaults as for a .gguf model)\n"
         "  --concurrency N                at most N requests in flight, each on its own\n"
         "                                 connection (default: every request at its arrival;\n"
         "                                 at most 1024)\n"
         "  --model-name NAME              the requests' \"model\" (default: the first id of\n"
         "                                 GET /v1/models)\n"
         "  --api-key KEY                  sent as \"Authorization: Bearer KEY\"\n"
         "  --timeout S                    seconds to connect, and of silence in a stream, before\n"
         "                                 the request counts as failed (default 600)\n"
         "  --text-prompts                 prompts as text (about one token a word) instead of\n"
         "                                 token-id arrays\n";
}

namespace {

// The flag's value as a finite number; InvalidArgument otherwise.
double finite_number(std::string_view flag, const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  require(!text.empty() && end == text.c_str() + text.size() && std::isfinite(x),
          "bench-serve: ", flag, " = '", text, "' is not a finite number");
  return x;
}

// The flag's value as an integer in [min, max], checked before any cast.
std::int32_t bounded_integer(std::string_view flag, const std::string& text, std::int32_t min,
                             std::int32_t max) {
  const double x = finite_number(flag, text);
  require(x == std::floor(x) && x >= min && x <= max, "bench-serve: ", flag, " = '", text,
          "' must be an integer in [", min, ", ", max, "]");
  return static_cast<std::int32_t>(x);
}

std::uint64_t seed_value(std::string_view flag, const std::string& text) {
  std::uint64_t seed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seed);
  require(!text.empty() && error == std::errc() && end == text.data() + text.size(),
          "bench-serve: ", flag, " = '", text, "' must be an integer in [0, 2^64)");
  return seed;
}

bool on_off(std::string_view flag, const std::string& text) {
  require(text == "on" || text == "off", "bench-serve: ", flag, " = '", text,
          "' must be on or off");
  return text == "on";
}

}  // namespace

BenchServeOptions parse_bench_serve_options(int argc, char** argv, int first) {
  BenchServeOptions o;
  for (int i = first; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      require(i + 1 < argc, "bench-serve: ", flag, " needs a value");
      return argv[++i];
    };
    // A finite number > 0, or >= 0 when zero has a meaning (a rate of 0: all at once).
    auto number = [&](bool zero_allowed) {
      const std::string v = value();
      const double x = finite_number(flag, v);
      require(zero_allowed ? x >= 0 : x > 0, "bench-serve: ", flag, " = '", v, "' must be ",
              zero_allowed ? ">= 0" : "> 0");
      return x;
    };
    auto integer = [&](std::int32_t min, std::int32_t max) {
      return bounded_integer(flag, value(), min, max);
    };
    constexpr std::int32_t kInt32Max = std::numeric_limits<std::int32_t>::max();
    const bool engine_only =
        flag == "--model" || flag == "--kv-memory-mib" || flag == "--page-size" ||
        flag == "--max-num-seqs" || flag == "--max-num-batched-tokens" ||
        flag == "--no-chunked-prefill" || flag == "--deterministic" || flag == "--prefix-caching" ||
        flag == "--host-kv-memory-mib" || flag == "--tensor-parallel" || flag == "--bf16-products";
    const bool http_only = flag == "--concurrency" || flag == "--model-name" ||
                           flag == "--api-key" || flag == "--timeout" || flag == "--text-prompts";
    if (engine_only && o.engine_flag.empty()) o.engine_flag = flag;
    if (http_only && o.http_flag.empty()) o.http_flag = flag;
    // A value that must not be empty (an empty key or name is a shell slip).
    auto text = [&] {
      std::string v = value();
      require(!v.empty(), "bench-serve: ", flag, " needs a non-empty value");
      return v;
    };
    if (flag == "--url")
      o.url = text();
    else if (flag == "--concurrency")
      o.concurrency = integer(1, kMaxConcurrency);
    else if (flag == "--model-name")
      o.model_name = text();
    else if (flag == "--api-key")
      o.api_key = text();
    else if (flag == "--timeout")
      o.timeout_s = std::min(number(/*zero_allowed=*/false), kMaxTimeoutSeconds);
    else if (flag == "--text-prompts")
      o.text_prompts = true;
    else if (flag == "--model")
      o.model = value();
    else if (flag == "--workload")
      o.workload = value();
    else if (flag == "--num-requests")
      o.num_requests = integer(1, kMaxNumRequests);
    else if (flag == "--request-rate")
      o.request_rate = number(/*zero_allowed=*/true);
    else if (flag == "--kv-memory-mib")
      o.kv_memory_mib = number(/*zero_allowed=*/false);  // upper bound: bench_serve.cc
    else if (flag == "--page-size")
      o.page_size = integer(1, kMaxPageSize);
    else if (flag == "--max-num-seqs")
      o.max_num_seqs = integer(1, 1 << 20);
    else if (flag == "--max-num-batched-tokens")
      o.max_num_batched_tokens = integer(1, kInt32Max);
    else if (flag == "--no-chunked-prefill")
      o.chunked_prefill = false;
    else if (flag == "--deterministic")
      o.deterministic = true;
    else if (flag == "--prefix-caching")
      o.prefix_caching = on_off(flag, value());
    else if (flag == "--host-kv-memory-mib")
      o.host_kv_memory_mib = number(/*zero_allowed=*/true);
    else if (flag == "--bf16-products")
      o.bf16_products = true;
    else if (flag == "--shared-prefixes")
      o.shared_prefixes = integer(1, 1 << 20);
    else if (flag == "--shared-prefix-len")
      o.shared_prefix_len = integer(1, 1 << 24);
    else if (flag == "--turns")
      o.turns = integer(1, 1 << 16);
    else if (flag == "--tensor-parallel")
      o.tensor_parallel = integer(1, 1024);
    else if (flag == "--seed")
      o.seed = seed_value(flag, value());
    else if (flag == "--json")
      o.json = value();
    else if (flag == "--quick")
      o.quick = true;
    else if (flag == "--help" || flag == "-h")
      o.help = true;
    else
      throw InvalidArgument(detail::concat("bench-serve: unknown flag '", flag, "'"));
  }
  if (!o.url.empty()) {
    parse_server_url(o.url);  // refuses a malformed URL before anything runs
    require(o.workload != "multi-turn",
            "bench-serve: --workload multi-turn runs in-process only "
            "(its turns resend the model's output token ids, which a completions stream does "
            "not return)");
    require(o.engine_flag.empty(), "bench-serve: ", o.engine_flag,
            " configures the in-process engine; with --url the server has its own");
  }
  require(!o.url.empty() || o.http_flag.empty(), "bench-serve: ", o.http_flag,
          " needs --url (it configures the HTTP client)");
  return o;
}

}  // namespace pagedattn::tools
