#include "serve_cli.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli_flags.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf.h"
#include "pagedattn/llama.h"
#include "tensor_parallel_cli.h"

#ifdef PAGEDATTN_HAVE_MPI
#include "disagg_serve.h"
#endif

namespace pagedattn::serve {
namespace {

bool is_gguf(const std::string& model) {
  return model.ends_with(".gguf");
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

using tools::flags::add_bf16_products_flag, tools::flags::add_int8_activations_flag,
    tools::flags::add_tensor_parallel_flag;
using tools::flags::integer_in, tools::flags::number_in;

void add_engine_flags(CLI::App& app, ServeOptions& o) {
  app.add_option("--model", o.model, "a GGUF file, or a synthetic preset: tiny, small, 1b")
      ->type_name("FILE.gguf|PRESET")
      ->required()
      ->check(tools::flags::non_empty());
  app.add_option("--kv-memory-mib", o.kv_memory_mib, "KV cache budget")
      ->type_name("M")
      ->check(number_in(0.001, 1 << 20));
  app.add_option("--max-num-seqs", o.max_num_seqs, "sequences running at once")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 20));
  app.add_option("--max-batched-tokens", o.max_num_batched_tokens, "tokens per engine step")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 24));
  app.add_option("--max-model-len", o.max_position, "context length (default: the model's)")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 24))
      ->default_str("");
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
               "reuse cached pages of earlier prompts (request field cache_salt keeps tenants "
               "apart); the --no- form turns it off (default off)");
  app.add_option("--host-kv-memory-mib", o.host_kv_memory_mib,
                 "host-memory tier preempted requests are swapped to; 0: none, preemption "
                 "recomputes")
      ->type_name("M")
      ->check(number_in(0, 1 << 20));
  add_bf16_products_flag(app, o.bf16_products);
  tools::flags::add_exact_products_flag(app, o.exact_products);
  tools::flags::add_pin_threads_flag(app, o.pin_threads);
  tools::flags::add_kv_cache_dtype_flag(app, o.kv_dtype);
  add_int8_activations_flag(app, o.int8_activations);
  app.add_flag("--deterministic", o.deterministic,
               "batch-independent results: a request's tokens do not depend on the requests "
               "running beside it (slower kernels; default off)");
  add_tensor_parallel_flag(app, o.tensor_parallel);
  app.add_flag("--disaggregate", o.disaggregate,
               "under `mpirun -np N` (N >= 2): rank 0 serves and decodes, ranks 1..N-1 prefill "
               "the prompts and send their KV pages to it (docs/disaggregation.md)");
  app.add_flag("--parse-special-in-prompts,!--no-parse-special-in-prompts",
               o.special_tokens.parse_special_in_prompts,
               "completions' text prompts: control-token text (<|im_start|>, ...) becomes control "
               "tokens, as in vLLM; the --no- form keeps it plain text (default on; chat "
               "messages follow --parse-special-in-messages)");
  app.add_flag("--parse-special-in-messages", o.special_tokens.parse_special_in_messages,
               "chat messages' control-token text (<|im_end|>, ...) becomes control tokens; "
               "lets clients forge turns, so only for trusted clients (default off: message "
               "text is plain text)");
  app.add_flag("--check-tensors", o.check_tensors,
               "refuse a GGUF model whose weights hold NaN or Inf, naming the tensor (one more "
               "pass over the weights at load)");
}

void add_http_flags(CLI::App& app, ServerOptions& s) {
  app.add_option("--host", s.host, "address to listen on")->type_name("H");
  app.add_option("--port", s.port, "port; 0 picks any free port (printed)")
      ->type_name("P")
      ->transform(integer_in(0, 65535));
  app.add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on /v1/*")
      ->type_name("KEY");
  app.add_option("--served-model-name", s.model_name,
                 "the model's name in the API (default: file name or preset)")
      ->type_name("NAME")
      ->check(tools::flags::non_empty())
      ->default_str("");
  app.add_option("--max-connections", s.max_connections,
                 "HTTP threads: requests served at once (connections still sending "
                 "headers take none)")
      ->type_name("N")
      ->transform(integer_in(1, 4096));
  app.add_option("--max-queued-requests", s.max_queued_requests,
                 "requests held, waiting + running; more get 429")
      ->type_name("N")
      ->transform(integer_in(1, 1 << 20));
  app.add_option("--max-body-bytes", s.max_body_bytes, "larger request bodies get 413")
      ->type_name("N")
      ->transform(integer_in(1, std::int64_t{1} << 32));
  app.add_option("--read-timeout", s.read_timeout_seconds,
                 "drop a client silent this long mid-request")
      ->type_name("S")
      ->transform(integer_in(1, 3600));
  app.add_option("--header-timeout", s.header_timeout_seconds,
                 "a request's headers must all arrive within S s of its first byte, else 408 "
                 "and closed; headers being received take no HTTP thread")
      ->type_name("S")
      ->transform(integer_in(1, 3600));
  app.add_option("--body-timeout", s.body_timeout_seconds,
                 "a request's body must all arrive within S s of its headers, else 400 and "
                 "closed; at most half the HTTP threads wait on bodies at once")
      ->type_name("S")
      ->transform(integer_in(1, 3600));
  app.add_option("--shutdown-grace", s.shutdown_grace_seconds,
                 "on SIGINT/SIGTERM/SIGUSR1, let requests finish this long")
      ->type_name("S")
      ->transform(integer_in(0, 3600));
}

// serve's flags, bound to `o` (whose initial values are the defaults).
std::unique_ptr<CLI::App> serve_flags(ServeOptions& o) {
  auto app = tools::flags::make_app("serve", "An OpenAI-compatible HTTP server over the engine.");
  add_engine_flags(*app, o);
  add_http_flags(*app, o.server);
  app->footer(
      "Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,\n"
      "GET /health, GET /metrics (docs/serve.md).");
  return app;
}

// SIGINT/SIGTERM, and SIGUSR1 (which OpenMPI's mpirun forwards to the ranks,
// where it turns SIGINT/SIGTERM into a kill): the handler only writes the
// signal number to a pipe (all it may do); a watcher thread reads it and
// shuts the server down gracefully, and listen() returns in main. (Blocking the signals instead
// would miss threads that libraries start before main, such as BLAS's.)
int g_signal_pipe[2] = {-1, -1};
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1};

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
    for (const int sig : kStopSignals) sigaction(sig, &action, nullptr);
    thread_ = std::thread([&server] {
      char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
      }
      if (sig == 0) return;  // the pipe closed: the server stopped on its own
      std::fprintf(stderr, "pagedattn serve: %s: finishing in-flight requests, then exiting\n",
                   sig == SIGINT    ? "SIGINT"
                   : sig == SIGTERM ? "SIGTERM"
                                    : "SIGUSR1");
      server.shutdown();
    });
  }
  ~SignalWatcher() {
    for (const int sig : kStopSignals) signal(sig, SIG_DFL);
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

ServeOptions parse_serve_options(int argc, char** argv, int first) {
  ServeOptions o;
  const std::unique_ptr<CLI::App> app = serve_flags(o);
  o.help = tools::flags::parse(*app, argc, argv, first);
  if (app->count("--served-model-name") == 0)
    o.server.model_name = is_gguf(o.model) ? base_name(o.model) : o.model;
  require(!o.disaggregate || o.tensor_parallel == 1,
          "serve: --disaggregate and --tensor-parallel = ", o.tensor_parallel,
          " cannot be combined (each rank of a disaggregated server holds the whole model)");
  return o;
}

std::string serve_help() {
  ServeOptions defaults;
  return serve_flags(defaults)->help();
}

std::unique_ptr<HttpServer> make_server(const ServeOptions& o) {
  EngineConfig ec;
  std::unique_ptr<TextCodec> codec;
  if (is_gguf(o.model)) {
    const GgufFile file = GgufFile::open(o.model);
    codec = make_gguf_codec(file, o.special_tokens);
    ec.model = tools::make_cli_model(o.tensor_parallel, o.model, [&](const TensorParallelShard& s) {
      return make_gguf_model(
          file, {.max_position = o.max_position, .shard = s, .check_tensors = o.check_tensors});
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
  ec.kv_memory_bytes = static_cast<std::int64_t>(o.kv_memory_mib * (1 << 20));
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.enable_prefix_caching = o.enable_prefix_caching;
  ec.host_kv_memory_bytes = static_cast<std::int64_t>(o.host_kv_memory_mib * (1 << 20));
  ec.bf16_products = o.bf16_products;
  ec.exact_products = o.exact_products;
  ec.pin_threads = o.pin_threads;
  ec.kv_dtype = o.kv_dtype;
  ec.int8_activations = o.int8_activations;
  ec.deterministic = o.deterministic;
  std::unique_ptr<RemotePrefill> remote;
  if (o.disaggregate) {
#ifdef PAGEDATTN_HAVE_MPI
    remote = start_disaggregated(ec);
    if (remote == nullptr) return nullptr;  // a prefill rank whose server stopped
#else
    throw Unsupported(
        "serve --disaggregate: this pagedattn was built without MPI (install libopenmpi-dev "
        "openmpi-bin and configure with PAGEDATTN_WITH_MPI=ON)");
#endif
  }
  return std::make_unique<HttpServer>(std::move(ec), std::move(codec), o.server, std::move(remote));
}

int run_serve(int argc, char** argv) {
#ifdef PAGEDATTN_HAVE_MPI
  // Before the flags: MPI_Init may rewrite argv. Finalized after the server.
  const std::shared_ptr<void> mpi = start_mpi_if_disaggregated(&argc, &argv);
#endif
  const ServeOptions o = parse_serve_options(argc, argv, 2);
  if (o.help) {
    std::fputs(serve_help().c_str(), stdout);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);  // a client that left: the write fails, the process lives
  limit_malloc_arenas();
  std::unique_ptr<HttpServer> server = make_server(o);
  if (server == nullptr) return 0;  // a follower or prefill rank whose rank 0 stopped
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
