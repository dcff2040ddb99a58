// A small decoder-only transformer that decodes with a static KV cache: Hugging Face's
// `StaticCache` pattern, which its docs pair with torch.compile(mode="reduce-overhead"). The
// cache is allocated once at its largest length; each step writes its key and value at the
// position given as a tensor (`index_copy_`), and attends over the whole cache with the positions
// after it masked out. No shape and no host value changes from step to step, so one graph serves
// every position. Plain libtorch, no cgt: examples/torch_kv_decode.cpp and
// tests/torch/test_kv_decode.cpp run it eagerly and through a pool.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kv_decoder {

constexpr std::int64_t vocabulary = 512;
constexpr std::int64_t width = 128;
constexpr std::int64_t heads = 4;
constexpr std::int64_t head_dim = width / heads;
constexpr std::int64_t layers = 2;

/// The static cache of one batch size: a key and a value tensor per layer, [batch, heads,
/// max_length, head_dim], zeros until written. Its tensors stay where they are made.
struct Cache {
  std::vector<torch::Tensor> keys, values;
  Cache(std::int64_t batch, std::int64_t max_length, const torch::TensorOptions& options) {
    for (std::int64_t l = 0; l < layers; ++l) {
      keys.push_back(torch::zeros({batch, heads, max_length, head_dim}, options));
      values.push_back(torch::zeros({batch, heads, max_length, head_dim}, options));
    }
  }
  /// Keys and values, layer by layer: k0, v0, k1, v1, ... (the order `DecoderImpl::step` takes).
  [[nodiscard]] std::vector<torch::Tensor> tensors() const {
    std::vector<torch::Tensor> all;
    for (std::int64_t l = 0; l < layers; ++l) {
      all.push_back(keys[l]);
      all.push_back(values[l]);
    }
    return all;
  }
};

struct LayerImpl : torch::nn::Module {
  LayerImpl()
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))) {}

  // x [batch, width]; position [1] (int64, on the device); key/value cache [batch, heads, T, d].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& position, const torch::Tensor& positions,
                        torch::Tensor& keys, torch::Tensor& values) {
    const std::int64_t batch = x.size(0);
    const auto parts = qkv->forward(norm1->forward(x)).view({batch, 3, heads, 1, head_dim});
    keys.index_copy_(2, position, parts.select(1, 1));
    values.index_copy_(2, position, parts.select(1, 2));
    auto scores = torch::matmul(parts.select(1, 0), keys.transpose(-2, -1)) / std::sqrt(double{head_dim});
    // Positions after this one hold nothing of this sequence yet: masked out, on the device.
    scores = scores.masked_fill(positions.gt(position), -std::numeric_limits<float>::infinity());
    const auto attended = torch::matmul(torch::softmax(scores, -1), values).reshape({batch, width});
    const auto h = x + proj->forward(attended);
    return h + down->forward(torch::gelu(up->forward(norm2->forward(h))));
  }
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Layer);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(std::int64_t max_length)
      : embedding(register_module("embedding", torch::nn::Embedding(vocabulary, width))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        head(register_module("head", torch::nn::Linear(width, vocabulary))) {
    for (std::int64_t l = 0; l < layers; ++l) blocks.push_back(register_module("layer" + std::to_string(l), Layer()));
    positions = register_buffer("positions", torch::arange(max_length));
  }

  /// One decoding step: the tokens [batch] (int64) at `position` ([1], int64, on the device) are
  /// written into the cache (`cache`: k0, v0, k1, v1, ...); returns the next logits [batch, vocabulary].
  torch::Tensor step(const torch::Tensor& tokens, const torch::Tensor& position, std::vector<torch::Tensor> cache) {
    auto x = embedding->forward(tokens);
    for (std::int64_t l = 0; l < layers; ++l) {
      x = blocks[static_cast<std::size_t>(l)]->forward(x, position, positions, cache[2 * l], cache[2 * l + 1]);
    }
    return head->forward(norm->forward(x));
  }

  torch::nn::Embedding embedding;
  std::vector<Layer> blocks;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
  torch::Tensor positions;  // 0, 1, ..., max_length - 1: compared with the position on the device
};
TORCH_MODULE(Decoder);

}  // namespace kv_decoder
