// The subcommands' flag parsing (tools/cli_flags.h, CLI11), through
// bench-serve's flags: values, defaults, --help, and refusals that name the
// flag and the value.
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench_serve_options.h"
#include "cli_flags.h"
#include "pagedattn/errors.h"

namespace pagedattn::tools {
namespace {

// parse_bench_serve_options over `pagedattn bench-serve ARGS...`.
BenchServeOptions bench_serve(std::initializer_list<const char*> args) {
  std::vector<char*> argv = {const_cast<char*>("pagedattn"), const_cast<char*>("bench-serve")};
  for (const char* a : args) argv.push_back(const_cast<char*>(a));
  return parse_bench_serve_options(static_cast<int>(argv.size()), argv.data(), 2);
}

// The InvalidArgument message parsing ARGS throws ("" if none).
std::string refusal(std::initializer_list<const char*> args) {
  try {
    bench_serve(args);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CliFlags, DefaultsAreTheStructs) {
  const BenchServeOptions o = bench_serve({});
  const BenchServeOptions d;
  EXPECT_EQ(o.model, d.model);
  EXPECT_EQ(o.page_size, d.page_size);
  EXPECT_EQ(o.timeout_s, d.timeout_s);
  EXPECT_EQ(o.chunked_prefill, d.chunked_prefill);
  EXPECT_FALSE(o.help);
}

TEST(CliFlags, ValuesReachTheFields) {
  const BenchServeOptions o =
      bench_serve({"--model", "small", "--num-requests=1e3", "--page-size", "32.0", "--seed",
                   "18446744073709551615", "--prefix-caching", "on", "--no-chunked-prefill",
                   "--request-rate", "2.5", "--workload", "multi-turn", "--turns", "3"});
  EXPECT_EQ(o.model, "small");
  EXPECT_EQ(o.num_requests, 1000);  // integer-valued numbers count as integers
  EXPECT_EQ(o.page_size, 32);
  EXPECT_EQ(o.seed, 18446744073709551615u);
  EXPECT_TRUE(o.prefix_caching);
  EXPECT_FALSE(o.chunked_prefill);
  EXPECT_EQ(o.request_rate, 2.5);
  EXPECT_EQ(o.turns, 3);
}

TEST(CliFlags, KvCacheDtypeTakesVllmsFp8AndTheShortNames) {
  EXPECT_EQ(bench_serve({}).kv_dtype, DType::kF16);
  EXPECT_EQ(bench_serve({"--kv-cache-dtype", "fp8"}).kv_dtype, DType::kFP8E4M3);
  EXPECT_EQ(bench_serve({"--kv-cache-dtype", "fp8_e5m2"}).kv_dtype, DType::kFP8E5M2);
  EXPECT_EQ(bench_serve({"--kv-cache-dtype=int8"}).kv_dtype, DType::kINT8);
  EXPECT_EQ(bench_serve({"--kv-cache-dtype", "bf16", "--exact-products", "--pin-threads"}).kv_dtype,
            DType::kBF16);
  EXPECT_EQ(refusal({"--kv-cache-dtype", "float16"}),
            "bench-serve: --kv-cache-dtype = 'float16' must be f16, bf16, f32, fp8, fp8_e4m3, "
            "fp8_e5m2 or int8");
}

TEST(CliFlags, LastOfARepeatedFlagWins) {
  const BenchServeOptions o = bench_serve({"--page-size", "8", "--page-size", "64",
                                           "--prefix-caching", "on", "--prefix-caching", "off"});
  EXPECT_EQ(o.page_size, 64);
  EXPECT_FALSE(o.prefix_caching);
}

TEST(CliFlags, HttpFlagsWithUrl) {
  const BenchServeOptions o = bench_serve({"--url", "http://localhost:8000", "--concurrency", "4",
                                           "--timeout", "1e9", "--text-prompts"});
  EXPECT_EQ(o.url, "http://localhost:8000");
  EXPECT_EQ(o.concurrency, 4);
  EXPECT_EQ(o.timeout_s, kMaxTimeoutSeconds);  // capped
  EXPECT_TRUE(o.text_prompts);
}

TEST(CliFlags, RefusalsNameTheFlagAndTheValue) {
  EXPECT_EQ(refusal({"--turns", "0"}),
            "bench-serve: --turns = '0' must be an integer in [1, 65536]");
  EXPECT_EQ(refusal({"--page-size", "16.5"}),
            "bench-serve: --page-size = '16.5' must be an integer in [1, 65536]");
  EXPECT_EQ(refusal({"--request-rate", "-1"}), "bench-serve: --request-rate = '-1' must be >= 0");
  EXPECT_EQ(refusal({"--timeout", "0"}), "bench-serve: --timeout = '0' must be > 0");
  EXPECT_EQ(refusal({"--kv-memory-mib", "nan"}),
            "bench-serve: --kv-memory-mib = 'nan' is not a finite number");
  EXPECT_EQ(refusal({"--seed", "-1"}),
            "bench-serve: --seed = '-1' must be an integer in [0, 2^64)");
  EXPECT_EQ(refusal({"--prefix-caching", "yes"}),
            "bench-serve: --prefix-caching = 'yes' must be on or off");
  EXPECT_EQ(refusal({"--api-key", ""}), "bench-serve: --api-key needs a non-empty value");
  EXPECT_EQ(refusal({"--page-size"}), "bench-serve: --page-size needs a value");
  EXPECT_EQ(refusal({"--pages", "4"}), "bench-serve: unknown flag '--pages' (see --help)");
  EXPECT_EQ(refusal({"quick"}), "bench-serve: unknown flag 'quick' (see --help)");
}

TEST(CliFlags, EngineAndHttpFlagsNeedTheirMode) {
  EXPECT_EQ(refusal({"--url", "http://h:1", "--quick", "--deterministic", "--page-size", "8"}),
            "bench-serve: --deterministic configures the in-process engine; with --url the "
            "server has its own");
  EXPECT_EQ(refusal({"--text-prompts", "--api-key", "k"}),
            "bench-serve: --text-prompts needs --url (it configures the HTTP client)");
}

TEST(CliFlags, HelpListsEveryFlagWithItsDefault) {
  EXPECT_TRUE(bench_serve({"--quick", "--help"}).help);
  EXPECT_TRUE(bench_serve({"-h"}).help);
  const std::string help = bench_serve_help();
  EXPECT_EQ(help.rfind("usage: pagedattn bench-serve [flags]\n", 0), 0u) << help;
  for (const char* line :
       {"  --page-size P ", "(default 16)", "  --prefix-caching on|off ", "(default off)",
        "  --no-chunked-prefill ", "In-process engine", "  --url http://HOST[:PORT] "})
    EXPECT_NE(help.find(line), std::string::npos) << line << " in\n" << help;
  // 0 there means "the preset's": the text says so, no "(default 0)".
  const std::size_t from = help.find("  --num-requests N"), to = help.find("  --request-rate R");
  ASSERT_LT(from, to);
  EXPECT_EQ(help.substr(from, to - from).find("(default 0)"), std::string::npos) << help;
}

TEST(CliFlags, ChecksAreUsableAlone) {
  std::string value = "1e2";
  EXPECT_EQ(flags::integer_in(1, 100)(value), "");
  EXPECT_EQ(value, "100");  // rewritten in decimal for CLI11
  value = "101";
  EXPECT_EQ(flags::integer_in(1, 100)(value), "= '101' must be an integer in [1, 100]");
  value = "0.5";
  EXPECT_EQ(flags::number_in(1e-6, 1)(value), "");
  value = "2";
  EXPECT_EQ(flags::positive(1)(value), "= '2' must be a number in (0, 1]");
  value = "c";
  EXPECT_EQ(flags::one_of({"a", "b", "d"})(value), "= 'c' must be a, b or d");
}

}  // namespace
}  // namespace pagedattn::tools
