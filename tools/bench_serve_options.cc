#include "bench_serve_options.h"

#include <cstring>
#include <string_view>

#include "pagedattn/errors.h"

namespace pagedattn::tools {

const char* bench_serve_usage() {
  return "usage: pagedattn bench-serve [flags]\n"
         "  --model tiny|small|1b          built-in Llama preset, synthetic weights (default tiny)\n"
         "  --workload NAME|FILE.jsonl     sharegpt-like (default), alpaca-like, parallel-sampling,\n"
         "                                 long-context, or a trace of {prompt_len, output_len, n, arrival}\n"
         "  --num-requests N               default: 300 (tiny), 16 (small), 12 (1b)\n"
         "  --request-rate R               Poisson arrivals, requests/s (default: all at once)\n"
         "  --kv-memory-mib M              KV cache budget (default: 64 tiny, 256 small, 1024 1b)\n"
         "  --page-size P                  tokens per page (default 16)\n"
         "  --max-num-seqs N               running sequences (default 256)\n"
         "  --max-num-batched-tokens N     token budget per step (default 2048)\n"
         "  --no-chunked-prefill           prompts run whole\n"
         "  --deterministic                batch-independent results\n"
         "  --seed S                       workload and sampling seed (default 1)\n"
         "  --json FILE                    write every figure and the timeline as JSON\n"
         "  --quick                        a few-second run for CI (40 short requests)\n";
}

BenchServeOptions parse_bench_serve_options(int argc, char** argv, int first) {
  BenchServeOptions o;
  for (int i = first; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      require(i + 1 < argc, "bench-serve: ", flag, " needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      require(end != v.c_str() && *end == '\0' && x >= 0, "bench-serve: ", flag, " = '", v,
              "' is not a non-negative number");
      return x;
    };
    auto integer = [&](std::int32_t min) {
      const double x = number();
      require(x == static_cast<std::int32_t>(x) && x >= min, "bench-serve: ", flag, " = ", x,
              " must be an integer >= ", min);
      return static_cast<std::int32_t>(x);
    };
    if (flag == "--model") o.model = value();
    else if (flag == "--workload") o.workload = value();
    else if (flag == "--num-requests") o.num_requests = integer(1);
    else if (flag == "--request-rate") o.request_rate = number();
    else if (flag == "--kv-memory-mib") o.kv_memory_mib = number();
    else if (flag == "--page-size") o.page_size = integer(1);
    else if (flag == "--max-num-seqs") o.max_num_seqs = integer(1);
    else if (flag == "--max-num-batched-tokens") o.max_num_batched_tokens = integer(1);
    else if (flag == "--no-chunked-prefill") o.chunked_prefill = false;
    else if (flag == "--deterministic") o.deterministic = true;
    else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(number());
    else if (flag == "--json") o.json = value();
    else if (flag == "--quick") o.quick = true;
    else if (flag == "--help" || flag == "-h") o.help = true;
    else throw InvalidArgument(detail::concat("bench-serve: unknown flag '", flag, "'"));
  }
  return o;
}

}  // namespace pagedattn::tools
