#include "bench_serve_options.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "bench_serve_url.h"
#include "cli_flags.h"
#include "pagedattn/errors.h"

namespace pagedattn::tools {
namespace {

using flags::integer_in;

// The --help groups of the flags that apply only in-process or only with --url.
const std::string kEngineGroup = "In-process engine (not with --url)";
const std::string kServerGroup =
    "Against a running OpenAI-compatible server (pagedattn serve, llama-server, ...)";

void add_workload_flags(CLI::App& app, BenchServeOptions& o) {
  app.add_option("--workload", o.workload,
                 "sharegpt-like, alpaca-like, parallel-sampling, long-context, shared-prefix, "
                 "multi-turn (in-process only), or a trace of {prompt_len, output_len, n, "
                 "arrival} (integer lengths and n; arrival: seconds in [0, 86400])")
      ->type_name("NAME|FILE.jsonl");
  app.add_option("--num-requests", o.num_requests,
                 "requests (default: 300 tiny, 16 small and .gguf, 12 1b; 40 with --quick)")
      ->type_name("N")
      ->transform(integer_in(1, kMaxNumRequests))
      ->default_str("");
  app.add_option("--request-rate", o.request_rate,
                 "Poisson arrivals, requests/s (default: all at once)")
      ->type_name("R")
      ->check(flags::number_in(0))
      ->default_str("");
  app.add_option("--shared-prefixes", o.shared_prefixes, "shared-prefix: distinct system prompts")
      ->type_name("K")
      ->transform(integer_in(1, 1 << 20));
  app.add_option("--shared-prefix-len", o.shared_prefix_len,
                 "shared-prefix: tokens per system prompt (default: 1024 tiny, 512 small and "
                 ".gguf, 256 1b)")
      ->type_name("L")
      ->transform(integer_in(1, 1 << 24))
      ->default_str("");
  app.add_option("--turns", o.turns,
                 "multi-turn: turns per conversation; the requests are conversations x T")
      ->type_name("T")
      ->transform(integer_in(1, 1 << 16));
  app.add_option("--seed", o.seed,
                 "workload and sampling seed; with --url also the prompts' token ids (seed 1: "
                 "those of the in-process run)")
      ->type_name("S")
      ->check(flags::any_uint64());
  app.add_option("--json", o.json,
                 "write every figure and the timeline as JSON (FILE is opened before the run "
                 "starts)")
      ->type_name("FILE");
  app.add_flag("--quick", o.quick, "a few-second run for CI (40 short requests)");
}

void add_engine_flags(CLI::App& app, BenchServeOptions& o) {
  app.add_option("--model", o.model,
                 "a built-in Llama preset with synthetic weights (tiny, small, 1b), or a real "
                 "Llama-family model (workload defaults as for small)")
      ->type_name("PRESET|FILE.gguf");
  app.add_option("--kv-memory-mib", o.kv_memory_mib,
                 "KV cache budget, at most this machine's memory (default: 64 tiny, 256 small "
                 "and .gguf, 1024 1b)")
      ->type_name("M")
      ->check(flags::positive())  // upper bound: bench_serve.cc
      ->default_str("");
  app.add_option("--page-size", o.page_size, "tokens per page")
      ->type_name("P")
      ->transform(integer_in(1, kMaxPageSize));
  app.add_option("--max-num-seqs", o.max_num_seqs, "running sequences")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 20));
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token budget per step")
      ->type_name("N")
      ->transform(integer_in(1, std::numeric_limits<std::int32_t>::max()));
  app.add_flag("!--no-chunked-prefill", o.chunked_prefill, "prompts run whole");
  app.add_flag("--deterministic", o.deterministic, "batch-independent results");
  app.add_option("--prefix-caching", o.prefix_caching, "reuse cached pages of earlier prompts")
      ->type_name("on|off")
      ->check(flags::one_of({"on", "off"}))
      ->default_str("off");
  app.add_option("--host-kv-memory-mib", o.host_kv_memory_mib,
                 "host-memory tier preempted sequences are swapped to; 0: none, preemption "
                 "always recomputes")
      ->type_name("M")
      ->check(flags::number_in(0));
  flags::add_bf16_products_flag(app, o.bf16_products);
  flags::add_exact_products_flag(app, o.exact_products);
  flags::add_pin_threads_flag(app, o.pin_threads);
  flags::add_kv_cache_dtype_flag(app, o.kv_dtype);
  flags::add_int8_activations_flag(app, o.int8_activations);
  flags::add_tensor_parallel_flag(app, o.tensor_parallel);
  app.add_flag("--probes", o.probes,
               "also measure this machine's read bandwidth and FMA peak (a few seconds; "
               "shorter with --quick) and report the decode step against those bounds "
               "(bench/scaling.sh)");
}

void add_server_flags(CLI::App& app, BenchServeOptions& o) {
  app.add_option("--url", o.url,
                 "stream /v1/completions over HTTP instead of serving in-process (the workload "
                 "is sized as for a .gguf model)")
      ->type_name("http://HOST[:PORT]")
      ->check(flags::non_empty());
  app.add_option("--concurrency", o.concurrency,
                 "at most N requests in flight, each on its own connection (default: every "
                 "request at its arrival)")
      ->type_name("N")
      ->transform(integer_in(1, kMaxConcurrency))
      ->default_str("");
  app.add_option("--model-name", o.model_name,
                 "the requests' \"model\" (default: the first id of GET /v1/models)")
      ->type_name("NAME")
      ->check(flags::non_empty());
  app.add_option("--api-key", o.api_key, "sent as \"Authorization: Bearer KEY\"")
      ->type_name("KEY")
      ->check(flags::non_empty());
  app.add_option("--timeout", o.timeout_s,
                 "seconds to connect, and of silence in a stream, before the request counts as "
                 "failed")
      ->type_name("S")
      ->check(flags::positive());
  app.add_flag("--text-prompts", o.text_prompts,
               "prompts as text (about one token a word) instead of token-id arrays");
}

// bench-serve's flags, bound to `o` (whose initial values are the defaults).
std::unique_ptr<CLI::App> bench_serve_flags(BenchServeOptions& o) {
  auto app = flags::make_app(
      "bench-serve",
      "Serve a workload through the continuous-batching engine in real time and report "
      "throughput, latency and KV memory efficiency.");
  add_workload_flags(*app, o);
  app->option_defaults()->group(kEngineGroup);
  add_engine_flags(*app, o);
  app->option_defaults()->group(kServerGroup);
  add_server_flags(*app, o);
  return app;
}

// The first flag of `group` on the command line (other than `except`), "" if none.
std::string first_given(const CLI::App& app, const std::string& group,
                        const std::string& except = "") {
  for (const CLI::Option* opt : app.parse_order())
    if (opt->get_group() == group && opt->get_name() != except) return opt->get_name();
  return "";
}

// The engine flags configure the in-process engine, the HTTP ones the client
// of --url: each set needs its mode.
void check_mode_flags(const CLI::App& app, const BenchServeOptions& o) {
  if (!o.url.empty()) {
    parse_server_url(o.url);  // refuses a malformed URL before anything runs
    require(o.workload != "multi-turn",
            "bench-serve: --workload multi-turn runs in-process only "
            "(its turns resend the model's output token ids, which a completions stream does "
            "not return)");
    const std::string engine_flag = first_given(app, kEngineGroup);
    require(engine_flag.empty(), "bench-serve: ", engine_flag,
            " configures the in-process engine; with --url the server has its own");
  }
  const std::string http_flag = first_given(app, kServerGroup, "--url");
  require(!o.url.empty() || http_flag.empty(), "bench-serve: ", http_flag,
          " needs --url (it configures the HTTP client)");
}

}  // namespace

BenchServeOptions parse_bench_serve_options(int argc, char** argv, int first) {
  BenchServeOptions o;
  const std::unique_ptr<CLI::App> app = bench_serve_flags(o);
  o.help = flags::parse(*app, argc, argv, first);
  if (o.help) return o;
  check_mode_flags(*app, o);
  o.timeout_s = std::min(o.timeout_s, kMaxTimeoutSeconds);
  return o;
}

std::string bench_serve_help() {
  BenchServeOptions defaults;
  return bench_serve_flags(defaults)->help();
}

}  // namespace pagedattn::tools
