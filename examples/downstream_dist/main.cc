// Uses the installed MPI modes (pagedattn::dist) on one rank: the MPI session
// and world communicator, an all-reduce, the startup model check, and a
// tensor-parallel leader of size 1 driving an engine, whose greedy tokens
// must equal the same model's without MPI. Run as `mpiexec -n 1 ...`.
#include <pagedattn/distributed/tensor_parallel.h>
#include <pagedattn/engine.h>
#include <pagedattn/llama.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#ifndef PAGEDATTN_HAVE_MPI
#error "linking pagedattn::dist defines PAGEDATTN_HAVE_MPI"
#endif

namespace {

// Greedy tokens of one request through an engine over `model`.
std::vector<std::int32_t> generate(std::shared_ptr<pagedattn::Model> model) {
  pagedattn::EngineConfig config;
  config.model = std::move(model);
  config.kv_memory_bytes = 16ll << 20;
  pagedattn::Engine engine(config);
  const std::vector<std::int32_t> prompt = {1, 15, 27, 99};
  engine.add_request(prompt, {.max_tokens = 4, .ignore_eos = true});
  std::vector<std::int32_t> tokens;
  while (engine.has_unfinished())
    for (const pagedattn::RequestOutput& out : engine.step())
      for (const pagedattn::SampleOutput& s : out.samples)
        tokens.insert(tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  namespace dist = pagedattn::dist;
  dist::MpiSession session(&argc, &argv);
  const dist::MpiComm world = dist::MpiComm::world();
  std::vector<float> sums = {1.0f, 2.0f};
  world.all_reduce_sum(sums);

  pagedattn::LlamaConfig config = pagedattn::llama_preset("tiny");
  const std::vector<std::int32_t> single = generate(pagedattn::make_llama_model(config));
  config.shard = dist::mpi_shard(world);
  dist::require_same_model(world, dist::model_fingerprint(config));
  auto leader =
      std::make_shared<dist::TensorParallelLeader>(world, pagedattn::make_llama_model(config));
  const std::vector<std::int32_t> parallel = generate(leader);
  leader->shutdown();

  const bool ok = world.size() == 1 && sums == std::vector<float>{1.0f, 2.0f} &&
                  parallel.size() == 4 && parallel == single;
  std::printf("downstream_dist: %d MPI rank(s), tensor-parallel leader generated %zu tokens, %s\n",
              world.size(), parallel.size(), ok ? "equal to the single process" : "MISMATCH");
  return ok ? 0 : 1;
}
