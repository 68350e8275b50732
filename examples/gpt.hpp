// A small GPT (token and position embeddings, tied output layer, pre-norm attention and MLP blocks) trained through any zero engine.
#pragma once

// The engine never sees a kernel: it hands out each unit's parameters (gather) and gradient buffer
// (grads), and sums the gradients over ranks (reduce). Everything here is the user's side of that
// protocol, written the way a training loop ported to zero looks. docs/tutorial.md walks through it;
// the regions between "tutorial:begin NAME" and "tutorial:end" are quoted there word for word (a
// test keeps them in sync).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "char_corpus.hpp"
#include "gpt_kernels.hpp"
#include "mlp.hpp"  // mlp::key and mlp::uniform: the counter-based generator
#include "zero/engine/activation_store.hpp"
#include "zero/zero.hpp"

namespace gpt {

struct config {
  int vocab = 0;      // from the corpus
  int context = 16;   // T: positions per sequence
  int embd = 64;      // C: channels of the residual stream
  int heads = 4;      // C / heads channels per head
  int layers = 2;     // transformer blocks
  int batch = 16;     // global batch, in sequences
  std::uint64_t seed = 1;
};

// tutorial:begin units
// The units, in the order of the forward pass: what is gathered and released together. The token
// embedding is a unit of its own because the output layer uses it again (the tied weight): declared
// as gathered twice per pass, so the engine's traffic formula counts its second gathers.
inline constexpr zero::unit_id wte{0};  // token embedding [vocab, C], also the output layer
inline constexpr zero::unit_id wpe{1};  // position embedding [context, C]
inline zero::unit_id block(int l) { return zero::unit_id{2 + static_cast<std::size_t>(l)}; }
inline zero::unit_id ln_f(const config& c) { return block(c.layers); }  // the final layer norm

// Each block's matrices are declared in Megatron's tensor-parallel layout (used when the ranks form a
// mesh with tp > 1; at tp = 1 every piece is the whole tensor). Weights are [out, in], as in PyTorch.
// The query, key and value projections are split by heads: c_attn is declared [3, C, C] (q, k and v
// stacked: the elements of a [3C, C] matrix, in its order) and split along dimension 1, so a rank
// holds the rows of its heads in each of q, k and v. The MLP's first matrix and its bias are split by
// output (column-parallel), the second matrices, attention's c_proj and the MLP's, by input
// (row-parallel, dimension 1). Norms, the row-parallel biases and the embeddings (the tied output
// layer too) are replicated, the default.
inline zero::model_spec make_spec(const config& c) {
  const auto V = static_cast<std::size_t>(c.vocab), T = static_cast<std::size_t>(c.context),
             C = static_cast<std::size_t>(c.embd);
  const auto by_heads = zero::tp_split(1), column_parallel = zero::tp_split(0), row_parallel = zero::tp_split(1);
  zero::model_spec spec;
  const std::string embedding = "embedding";  // both embeddings, wte the output layer too (param_groups below)
  spec.unit("wte").tensor("weight", {V, C}).group(embedding).gathers(2);
  spec.unit("wpe").tensor("weight", {T, C}).group(embedding);
  const std::string no_decay = "no_decay";  // biases and layer-norm gains (param_groups below)
  for (int l = 0; l < c.layers; ++l)
    spec.unit("h." + std::to_string(l))
        .tensor("ln_1.weight", {C}).group(no_decay).tensor("ln_1.bias", {C}).group(no_decay)
        .tensor("attn.c_attn.weight", {3, C, C}, by_heads)
        .tensor("attn.c_attn.bias", {3, C}, by_heads).group(no_decay)
        .tensor("attn.c_proj.weight", {C, C}, row_parallel).tensor("attn.c_proj.bias", {C}).group(no_decay)
        .tensor("ln_2.weight", {C}).group(no_decay).tensor("ln_2.bias", {C}).group(no_decay)
        .tensor("mlp.c_fc.weight", {4 * C, C}, column_parallel)
        .tensor("mlp.c_fc.bias", {4 * C}, column_parallel).group(no_decay)
        .tensor("mlp.c_proj.weight", {C, 4 * C}, row_parallel).tensor("mlp.c_proj.bias", {C}).group(no_decay);
  spec.unit("ln_f").tensor("weight", {C}).group(no_decay).tensor("bias", {C}).group(no_decay);
  return spec;
}

// The GPT recipe's parameter groups (nanoGPT's and llm.c's): the matrices and both embeddings decay,
// the biases and the layer norms' gains and biases take no weight decay. With a matrix optimizer
// (optim::muon) the embeddings, the output layer among them, stay on its element-wise rule, as Muon's
// recipe keeps them on AdamW.
inline std::vector<zero::param_group> param_groups(bool matrix_optimizer = false) {
  std::vector<zero::param_group> groups{{.name = "no_decay", .weight_decay = 0.0f}};
  if (matrix_optimizer) groups.push_back({.name = "embedding", .element_wise = true});
  return groups;
}
// tutorial:end

// tutorial:begin init
// GPT-2's initialization, drawn by element: biases 0, layer-norm gains 1, other weights with the
// standard deviation of N(0, 0.02) (uniform, so one draw per element), the residual projections
// scaled by 1/sqrt(2 x layers). Element i of a tensor depends only on the seed, the tensor's name
// and i, so a rank can produce just the range the engine asks for, at any N and stage. A function of
// the whole tensors: in a tensor-parallel mesh, zero::from_whole_tensors hands each piece its elements.
inline zero::init_range_fn initializer(const config& c) {
  return [c](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    const std::string_view name = t.name;
    if (name.ends_with("bias") || name.starts_with("ln_") || u.name == "ln_f") {
      std::fill(v.begin(), v.end(), name.ends_with("bias") ? 0.0f : 1.0f);
      return;
    }
    float stddev = 0.02f;
    if (name.ends_with("c_proj.weight")) stddev /= std::sqrt(2.0f * static_cast<float>(c.layers));
    const float limit = stddev * std::sqrt(3.0f);  // uniform on [-limit, limit) has this deviation
    const std::string full = u.name + "." + t.name;
    const std::uint64_t tensor_key = zero::fnv1a64(full.data(), full.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = limit * mlp::uniform(mlp::key(c.seed, 6, tensor_key, r.begin + i));
  };
}
// tutorial:end

// tutorial:begin fp32_unit
// One unit's tensors in fp32, the type the kernels compute in: a gathered unit's parameters widened
// once (exact for bf16 and fp16), or a zeroed gradient that the kernels accumulate into and that is
// then added into the engine's gradient buffer, rounded once to its type. Tensors are found by name.
class fp32_unit {
 public:
  template <class T>
  explicit fp32_unit(const zero::unit_view<T>& v, bool zero = false) : spec_(&v.spec()), data_(v.size(), 0.0f) {
    for (std::size_t i = 0; i < v.num_tensors(); ++i) offsets_.push_back(static_cast<std::size_t>(v.at(i).data() - v.data()));
    if (!zero)
      for (std::size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<float>(v.data()[i]);
  }
  float* operator[](std::string_view tensor) {
    for (std::size_t i = 0; i < offsets_.size(); ++i)
      if (spec_->tensors[i].name == tensor) return data_.data() + offsets_[i];
    zero::fail(zero::error_kind::invalid_argument, "gpt: unit '", spec_->name, "' has no tensor '", tensor, "'");
  }
  const float* operator[](std::string_view tensor) const { return (*const_cast<fp32_unit*>(this))[tensor]; }
  // g += this, element by element, in fp32 and rounded once to the gradient type.
  template <class G>
  void add_to(const zero::unit_view<G>& g) const {
    for (std::size_t i = 0; i < data_.size(); ++i) g.data()[i] = static_cast<G>(static_cast<float>(g.data()[i]) + data_[i]);
  }

 private:
  const zero::unit_spec* spec_;
  std::vector<float> data_;
  std::vector<std::size_t> offsets_;
};
// tutorial:end

// The tensor-parallel group a rank computes its blocks with (comm::mesh's tp()), or none (tp = 1).
// The blocks need one collective from it: Megatron's sum of partial activations, of the row-parallel
// layers' outputs in the forward pass and of the column-parallel layers' input gradients in the
// backward pass. It is an all-gather of the partial sums, added on every rank in rank order, so that
// every rank of the group gets the same bits on any backend (the replicated tensors' gradients, which
// the engine requires equal across the group, are computed from them).
//
// With sequence parallelism (Korthikanti et al.) the residual stream between the blocks' tensor-parallel
// layers, the layer norms and the residual additions, is split along the rows (batch x positions):
// rank t computes rows [t R/tp, (t+1) R/tp) and keeps only those of what the backward pass needs. The
// sums at the row-parallel layers' outputs become reduce-scatters of the rows (each rank adds its rows'
// partial sums in rank order: the same bits), and an all-gather of the rows feeds each column-parallel
// layer. The layer norms' weight and bias gradients, sums over every row, are accumulated through the
// ranks in rank order (in_rank_order), so they are the bits of one pass over all rows. Exact against
// tp without it; a pass whose rows the group does not divide runs without it.
class tp_group {
 public:
  tp_group() = default;  // no group: one rank holds every piece
  // `group` must outlive this object.
  template <class Comm>
  explicit tp_group(Comm& group, bool sequence_parallel = false)
      : size_(group.size()),
        rank_(group.rank()),
        sequence_parallel_(sequence_parallel && group.size() > 1),
        all_gather_([&group](const float* send, float* recv, std::size_t n) { group.all_gather(send, recv, n); }) {
    if constexpr (zero::comm::has_all_to_all<Comm>)
      all_to_all_ = [&group](const float* send, float* recv, std::size_t n) {
        group.all_to_all(reinterpret_cast<const std::uint8_t*>(send), reinterpret_cast<std::uint8_t*>(recv),
                         n * sizeof(float));
      };
  }
  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // Whether a pass of `rows` rows splits its residual stream by rows over the group.
  bool splits_rows(int rows) const { return sequence_parallel_ && rows % size_ == 0; }

  // full (size() blocks of rows, each `mine`'s size) <- every rank's `mine`, in rank order.
  void all_gather_rows(const std::vector<float>& mine, std::vector<float>& full) const {
    full.resize(mine.size() * static_cast<std::size_t>(size_));
    all_gather_(mine.data(), full.data(), mine.size());
  }
  // mine <- this rank's block of rows of the sum over the group of every rank's `partial`, added in
  // rank order: an all-to-all of the blocks (an all-gather of the whole where the backend has none).
  void reduce_scatter_rows(const std::vector<float>& partial, std::vector<float>& mine) const {
    const std::size_t n = partial.size() / static_cast<std::size_t>(size_);
    std::vector<float> blocks(partial.size());
    std::size_t stride = n, at = 0;  // where rank r's block of this rank's rows is in `blocks`
    if (all_to_all_) {
      all_to_all_(partial.data(), blocks.data(), n);
    } else {
      blocks.resize(partial.size() * static_cast<std::size_t>(size_));  // every rank's whole partial
      all_gather_(partial.data(), blocks.data(), partial.size());
      stride = partial.size();
      at = static_cast<std::size_t>(rank_) * n;
    }
    mine.assign(blocks.data() + at, blocks.data() + at + n);
    for (int r = 1; r < size_; ++r)
      for (std::size_t i = 0; i < n; ++i) mine[i] += blocks[static_cast<std::size_t>(r) * stride + at + i];
  }
  // f(acc) on each rank in turn, rank 0 first, each starting from the previous rank's acc (m floats):
  // a sum f adds its rows to is the one pass over every rank's rows in order would give. Every rank
  // ends with the last rank's acc. Collective over the group (size() all-gathers of m floats).
  template <class F>
  void in_rank_order(float* acc, std::size_t m, F&& f) const {
    std::vector<float> all(m * static_cast<std::size_t>(size_));
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) f(acc);
      all_gather_(acc, all.data(), m);
      std::copy_n(all.data() + static_cast<std::size_t>(k) * m, m, acc);
    }
  }
  // v <- the sum over the group of every rank's v, ((v_0 + v_1) + v_2) + ... Collective over the group
  // (every rank with the same v.size()); nothing at size 1.
  void sum(std::vector<float>& v) const {
    if (size_ == 1 || v.empty()) return;
    const std::size_t n = v.size();
    std::vector<float> all(n * static_cast<std::size_t>(size_));
    all_gather_(v.data(), all.data(), n);
    std::copy_n(all.data(), n, v.data());
    for (int r = 1; r < size_; ++r)
      for (std::size_t i = 0; i < n; ++i) v[i] += all[static_cast<std::size_t>(r) * n + i];
  }

 private:
  int size_ = 1, rank_ = 0;
  bool sequence_parallel_ = false;
  std::function<void(const float*, float*, std::size_t)> all_gather_, all_to_all_;
};

// Throws zero::error (invalid_argument), naming the unit and tensor, unless `pieces` (an engine's
// spec()) has the shapes the kernels below compute with at tp.size() ranks: the model of make_spec,
// each split tensor as this rank's piece. A tensor declared replicated that the kernels treat as split,
// or the reverse, is refused here, before a kernel reads past a piece or trains another model.
inline void check_pieces(const config& c, const tp_group& tp, const zero::model_spec& pieces) {
  const auto V = static_cast<std::size_t>(c.vocab), T = static_cast<std::size_t>(c.context),
             C = static_cast<std::size_t>(c.embd), P = static_cast<std::size_t>(tp.size());
  const std::size_t Cp = C / P;  // this rank's channels of attention (its heads' q, k, v)
  struct expected {
    std::string unit, tensor;
    std::vector<std::size_t> shape;
    bool split;
  };
  std::vector<expected> all = {{"wte", "weight", {V, C}, false}, {"wpe", "weight", {T, C}, false}};
  for (int l = 0; l < c.layers; ++l) {
    const std::string u = "h." + std::to_string(l);
    for (const expected& e : std::vector<expected>{{u, "ln_1.weight", {C}, false},
                                                   {u, "ln_1.bias", {C}, false},
                                                   {u, "attn.c_attn.weight", {3, Cp, C}, true},
                                                   {u, "attn.c_attn.bias", {3, Cp}, true},
                                                   {u, "attn.c_proj.weight", {C, Cp}, true},
                                                   {u, "attn.c_proj.bias", {C}, false},
                                                   {u, "ln_2.weight", {C}, false},
                                                   {u, "ln_2.bias", {C}, false},
                                                   {u, "mlp.c_fc.weight", {4 * Cp, C}, true},
                                                   {u, "mlp.c_fc.bias", {4 * Cp}, true},
                                                   {u, "mlp.c_proj.weight", {C, 4 * Cp}, true},
                                                   {u, "mlp.c_proj.bias", {C}, false}})
      all.push_back(e);
  }
  all.push_back({"ln_f", "weight", {C}, false});
  all.push_back({"ln_f", "bias", {C}, false});
  const auto shape_text = [](const std::vector<std::size_t>& s) {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  for (const expected& e : all) {
    const zero::unit_id u = pieces.find(e.unit);
    const zero::tensor_spec* t = nullptr;
    for (const auto& x : pieces.at(u).tensors)
      if (x.name == e.tensor) t = &x;
    ZERO_CHECK(t != nullptr, invalid_argument, "gpt: unit '", e.unit, "' has no tensor '", e.tensor, "'");
    const int parts = e.split ? tp.size() : 1, index = e.split ? tp.rank() : 0;
    ZERO_CHECK(t->shape == e.shape && t->tp_parts == parts && t->tp_index == index, invalid_argument, "gpt: tensor '",
               e.unit, ".", e.tensor, "' is held as ", shape_text(t->shape), ", piece ", t->tp_index, " of ",
               t->tp_parts, "; at tensor-parallel rank ", tp.rank(), " of ", tp.size(), " the model computes with ",
               shape_text(e.shape), ", ", e.split ? "split" : "replicated", " (piece ", index, " of ", parts, ")");
  }
}

// A row-parallel linear layer (input split across the group): out = b + the sum over the group of
// in_piece w_piece^T. At tp = 1, linear_forward itself (the same bits as without a group).
inline void row_parallel_forward(const tp_group& tp, std::vector<float>& out, const float* in, const float* w,
                                 const float* b, int rows, int n_in, int n_out) {
  if (tp.size() == 1) return kernels::linear_forward(out.data(), in, w, b, rows, n_in, n_out);
  kernels::linear_forward(out.data(), in, w, nullptr, rows, n_in, n_out);
  tp.sum(out);
  for (int r = 0; r < rows; ++r) kernels::axpy(out.data() + static_cast<std::size_t>(r) * n_out, 1.0f, b, n_out);
}

// What the backward pass needs from the forward pass of one block. With sequence parallelism in, ln1,
// x1, ln2 and the norms' means and deviations hold this rank's rows only.
struct block_acts {
  std::vector<float> in, ln1, ln1_mean, ln1_rstd, qkv, probs, att, x1, ln2, ln2_mean, ln2_rstd, fc, gelu;
  std::size_t floats() const {
    std::size_t n = 0;
    for (const auto* v : {&in, &ln1, &ln1_mean, &ln1_rstd, &qkv, &probs, &att, &x1, &ln2, &ln2_mean, &ln2_rstd, &fc,
                          &gelu})
      n += v->size();
    return n;
  }
};

// A forward pass over `rows` sequences of `t_len` positions, and what its backward pass needs.
struct activations {
  int rows = 0, t_len = 0;
  std::vector<int> tokens, targets;  // [rows x t_len]
  std::vector<float> x;              // the residual stream
  std::vector<block_acts> blocks;
  std::vector<float> xf_in, xf, xf_mean, xf_rstd;  // ln_f's input and output
  std::vector<float> logits;                       // [rows x t_len, vocab]
  bool sequence_parallel = false;                  // the blocks ran with their residual stream split by rows
  bool checkpointed = false;  // the blocks kept their inputs in a checkpoint store, not `blocks`
  std::size_t recompute_floats = 0;  // checkpointed: the most one block's forward held at once
  // What the blocks keep for the backward pass, bytes (the part sequence parallelism divides): every
  // block's, or with checkpointing the one block recomputed at a time (the inputs are the store's).
  std::uint64_t block_bytes() const {
    std::uint64_t n = recompute_floats;
    for (const block_acts& b : blocks) n += b.floats();
    return n * sizeof(float);
  }
};

// Activation checkpointing of the blocks: the forward pass keeps only each block's input, in a
// checkpoint store (zero::activation_store: whole on every rank, or ZeRO-R's Pa and Pa+cpu, this rank's
// 1 / tp of it over the tensor-parallel group, in the system's or host memory), and the backward pass
// restores it and recomputes the block, just before the block's backward. The recomputation is the
// forward's arithmetic on the same inputs and weights, its collectives included, so the gradients have
// the bits of a pass without checkpointing. While block l is recomputed, block l - 1's input is
// prefetched (the store's all-gather in flight where the backend overlaps).
class block_checkpoints {
 public:
  block_checkpoints() = default;  // off: the blocks keep what their backward needs
  // `store` (a zero::activation_store over the tensor-parallel group) must outlive this object.
  template <class Store>
  explicit block_checkpoints(Store& store)
      : on_(true),
        partitions_(store.mode() != zero::activation_mode::none),
        save_([&store](std::size_t l, const float* x, std::size_t n) { store.save(l, x, n); }),
        restore_([&store](std::size_t l) { return store.template restore<float>(l); }),
        prefetch_([&store](std::size_t l) { store.template prefetch<float>(l); }),
        release_([&store](std::size_t l) { store.release(l); }) {}
  bool on() const { return on_; }
  // Whether the store splits a checkpoint over the group (Pa, Pa+cpu): every rank must save the same tensor.
  bool partitions() const { return partitions_; }
  void save(int layer, const std::vector<float>& x) const { save_(static_cast<std::size_t>(layer), x.data(), x.size()); }
  std::span<const float> restore(int layer) const { return restore_(static_cast<std::size_t>(layer)); }
  void prefetch(int layer) const { prefetch_(static_cast<std::size_t>(layer)); }
  void release(int layer) const { release_(static_cast<std::size_t>(layer)); }

 private:
  bool on_ = false, partitions_ = false;
  std::function<void(std::size_t, const float*, std::size_t)> save_;
  std::function<std::span<const float>(std::size_t)> restore_;
  std::function<void(std::size_t)> prefetch_, release_;
};

// x <- x + block(x), keeping what the backward needs in s. In a tensor-parallel group this rank
// computes its heads and its columns of the MLP (C / tp channels, 4 C / tp hidden units); x is the
// whole residual stream, the same on every rank of the group.
inline void block_forward(const config& c, const tp_group& tp, const fp32_unit& w, int rows, int t_len,
                          std::vector<float>& x, block_acts& s) {
  namespace k = kernels;
  const int R = rows * t_len, C = c.embd, Cp = C / tp.size(), heads = c.heads / tp.size();
  const auto n = static_cast<std::size_t>(R) * C, np = static_cast<std::size_t>(R) * Cp;
  s.in = x;
  s.ln1.resize(n), s.ln1_mean.resize(R), s.ln1_rstd.resize(R);
  k::layernorm_forward(s.ln1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), s.in.data(), w["ln_1.weight"],
                       w["ln_1.bias"], R, C);
  s.qkv.resize(3 * np);  // per row: this rank's q, k, v, each Cp channels, as attention_forward reads them
  k::linear_forward(s.qkv.data(), s.ln1.data(), w["attn.c_attn.weight"], w["attn.c_attn.bias"], R, C, 3 * Cp);
  s.probs.resize(static_cast<std::size_t>(rows) * heads * t_len * t_len), s.att.resize(np);
  k::attention_forward(s.att.data(), s.probs.data(), s.qkv.data(), rows, t_len, Cp, heads);
  s.x1.resize(n);
  row_parallel_forward(tp, s.x1, s.att.data(), w["attn.c_proj.weight"], w["attn.c_proj.bias"], R, Cp, C);
  for (std::size_t i = 0; i < n; ++i) s.x1[i] += s.in[i];
  s.ln2.resize(n), s.ln2_mean.resize(R), s.ln2_rstd.resize(R);
  k::layernorm_forward(s.ln2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), s.x1.data(), w["ln_2.weight"],
                       w["ln_2.bias"], R, C);
  s.fc.resize(4 * np), s.gelu.resize(4 * np);
  k::linear_forward(s.fc.data(), s.ln2.data(), w["mlp.c_fc.weight"], w["mlp.c_fc.bias"], R, C, 4 * Cp);
  k::gelu_forward(s.gelu.data(), s.fc.data(), 4 * np);
  row_parallel_forward(tp, x, s.gelu.data(), w["mlp.c_proj.weight"], w["mlp.c_proj.bias"], R, 4 * Cp, C);
  for (std::size_t i = 0; i < n; ++i) x[i] += s.x1[i];
}

// Given dx at the block's output, accumulates the block's gradients into g and leaves dx at its input.
// In a tensor-parallel group the column-parallel layers' input gradients (c_fc's and c_attn's, at the
// layer norms' outputs) are partial sums of this rank's columns, summed over the group before the
// layer norms' backward: dx, and with it every replicated tensor's gradient, is the same on every rank.
inline void block_backward(const config& c, const tp_group& tp, const fp32_unit& w, fp32_unit& g, int rows,
                           int t_len, const block_acts& s, std::vector<float>& dx) {
  namespace k = kernels;
  const int R = rows * t_len, C = c.embd, Cp = C / tp.size(), heads = c.heads / tp.size();
  const auto n = static_cast<std::size_t>(R) * C, np = static_cast<std::size_t>(R) * Cp;
  std::vector<float> dx1 = dx;  // the residual path around the MLP
  std::vector<float> dgelu(4 * np, 0.0f), dfc(4 * np, 0.0f), dln(n, 0.0f);
  k::linear_backward(dgelu.data(), g["mlp.c_proj.weight"], g["mlp.c_proj.bias"], dx.data(), s.gelu.data(),
                     w["mlp.c_proj.weight"], R, 4 * Cp, C);
  k::gelu_backward(dfc.data(), s.fc.data(), dgelu.data(), 4 * np);
  k::linear_backward(dln.data(), g["mlp.c_fc.weight"], g["mlp.c_fc.bias"], dfc.data(), s.ln2.data(),
                     w["mlp.c_fc.weight"], R, C, 4 * Cp);
  tp.sum(dln);
  k::layernorm_backward(dx1.data(), g["ln_2.weight"], g["ln_2.bias"], dln.data(), s.x1.data(), s.ln2_mean.data(),
                        s.ln2_rstd.data(), w["ln_2.weight"], R, C);
  dx = dx1;  // the residual path around the attention
  std::vector<float> datt(np, 0.0f), dqkv(3 * np, 0.0f);
  k::linear_backward(datt.data(), g["attn.c_proj.weight"], g["attn.c_proj.bias"], dx1.data(), s.att.data(),
                     w["attn.c_proj.weight"], R, Cp, C);
  k::attention_backward(dqkv.data(), datt.data(), s.qkv.data(), s.probs.data(), rows, t_len, Cp, heads);
  std::fill(dln.begin(), dln.end(), 0.0f);
  k::linear_backward(dln.data(), g["attn.c_attn.weight"], g["attn.c_attn.bias"], dqkv.data(), s.ln1.data(),
                     w["attn.c_attn.weight"], R, C, 3 * Cp);
  tp.sum(dln);
  k::layernorm_backward(dx.data(), g["ln_1.weight"], g["ln_1.bias"], dln.data(), s.in.data(), s.ln1_mean.data(),
                        s.ln1_rstd.data(), w["ln_1.weight"], R, C);
}

// block_forward with sequence parallelism: x holds this rank's rows of the residual stream, R / tp of
// rows x t_len. The same bits as block_forward for those rows.
inline void block_forward_sp(const config& c, const tp_group& tp, const fp32_unit& w, int rows, int t_len,
                             std::vector<float>& x, block_acts& s) {
  namespace k = kernels;
  const int R = rows * t_len, Rp = R / tp.size(), C = c.embd, Cp = C / tp.size(), heads = c.heads / tp.size();
  const auto np = static_cast<std::size_t>(R) * Cp, mine = static_cast<std::size_t>(Rp) * C;
  s.in = x;
  s.ln1.resize(mine), s.ln1_mean.resize(Rp), s.ln1_rstd.resize(Rp);
  k::layernorm_forward(s.ln1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), s.in.data(), w["ln_1.weight"],
                       w["ln_1.bias"], Rp, C);
  std::vector<float> full, partial(static_cast<std::size_t>(R) * C);
  tp.all_gather_rows(s.ln1, full);
  s.qkv.resize(3 * np);
  k::linear_forward(s.qkv.data(), full.data(), w["attn.c_attn.weight"], w["attn.c_attn.bias"], R, C, 3 * Cp);
  s.probs.resize(static_cast<std::size_t>(rows) * heads * t_len * t_len), s.att.resize(np);
  k::attention_forward(s.att.data(), s.probs.data(), s.qkv.data(), rows, t_len, Cp, heads);
  k::linear_forward(partial.data(), s.att.data(), w["attn.c_proj.weight"], nullptr, R, Cp, C);
  tp.reduce_scatter_rows(partial, s.x1);
  for (int r = 0; r < Rp; ++r) k::axpy(s.x1.data() + static_cast<std::size_t>(r) * C, 1.0f, w["attn.c_proj.bias"], C);
  for (std::size_t i = 0; i < mine; ++i) s.x1[i] += s.in[i];
  s.ln2.resize(mine), s.ln2_mean.resize(Rp), s.ln2_rstd.resize(Rp);
  k::layernorm_forward(s.ln2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), s.x1.data(), w["ln_2.weight"],
                       w["ln_2.bias"], Rp, C);
  tp.all_gather_rows(s.ln2, full);
  s.fc.resize(4 * np), s.gelu.resize(4 * np);
  k::linear_forward(s.fc.data(), full.data(), w["mlp.c_fc.weight"], w["mlp.c_fc.bias"], R, C, 4 * Cp);
  k::gelu_forward(s.gelu.data(), s.fc.data(), 4 * np);
  k::linear_forward(partial.data(), s.gelu.data(), w["mlp.c_proj.weight"], nullptr, R, 4 * Cp, C);
  tp.reduce_scatter_rows(partial, x);
  for (int r = 0; r < Rp; ++r) k::axpy(x.data() + static_cast<std::size_t>(r) * C, 1.0f, w["mlp.c_proj.bias"], C);
  for (std::size_t i = 0; i < mine; ++i) x[i] += s.x1[i];
}

// A layer norm's backward over this rank's rows, its weight and bias gradients accumulated through
// the group's ranks in order (the bits of one pass over every row).
inline void layernorm_backward_sp(const tp_group& tp, float* dx, float* dw, float* db, const float* dout,
                                  const float* in, const float* mean, const float* rstd, const float* w, int rows,
                                  int C) {
  const auto c = static_cast<std::size_t>(C);
  std::vector<float> acc(2 * c);
  std::copy_n(dw, c, acc.data());
  std::copy_n(db, c, acc.data() + c);
  tp.in_rank_order(acc.data(), acc.size(), [&](float* a) {
    std::copy_n(a, c, dw);
    std::copy_n(a + c, c, db);
    kernels::layernorm_backward(dx, dw, db, dout, in, mean, rstd, w, rows, C);
    std::copy_n(dw, c, a);
    std::copy_n(db, c, a + c);
  });
  std::copy_n(acc.data(), c, dw);
  std::copy_n(acc.data() + c, c, db);
}

// block_backward with sequence parallelism: dx holds this rank's rows. The same bits as block_backward.
inline void block_backward_sp(const config& c, const tp_group& tp, const fp32_unit& w, fp32_unit& g, int rows,
                              int t_len, const block_acts& s, std::vector<float>& dx) {
  namespace k = kernels;
  const int R = rows * t_len, Rp = R / tp.size(), C = c.embd, Cp = C / tp.size(), heads = c.heads / tp.size();
  const auto n = static_cast<std::size_t>(R) * C, np = static_cast<std::size_t>(R) * Cp;
  std::vector<float> dx1 = dx, dy, full, dln_mine;
  std::vector<float> dgelu(4 * np, 0.0f), dfc(4 * np, 0.0f), dln(n, 0.0f);
  tp.all_gather_rows(dx, dy);
  k::linear_backward(dgelu.data(), g["mlp.c_proj.weight"], g["mlp.c_proj.bias"], dy.data(), s.gelu.data(),
                     w["mlp.c_proj.weight"], R, 4 * Cp, C);
  k::gelu_backward(dfc.data(), s.fc.data(), dgelu.data(), 4 * np);
  tp.all_gather_rows(s.ln2, full);
  k::linear_backward(dln.data(), g["mlp.c_fc.weight"], g["mlp.c_fc.bias"], dfc.data(), full.data(),
                     w["mlp.c_fc.weight"], R, C, 4 * Cp);
  tp.reduce_scatter_rows(dln, dln_mine);
  layernorm_backward_sp(tp, dx1.data(), g["ln_2.weight"], g["ln_2.bias"], dln_mine.data(), s.x1.data(),
                        s.ln2_mean.data(), s.ln2_rstd.data(), w["ln_2.weight"], Rp, C);
  dx = dx1;
  std::vector<float> datt(np, 0.0f), dqkv(3 * np, 0.0f);
  tp.all_gather_rows(dx1, dy);
  k::linear_backward(datt.data(), g["attn.c_proj.weight"], g["attn.c_proj.bias"], dy.data(), s.att.data(),
                     w["attn.c_proj.weight"], R, Cp, C);
  k::attention_backward(dqkv.data(), datt.data(), s.qkv.data(), s.probs.data(), rows, t_len, Cp, heads);
  std::fill(dln.begin(), dln.end(), 0.0f);
  tp.all_gather_rows(s.ln1, full);
  k::linear_backward(dln.data(), g["attn.c_attn.weight"], g["attn.c_attn.bias"], dqkv.data(), full.data(),
                     w["attn.c_attn.weight"], R, C, 3 * Cp);
  tp.reduce_scatter_rows(dln, dln_mine);
  layernorm_backward_sp(tp, dx.data(), g["ln_1.weight"], g["ln_1.bias"], dln_mine.data(), s.in.data(),
                        s.ln1_mean.data(), s.ln1_rstd.data(), w["ln_1.weight"], Rp, C);
}

// This rank's block of rows of a full [R x C] tensor, and the full tensor back from every rank's block.
inline std::vector<float> my_rows(const tp_group& tp, const std::vector<float>& full) {
  const std::size_t n = full.size() / static_cast<std::size_t>(tp.size());
  return {full.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(tp.rank()) * n),
          full.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(tp.rank() + 1) * n)};
}

// tutorial:begin forward
// The forward pass. with_unit(u, f) calls f with unit u's parameters in fp32; in training it is
// `gathered` below (gather, widen, release), so at most one unit is gathered at a time. The token
// embedding is gathered twice: at the start, and again at the end as the output layer. tp: the
// tensor-parallel group the blocks are split over (tp_group{} when there is none).
template <class WithUnit>
void forward(const config& c, const tp_group& tp, WithUnit&& with_unit, activations& a,
             const block_checkpoints& checkpoints = {}) {
  const int R = a.rows * a.t_len, C = c.embd;
  a.x.assign(static_cast<std::size_t>(R) * C, 0.0f);
  with_unit(wte, [&](const fp32_unit& w) {  // x = wte[token] + wpe[position]
    for (int r = 0; r < R; ++r)
      std::copy_n(w["weight"] + static_cast<std::size_t>(a.tokens[r]) * C, C, a.x.data() + static_cast<std::size_t>(r) * C);
  });
  with_unit(wpe, [&](const fp32_unit& w) {
    for (int r = 0; r < R; ++r)
      kernels::axpy(a.x.data() + static_cast<std::size_t>(r) * C, 1.0f, w["weight"] + static_cast<std::size_t>(r % a.t_len) * C, C);
  });
  a.sequence_parallel = tp.splits_rows(R);
  a.checkpointed = checkpoints.on();
  a.recompute_floats = 0;
  a.blocks.assign(a.checkpointed ? 0 : static_cast<std::size_t>(c.layers), block_acts{});
  // Each block's input into the store, and what the block's forward keeps into a scratch freed after it.
  const auto run_block = [&](int l, std::vector<float>& x, auto&& block_pass) {
    if (!a.checkpointed) return with_unit(block(l), [&](const fp32_unit& w) { block_pass(w, x, a.blocks[l]); });
    checkpoints.save(l, x);
    block_acts scratch;
    with_unit(block(l), [&](const fp32_unit& w) { block_pass(w, x, scratch); });
    a.recompute_floats = std::max(a.recompute_floats, scratch.floats());
  };
  if (a.sequence_parallel) {  // the blocks on this rank's rows; then the rows of every rank again
    // (Pa would mix the ranks' different rows: sequence parallelism already splits them.)
    ZERO_CHECK(!a.checkpointed || !checkpoints.partitions(), invalid_argument,
               "gpt::forward: with sequence parallelism each rank's block inputs are its own rows; a checkpoint "
               "store that partitions them over the group (Pa, Pa+cpu) would mix them");
    std::vector<float> x = my_rows(tp, a.x);
    for (int l = 0; l < c.layers; ++l)
      run_block(l, x, [&](const fp32_unit& w, std::vector<float>& xs, block_acts& s) {
        block_forward_sp(c, tp, w, a.rows, a.t_len, xs, s);
      });
    tp.all_gather_rows(x, a.x);
  } else {
    for (int l = 0; l < c.layers; ++l)
      run_block(l, a.x, [&](const fp32_unit& w, std::vector<float>& xs, block_acts& s) {
        block_forward(c, tp, w, a.rows, a.t_len, xs, s);
      });
  }
  with_unit(ln_f(c), [&](const fp32_unit& w) {
    a.xf_in = a.x;
    a.xf.resize(a.x.size()), a.xf_mean.resize(R), a.xf_rstd.resize(R);
    kernels::layernorm_forward(a.xf.data(), a.xf_mean.data(), a.xf_rstd.data(), a.xf_in.data(), w["weight"],
                               w["bias"], R, C);
  });
  with_unit(wte, [&](const fp32_unit& w) {  // the output layer: logits = xf wte^T, the same tensor again
    a.logits.resize(static_cast<std::size_t>(R) * c.vocab);
    kernels::linear_forward(a.logits.data(), a.xf.data(), w["weight"], nullptr, R, C, c.vocab);
  });
}

// The with_unit of a pass through the engine: gathers the unit (an all-gather in stage 3, a view
// otherwise), widens it to fp32 for the kernels and releases it.
template <class Engine>
auto gathered(Engine& e) {
  return [&e](zero::unit_id u, auto&& f) {
    auto p = e.gather(u);
    const fp32_unit w(p.view());
    f(w);
    p.release();
  };
}
// tutorial:end

// tutorial:begin backward
// The backward pass, units in reverse: gather, grads, kernels, reduce, release. dlogits is the
// gradient of the loss (times the loss scale) at the logits. The tied weight collects two parts:
// the output layer's, first, and the token embedding's, last; grads(wte) hands out the same buffer
// both times (zero at its first use in the step), and wte is reduced once, after both.
template <class Engine>
void backward(Engine& e, const config& c, const tp_group& tp, const activations& a, const std::vector<float>& dlogits,
              const block_checkpoints& checkpoints = {}) {
  const int R = a.rows * a.t_len, C = c.embd;
  std::vector<float> dx(static_cast<std::size_t>(R) * C, 0.0f);
  {  // the output layer: dx = dlogits wte, dwte += dlogits^T xf; not reduced yet
    auto p = e.gather(wte);
    auto g = e.grads(wte);
    const fp32_unit w(p.view());
    fp32_unit dw(g.view(), true);
    kernels::linear_backward(dx.data(), dw["weight"], nullptr, dlogits.data(), a.xf.data(), w["weight"], R, C, c.vocab);
    dw.add_to(g.view());
    p.release();
  }
  {
    auto p = e.gather(ln_f(c));
    auto g = e.grads(ln_f(c));
    const fp32_unit w(p.view());
    fp32_unit dw(g.view(), true);
    std::vector<float> din(dx.size(), 0.0f);
    kernels::layernorm_backward(din.data(), dw["weight"], dw["bias"], dx.data(), a.xf_in.data(), a.xf_mean.data(),
                                a.xf_rstd.data(), w["weight"], R, C);
    dw.add_to(g.view());
    e.reduce(ln_f(c));
    p.release();
    dx.swap(din);
  }
  if (a.sequence_parallel) dx = my_rows(tp, dx);
  for (int l = c.layers - 1; l >= 0; --l) {
    auto p = e.gather(block(l));
    auto g = e.grads(block(l));
    const fp32_unit w(p.view());
    fp32_unit dw(g.view(), true);
    block_acts recomputed;
    if (a.checkpointed) {  // the block's input back from the store, the next one's on its way, the block again
      const std::span<const float> in = checkpoints.restore(l);
      std::vector<float> x(in.begin(), in.end());
      if (l > 0) checkpoints.prefetch(l - 1);
      if (a.sequence_parallel)
        block_forward_sp(c, tp, w, a.rows, a.t_len, x, recomputed);
      else
        block_forward(c, tp, w, a.rows, a.t_len, x, recomputed);
    }
    const block_acts& s = a.checkpointed ? recomputed : a.blocks[static_cast<std::size_t>(l)];
    if (a.sequence_parallel)
      block_backward_sp(c, tp, w, dw, a.rows, a.t_len, s, dx);
    else
      block_backward(c, tp, w, dw, a.rows, a.t_len, s, dx);
    if (a.checkpointed) checkpoints.release(l);
    dw.add_to(g.view());
    e.reduce(block(l));
    p.release();
  }
  if (a.sequence_parallel) {
    std::vector<float> mine = std::move(dx);
    tp.all_gather_rows(mine, dx);
  }
  // The embeddings do not read their parameters in the backward pass; they are gathered anyway,
  // as the protocol (and the stage 3 traffic formula) has every unit gathered in both passes.
  {
    auto p = e.gather(wpe);
    auto g = e.grads(wpe);
    fp32_unit dw(g.view(), true);
    for (int r = 0; r < R; ++r)
      kernels::axpy(dw["weight"] + static_cast<std::size_t>(r % a.t_len) * C, 1.0f, dx.data() + static_cast<std::size_t>(r) * C, C);
    dw.add_to(g.view());
    e.reduce(wpe);
    p.release();
  }
  {  // the token embedding: the second part of the tied weight's gradient, then its one reduce
    auto p = e.gather(wte);
    auto g = e.grads(wte);
    fp32_unit dw(g.view(), true);
    for (int r = 0; r < R; ++r)
      kernels::axpy(dw["weight"] + static_cast<std::size_t>(a.tokens[r]) * C, 1.0f, dx.data() + static_cast<std::size_t>(r) * C, C);
    dw.add_to(g.view());
    e.reduce(wte);
    p.release();
  }
}
// tutorial:end

struct step_result {
  double loss = 0.0;  // mean over this rank's tokens, nats
  int correct = 0;    // next-token predictions whose argmax was right
  zero::step_report report;
  std::uint64_t block_activation_bytes = 0;  // what a micro-batch's blocks kept for the backward pass, this rank
};

// Fills a's tokens and targets with the training sequences first .. first + rows - 1 (global indices)
// of step `step`.
inline void training_batch(const config& c, const corpus& data, std::uint64_t step, int first, int rows,
                           activations& a) {
  a.rows = rows;
  a.t_len = c.context;
  a.tokens.resize(static_cast<std::size_t>(rows) * c.context);
  a.targets.resize(a.tokens.size());
  for (int j = 0; j < rows; ++j) {
    const std::size_t start =
        train_window(data, c.context, c.seed, step, static_cast<std::uint64_t>(first) + static_cast<std::uint64_t>(j));
    for (int t = 0; t < c.context; ++t) {
      a.tokens[static_cast<std::size_t>(j) * c.context + t] = data.tokens[start + t];
      a.targets[static_cast<std::size_t>(j) * c.context + t] = data.tokens[start + t + 1];
    }
  }
}

// tutorial:begin step
// One training step of this rank on its share of the global batch, in `micro_batches` equal parts:
// forward, the loss, backward; then the engine's step. The loss gradient is the mean over this
// rank's tokens, times the loss scale (fp16), divided by the micro-batches: the engine sums over
// ranks and divides by N and by the loss scale in step(). In the reproducible mode the engine divides
// by all N x M micro-batches itself, so a micro-batch's gradient does not depend on M. In a mesh,
// rank and ranks are the data-parallel ones: the ranks of a tensor-parallel group share their batch.
template <class Engine>
step_result train_step(Engine& e, const config& c, const tp_group& tp, const corpus& data, std::uint64_t step,
                       int rank, int ranks, int micro_batches, const block_checkpoints& checkpoints = {}) {
  check_pieces(c, tp, e.spec());
  const int rows = c.batch / ranks / micro_batches;  // sequences per micro-batch on this rank
  const int R = rows * c.context;
  step_result res;
  activations a;
  std::vector<float> dlogits(static_cast<std::size_t>(R) * c.vocab);
  for (int m = 0; m < micro_batches; ++m) {
    training_batch(c, data, step, (rank * micro_batches + m) * rows, rows, a);
    forward(c, tp, gathered(e), a, checkpoints);
    const float per_step = e.options().reproducible ? 1.0f : static_cast<float>(micro_batches);
    const float grad_scale = e.loss_scale() / static_cast<float>(R) / per_step;
    int correct = 0;
    const double loss_sum =
        kernels::cross_entropy(a.logits.data(), a.targets.data(), dlogits.data(), grad_scale, R, c.vocab, correct);
    res.loss += loss_sum / R / micro_batches;
    res.correct += correct;
    res.block_activation_bytes = std::max(res.block_activation_bytes, a.block_bytes());
    backward(e, c, tp, a, dlogits, checkpoints);
  }
  res.report = e.step();
  return res;
}
// tutorial:end

// Mean loss (nats per token) and next-token accuracy over the windows starting at `starts`, every
// rank taking every N-th window: a forward pass through the engine (gathers, no grads, no reduce;
// call it inside an e.evaluation() scope, between steps), `chunk` windows at a time. Every rank runs the same number of passes (the
// last ones may be empty) because stage 3's gathers are collectives. Collective. In a mesh, comm is
// the data-parallel group: the ranks of a tensor-parallel group evaluate the same windows together.
template <class Engine, class Comm>
std::pair<double, double> evaluate(Engine& e, Comm& comm, const config& c, const tp_group& tp, const corpus& data,
                                   const std::vector<std::size_t>& starts, int chunk) {
  check_pieces(c, tp, e.spec());
  const int ranks = comm.size(), rank = comm.rank();
  std::vector<std::size_t> mine;
  for (std::size_t j = static_cast<std::size_t>(rank); j < starts.size(); j += static_cast<std::size_t>(ranks))
    mine.push_back(starts[j]);
  const std::size_t per_rank = (starts.size() + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
  const std::size_t passes = (per_rank + static_cast<std::size_t>(chunk) - 1) / static_cast<std::size_t>(chunk);
  double sums[2] = {0.0, 0.0};  // loss, correct
  activations a;
  for (std::size_t pass = 0; pass < passes; ++pass) {
    const std::size_t first = pass * static_cast<std::size_t>(chunk);
    const std::size_t rows = first < mine.size() ? std::min(mine.size() - first, static_cast<std::size_t>(chunk)) : 0;
    a.rows = static_cast<int>(rows);
    a.t_len = c.context;
    a.tokens.resize(rows * static_cast<std::size_t>(c.context));
    a.targets.resize(a.tokens.size());
    for (std::size_t j = 0; j < rows; ++j)
      for (int t = 0; t < c.context; ++t) {
        a.tokens[j * c.context + t] = data.tokens[mine[first + j] + t];
        a.targets[j * c.context + t] = data.tokens[mine[first + j] + t + 1];
      }
    forward(c, tp, gathered(e), a);
    int correct = 0;
    sums[0] += kernels::cross_entropy(a.logits.data(), a.targets.data(), nullptr, 0.0f,
                                      static_cast<int>(rows) * c.context, c.vocab, correct);
    sums[1] += correct;
  }
  comm.all_reduce(sums, sums, 2, zero::reduce_op::sum);
  const double tokens = static_cast<double>(starts.size()) * c.context;
  return {sums[0] / tokens, sums[1] / tokens};
}

// Continues `prompt` by n bytes, sampling each from the softmax at `temperature` with the
// counter-based generator (0: the most likely byte). Rank 0 computes (in a mesh, the tensor-parallel
// group of data-parallel rank 0); the other ranks make the same gathers with no rows, since stage 3's
// gathers are collectives. Inside an e.evaluation() scope, like evaluate. Collective; rank 0's result.
template <class Engine>
std::string generate(Engine& e, const config& c, const tp_group& tp, const corpus& data, const std::string& prompt,
                     int n, float temperature, std::uint64_t seed) {
  check_pieces(c, tp, e.spec());
  std::vector<int> context;
  for (unsigned char ch : prompt) {
    ZERO_CHECK(data.id[ch] >= 0, invalid_argument, "gpt: the prompt's byte ", static_cast<int>(ch),
               " does not occur in the corpus");
    context.push_back(data.id[ch]);
  }
  ZERO_CHECK(!context.empty(), invalid_argument, "gpt: the prompt is empty");
  std::string out;
  activations a;
  const bool computes = e.rank() == 0;
  for (int i = 0; i < n; ++i) {
    const int t_len = std::min(static_cast<int>(context.size()), c.context);
    a.rows = computes ? 1 : 0;
    a.t_len = t_len;
    a.tokens.assign(context.end() - (computes ? t_len : 0), context.end());
    forward(c, tp, gathered(e), a);
    if (!computes) continue;
    const float* z = a.logits.data() + static_cast<std::size_t>(t_len - 1) * c.vocab;
    int next = static_cast<int>(std::max_element(z, z + c.vocab) - z);
    if (temperature > 0.0f) {
      std::vector<double> p(static_cast<std::size_t>(c.vocab));
      double sum = 0.0;
      for (int k = 0; k < c.vocab; ++k) sum += p[k] = std::exp((z[k] - z[next]) / temperature);
      double u = (static_cast<double>(mlp::key(seed, 7, static_cast<std::uint64_t>(i)) >> 11) * 0x1.0p-53) * sum;
      for (next = 0; next + 1 < c.vocab && u >= p[next]; ++next) u -= p[next];
    }
    context.push_back(next);
    out.push_back(data.vocab[static_cast<std::size_t>(next)]);
  }
  return out;
}

}  // namespace gpt
