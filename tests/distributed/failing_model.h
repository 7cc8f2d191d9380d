// A model that fails on one prompt length: a prefill rank's model in the
// disaggregation tests' fault injection.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "pagedattn/errors.h"
#include "pagedattn/model.h"

namespace pagedattn::test {

class FailingModel : public Model {
 public:
  FailingModel(std::shared_ptr<Model> inner, std::int64_t bad_len)
      : inner_(std::move(inner)), bad_(bad_len) {}
  const ModelSpec& spec() const override { return inner_->spec(); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    require<InternalError>(std::ssize(batch.token_ids) != bad_, "injected model failure");
    inner_->forward(batch, cache, logits);
  }

 private:
  std::shared_ptr<Model> inner_;
  std::int64_t bad_;
};

}  // namespace pagedattn::test
