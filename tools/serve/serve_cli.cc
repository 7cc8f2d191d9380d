#include "serve_cli.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/llama.h"
#include "tensor_parallel_cli.h"

namespace pagedattn::serve {
namespace {

double parse_number(std::string_view flag, const std::string& text, double min, double max) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  require(end != text.c_str() && *end == '\0' && std::isfinite(x) && x >= min && x <= max,
          "serve: ", flag, " = '", text, "' is not a number in [", min, ", ", max, "]");
  return x;
}

std::int64_t parse_integer(std::string_view flag, const std::string& text, double min, double max) {
  const double x = parse_number(flag, text, min, max);
  require(x == std::floor(x), "serve: ", flag, " = '", text, "' is not an integer");
  return static_cast<std::int64_t>(x);
}

bool is_gguf(const std::string& model) {
  return model.ends_with(".gguf");
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// SIGINT/SIGTERM: the handler only writes the signal number to a pipe (all
// it may do); a watcher thread reads it and shuts the server down
// gracefully, and listen() returns in main. (Blocking the signals instead
// would miss threads that libraries start before main, such as BLAS's.)
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &byte, 1);
}

class SignalWatcher {
 public:
  explicit SignalWatcher(HttpServer& server) {
    require(pipe(g_signal_pipe) == 0, "serve: cannot create the signal pipe");
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
    thread_ = std::thread([&server] {
      char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
      }
      if (sig == 0) return;  // the pipe closed: the server stopped on its own
      std::fprintf(stderr, "pagedattn serve: %s: finishing in-flight requests, then exiting\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      server.shutdown();
    });
  }
  ~SignalWatcher() {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    close(g_signal_pipe[1]);  // wakes the watcher if no signal came
    thread_.join();
    close(g_signal_pipe[0]);
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::thread thread_;
};

}  // namespace

const char* serve_usage() {
  return "usage: pagedattn serve --model FILE.gguf|PRESET [flags]\n"
         "  --model M                  a GGUF file, or a synthetic preset: tiny, small, 1b\n"
         "  --host H                   address to listen on (default 127.0.0.1)\n"
         "  --port P                   port (default 8000; 0: any free port, printed)\n"
         "  --api-key KEY              require 'Authorization: Bearer KEY' on /v1/*\n"
         "  --served-model-name NAME   the model's name in the API (default: file name or preset)\n"
         "  --kv-memory-mib M          KV cache budget (default 256)\n"
         "  --max-num-seqs N           sequences running at once (default 256)\n"
         "  --max-batched-tokens N     tokens per engine step (default 2048)\n"
         "  --max-model-len N          context length (default: the model's)\n"
         "  --enable-prefix-caching    reuse cached pages of earlier prompts (request field\n"
         "                             cache_salt keeps tenants apart); "
         "--no-enable-prefix-caching\n"
         "                             turns it off again (default off)\n"
         "  --host-kv-memory-mib M     host-memory tier preempted requests are swapped to\n"
         "                             (default 0: preemption recomputes)\n"
         "  --bf16-products            attention on bf16 dot products where the CPU has\n"
         "                             AVX512-BF16 (faster, inputs rounded to bf16; default off)\n"
         "  --tensor-parallel N        split the model over N MPI ranks (mpirun -np N ...)\n"
         "  --max-connections N        connections served at once (HTTP threads, default 128)\n"
         "  --max-queued-requests N    requests held, waiting + running; more get 429 (default "
         "256)\n"
         "  --max-body-bytes N         larger request bodies get 413 (default 8388608)\n"
         "  --read-timeout S           drop a client silent this long mid-request (default 10)\n"
         "  --shutdown-grace S         on SIGINT/SIGTERM, let requests finish this long (default "
         "30)\n"
         "Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,\n"
         "GET /health, GET /metrics (docs/serve.md).\n";
}

ServeOptions parse_serve_options(int argc, char** argv, int first) {
  ServeOptions o;
  ServerOptions& s = o.server;
  std::string name;
  for (int i = first; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      require(i + 1 < argc, "serve: ", flag, " needs a value");
      return argv[++i];
    };
    auto int_value = [&](double min, double max) { return parse_integer(flag, value(), min, max); };
    if (flag == "--model")
      o.model = value();
    else if (flag == "--host")
      s.host = value();
    else if (flag == "--port")
      s.port = int(int_value(0, 65535));
    else if (flag == "--api-key")
      s.api_key = value();
    else if (flag == "--served-model-name")
      name = value();
    else if (flag == "--kv-memory-mib")
      o.kv_memory_mib = parse_number(flag, value(), 0.001, 1 << 20);
    else if (flag == "--max-num-seqs")
      o.max_num_seqs = std::int32_t(int_value(1, 1 << 20));
    else if (flag == "--max-batched-tokens")
      o.max_num_batched_tokens = std::int32_t(int_value(1, 1 << 24));
    else if (flag == "--max-model-len")
      o.max_position = std::int32_t(int_value(1, 1 << 24));
    else if (flag == "--enable-prefix-caching")
      o.enable_prefix_caching = true;
    else if (flag == "--no-enable-prefix-caching")
      o.enable_prefix_caching = false;
    else if (flag == "--host-kv-memory-mib")
      o.host_kv_memory_mib = parse_number(flag, value(), 0, 1 << 20);
    else if (flag == "--bf16-products")
      o.bf16_products = true;
    else if (flag == "--tensor-parallel")
      o.tensor_parallel = std::int32_t(int_value(1, 1024));
    else if (flag == "--max-connections")
      s.max_connections = std::int32_t(int_value(1, 4096));
    else if (flag == "--max-queued-requests")
      s.max_queued_requests = std::int32_t(int_value(1, 1 << 20));
    else if (flag == "--max-body-bytes")
      s.max_body_bytes = std::size_t(int_value(1, 1ll << 32));
    else if (flag == "--read-timeout")
      s.read_timeout_seconds = int(int_value(1, 3600));
    else if (flag == "--shutdown-grace")
      s.shutdown_grace_seconds = int(int_value(0, 3600));
    else if (flag == "--help" || flag == "-h")
      o.help = true;
    else
      throw InvalidArgument(detail::concat("serve: unknown flag '", flag, "'"));
  }
  if (o.help) return o;
  require(!o.model.empty(), "serve: --model FILE.gguf|PRESET is required");
  s.model_name = !name.empty() ? name : is_gguf(o.model) ? base_name(o.model) : o.model;
  return o;
}

std::unique_ptr<HttpServer> make_server(const ServeOptions& o) {
  EngineConfig ec;
  std::unique_ptr<TextCodec> codec;
  if (is_gguf(o.model)) {
    const GgufFile file = GgufFile::open(o.model);
    codec = make_gguf_codec(file);
    ec.model = tools::make_cli_model(o.tensor_parallel, o.model, [&](const TensorParallelShard& s) {
      return make_gguf_model(file, {.max_position = o.max_position, .shard = s});
    });
  } else {
    LlamaConfig c = llama_preset(o.model);
    if (o.max_position > 0) c.max_position = o.max_position;
    codec = make_byte_codec(c.vocab_size, c.eos_token_id);
    ec.model = tools::make_cli_model(o.tensor_parallel, o.model, [&](const TensorParallelShard& s) {
      LlamaConfig shard = c;
      shard.shard = s;
      return make_llama_model(shard);
    });
  }
  if (ec.model == nullptr) return nullptr;  // a follower rank: rank 0 serves
  ec.kv_memory_bytes =
      static_cast<std::int64_t>((o.kv_memory_mib > 0 ? o.kv_memory_mib : 256.0) * (1 << 20));
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.enable_prefix_caching = o.enable_prefix_caching;
  ec.host_kv_memory_bytes = static_cast<std::int64_t>(o.host_kv_memory_mib * (1 << 20));
  ec.bf16_products = o.bf16_products;
  return std::make_unique<HttpServer>(std::move(ec), std::move(codec), o.server);
}

int run_serve(int argc, char** argv) {
  const ServeOptions o = parse_serve_options(argc, argv, 2);
  if (o.help) {
    std::fputs(serve_usage(), stdout);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);  // a client that left: the write fails, the process lives
  std::unique_ptr<HttpServer> server = make_server(o);
  if (server == nullptr) return 0;  // a tensor-parallel follower whose leader stopped
  server->bind();
  {
    const SignalWatcher signals(*server);
    std::printf("pagedattn serve: %s on http://%s:%d (Ctrl-C to stop)\n",
                o.server.model_name.c_str(), o.server.host.c_str(), server->bound_port());
    std::fflush(stdout);
    server->listen();
  }
  server.reset();
  std::fprintf(stderr, "pagedattn serve: stopped\n");
  return 0;
}

}  // namespace pagedattn::serve
