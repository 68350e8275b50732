// The engine in a tensor-parallel mesh: pieces of split tensors, the whole mesh's norm, skip and checks, equal to tp
// = 1.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
#include "../tp_model.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/zero.hpp"

namespace {

using zero::comm::mesh;
using zero::comm::mesh_shape;
using zero::comm::threads;
using namespace tp_model;

struct outcome {
  std::vector<float> whole;                             // full_model_params(), the same on every rank
  std::vector<std::vector<zero::step_report>> reports;  // per world rank
  std::vector<zero::comm_report> comm;
};

// Trains the model on a dp x tp mesh of threads (tp = 1: a plain engine over the whole world).
template <class Stage, class Prec = zero::precision::fp32>
outcome train(mesh_shape shape, int steps, zero::engine_options eo = {}, zero::optim::adamw opt = {}) {
  outcome out;
  const int world = shape.dp * shape.tp;
  out.reports.resize(static_cast<std::size_t>(world));
  out.comm.resize(static_cast<std::size_t>(world));
  std::vector<std::vector<float>> wholes(static_cast<std::size_t>(world));
  threads::launch(world, [&](threads& c) {
    mesh<threads> m(c, shape);
    zero::engine<Stage, threads, zero::optim::adamw, Prec> e(m, model(), opt, eo);
    e.initialize(zero::from_whole_tensors(whole_init()));
    const auto r = static_cast<std::size_t>(c.rank());
    for (int t = 0; t < steps; ++t)
      out.reports[r].push_back(mesh_step(e, m.coordinates().dp, static_cast<std::uint64_t>(t)));
    wholes[r] = e.full_model_params();
    out.comm[r] = e.comm();
  });
  for (const auto& w : wholes) CHECK(w == wholes[0]);
  out.whole = wholes[0];
  return out;
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("model_spec: tp_split and tp_replicated, pieces of every size, whole indices, refusals naming the tensor") {
  const zero::model_spec m = model();
  CHECK(m.has_split_tensors());
  CHECK(m.piece(1, 0) == m);
  const zero::model_spec p = m.piece(2, 1);
  const zero::unit_spec& block = p.at(p.find("block"));
  CHECK(block.tensors[0].shape == std::vector<std::size_t>{6, 6});  // w_in: columns halved
  CHECK(block.tensors[2].shape == std::vector<std::size_t>{6, 6});  // w_out: rows halved
  CHECK(block.tensors[3].shape == std::vector<std::size_t>{6});     // b_out: whole
  CHECK(block.tensors[0].tp_parts == 2);
  CHECK(block.tensors[0].tp_index == 1);
  CHECK(block.tensors[3].tp_parts == 1);
  CHECK(zero::whole_shape(block.tensors[0]) == std::vector<std::size_t>{6, 12});
  // Column piece 1 of a 6 x 12 matrix: row r holds whole columns 6..11, at whole index 12 r + 6 + c.
  for (std::size_t i = 0; i < 36; ++i) CHECK(zero::whole_index(block.tensors[0], i) == i / 6 * 12 + 6 + i % 6);
  // Row piece 1 of a 12 x 6 matrix: the last 36 elements.
  for (std::size_t i = 0; i < 36; ++i) CHECK(zero::whole_index(block.tensors[2], i) == 36 + i);
  CHECK_THROWS_WITH_AS((void)m.piece(5, 0), doctest::Contains("tensor 'w_in': dimension 1 (12) cannot be cut into 5"),
                       zero::error);
  CHECK_THROWS_WITH_AS((void)p.piece(2, 0), doctest::Contains("is already a piece"), zero::error);
  zero::model_spec bad;
  CHECK_THROWS_WITH_AS(bad.unit("u").tensor("w", {4, 4}, zero::tp_split(2)),
                       doctest::Contains("tensor 'w': tp_split(2) of a tensor with 2 dimension(s)"), zero::error);
  // The adapter: each piece receives the whole tensor's values at its elements, in any range.
  const zero::init_range_fn pieces = zero::from_whole_tensors(whole_init());
  std::vector<float> v(36);
  pieces(block, block.tensors[0], zero::range{0, 36}, std::span<float>(v));
  const auto bases = whole_bases(m);
  for (std::size_t i = 0; i < 36; ++i) CHECK(v[i] == initial(bases[1][0] + zero::whole_index(block.tensors[0], i)));
  std::vector<float> part(7);
  pieces(block, block.tensors[0], zero::range{3, 10}, std::span<float>(part));
  for (std::size_t i = 0; i < 7; ++i) CHECK(part[i] == v[3 + i]);
}

TEST_CASE("tensor parallel: the norm counts every element once (tp = 2 gives tp = 1's norm), every stage") {
  // The bug the anchors had: replicated tensors' squares added once per tensor-parallel rank. Here the
  // norm of a 2 x 2 mesh must be that of the same model on 2 ranks without tensor parallelism: within
  // one ulp of its fp32 value by default (the squares are summed in another grouping), and the same
  // bits in the reproducible mode (an exact sum).
  for (const bool repro : {false, true}) {
    CAPTURE(repro);
    zero::engine_options eo;
    eo.compute_grad_norm = true;
    eo.reproducible = repro;
    const outcome one = train<zero::stage1>({2, 1}, 3, eo);
    const outcome two = train<zero::stage1>({2, 2}, 3, eo);
    const outcome two3 = train<zero::stage3>({2, 2}, 3, eo);
    for (std::size_t t = 0; t < 3; ++t) {
      const double n1 = one.reports[0][t].grad_norm;
      for (const outcome* o : {&two, &two3})
        for (const auto& rep : o->reports) {
          if (repro) {
            CHECK(rep[t].grad_norm == n1);
          } else {
            const float a = static_cast<float>(rep[t].grad_norm), b = static_cast<float>(n1);
            CHECK(std::abs(static_cast<std::int64_t>(bits(a)) - static_cast<std::int64_t>(bits(b))) <= 1);
          }
        }
    }
    // The test can fail: counting the replicated tensors twice moves the norm far beyond one ulp.
    CHECK(one.reports[0][0].grad_norm > 0.0);
  }
}

TEST_CASE(
    "tensor parallel: every stage at 2 x 2 trains the model tp = 1 trains, bit for bit (clipping: reproducible)") {
  zero::engine_options plain;
  zero::engine_options clipped;
  clipped.clip_norm = 0.05f;
  clipped.reproducible = true;
  for (const auto& eo : {plain, clipped}) {
    CAPTURE(eo.reproducible);
    const outcome ref = train<zero::stage0>({2, 1}, 4, eo);
    CHECK(train<zero::stage0>({2, 2}, 4, eo).whole == ref.whole);
    CHECK(train<zero::stage1>({2, 2}, 4, eo).whole == ref.whole);
    CHECK(train<zero::stage2>({2, 2}, 4, eo).whole == ref.whole);
    const outcome s3 = train<zero::stage3>({2, 2}, 4, eo);
    CHECK(s3.whole == ref.whole);
    if (eo.reproducible) CHECK(ref.reports[0][0].grad_norm > eo.clip_norm);  // the clipping did act
    // The norm's exchange: one all-gather over the tensor-parallel group per step (two in the
    // reproducible mode: the summaries, then the words), and one for full_model_params.
    constexpr auto all_gather = static_cast<std::size_t>(zero::comm::collective::all_gather);
    CHECK(s3.comm[0].tensor_parallel.calls[all_gather] == 4 * (eo.reproducible ? 2u : 1u) + 1);
    CHECK(s3.comm[0].tensor_parallel.total_bytes() == s3.comm[0].tensor_parallel.bytes[all_gather]);
    CHECK(ref.comm[0].tensor_parallel.total_bytes() == 0);
  }
}

TEST_CASE("tensor parallel: zero::plan of a rank's pieces at N = dp is the mesh engine's memory and control traffic") {
  for (const bool repro : {false, true})
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(repro);
      CAPTURE(Stage::stage);
      zero::engine_options eo;
      eo.reproducible = repro;
      std::size_t transient = 0, total = 0;
      zero::comm::comm_stats control;
      threads::launch(4, [&](threads& c) {
        mesh<threads> m(c, {2, 2});
        zero::engine<Stage, threads, zero::optim::adamw> e(m, model(), {}, eo);
        e.initialize(zero::from_whole_tensors(whole_init()));
        for (std::uint64_t t = 0; t < 2; ++t) mesh_step(e, m.coordinates().dp, t);
        if (c.rank() == 0) {
          transient = e.memory().peak_bytes(zero::mem_category::transient);
          total = e.memory().peak_total;
          control = e.comm().control;
        }
      });
      const zero::model_spec pieces = model().piece(2, 0);
      CHECK(pieces.tensor_parallel_parts() == 2);
      const zero::plan_report p = zero::plan_for<Stage, zero::optim::adamw, zero::precision::fp32>(pieces, 2, eo);
      CHECK(p.step_transient_peak == transient);
      CHECK(p.peak_bytes == total);
      for (int k = 0; k < zero::comm::collective_count; ++k) {
        CHECK(2 * p.control_comm.bytes[static_cast<std::size_t>(k)] == control.bytes[static_cast<std::size_t>(k)]);
        CHECK(2 * p.control_comm.calls[static_cast<std::size_t>(k)] == control.calls[static_cast<std::size_t>(k)]);
      }
    });
}

TEST_CASE("tensor parallel with replicated shard groups: the mesh's bits in the reproducible mode, every stage") {
  // HSDP inside a mesh: the data-parallel group of 4 split into 2 shard groups of 2. Reduced within a
  // group and then across the replicas, the exact sums equal the plain mesh's; by default each stage
  // gives the bits of stage 0 with the same groups (one sum order per N and S).
  zero::engine_options repro;
  repro.reproducible = true;
  repro.clip_norm = 0.5f;
  zero::engine_options hsdp = repro;
  hsdp.shard_group_size = 2;
  zero::engine_options plain_hsdp;
  plain_hsdp.shard_group_size = 2;
  const outcome reference = train<zero::stage1>({4, 2}, 3, repro);
  const outcome by_default = train<zero::stage0>({4, 2}, 3, plain_hsdp);
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    const outcome o = train<Stage>({4, 2}, 3, hsdp);
    CHECK(o.whole == reference.whole);
    for (std::size_t r = 0; r < o.reports.size(); ++r) {
      CHECK(o.reports[r].back().grad_norm == reference.reports[r].back().grad_norm);
      CHECK(o.comm[r].tensor_parallel.bytes == reference.comm[r].tensor_parallel.bytes);
    }
    CHECK(train<Stage>({4, 2}, 3, plain_hsdp).whole == by_default.whole);
  });
}

TEST_CASE("tensor parallel with replicated shard groups: zero::plan of a rank's pieces is the engine's memory and traffic") {
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    zero::engine_options eo;
    eo.shard_group_size = 2;
    std::size_t total = 0;
    zero::comm::comm_stats protocol, control;
    threads::launch(8, [&](threads& c) {
      mesh<threads> m(c, {4, 2});
      zero::engine<Stage, threads, zero::optim::adamw> e(m, model(), {}, eo);
      CHECK(e.replicas() == 2);
      CHECK(e.shard_group_size() == 2);
      e.initialize(zero::from_whole_tensors(whole_init()));
      for (std::uint64_t t = 0; t < 2; ++t) mesh_step(e, m.coordinates().dp, t);
      if (c.rank() == 0) {
        total = e.memory().peak_total;
        protocol = e.comm().last_step;
        control = e.comm().control;
        CHECK(e.comm().last_step.total_bytes() == e.comm_formula_bytes());
      }
    });
    const zero::plan_report p = zero::plan_for<Stage, zero::optim::adamw, zero::precision::fp32>(model().piece(2, 0), 4, eo);
    CHECK(p.peak_bytes == total);
    CHECK(p.step_comm.total_bytes() == protocol.total_bytes());
    CHECK(2 * p.control_comm.total_bytes() == control.total_bytes());
  });
}

TEST_CASE("tensor parallel: a non-finite gradient on one rank of the mesh skips the step on every rank") {
  for (const plant p : {plant::nan_in_split_piece, plant::nan_in_replicated_on_tp1}) {
    CAPTURE(static_cast<int>(p));
    std::vector<std::vector<zero::step_report>> reports(4);
    std::vector<float> scales(4);
    threads::launch(4, [&](threads& c) {
      mesh<threads> m(c, {2, 2});
      zero::engine_options eo;
      eo.loss_scale.initial = 1024.0f;  // gradients of about 1 fit fp16 at this scale
      zero::engine<zero::stage2, threads, zero::optim::adamw, zero::precision::fp16> e(m, model(), {}, eo);
      e.initialize(zero::from_whole_tensors(whole_init()));
      for (std::uint64_t t = 0; t < 3; ++t)
        reports[static_cast<std::size_t>(c.rank())].push_back(mesh_step(e, m.coordinates().dp, t, p));
      scales[static_cast<std::size_t>(c.rank())] = e.loss_scale();
    });
    for (const auto& r : reports) {
      CHECK(!r[0].skipped);
      CHECK(r[1].skipped);  // planted on one rank at step 1
      CHECK(!r[2].skipped);
      CHECK(r[2].loss_scale == reports[0][2].loss_scale);
    }
    for (float s : scales) CHECK(s == scales[0]);
  }
}

TEST_CASE("tensor parallel: replicated gradients that differ across the group stop every rank, naming the cause") {
  for (const bool repro : {false, true}) {
    CAPTURE(repro);
    zero::engine_options eo;
    eo.reproducible = repro;
    std::vector<std::string> errors(4);
    CHECK_THROWS_WITH_AS(threads::launch(4,
                                         [&](threads& c) {
                                           mesh<threads> m(c, {2, 2});
                                           zero::engine<zero::stage1, threads, zero::optim::adamw> e(m, model(), {},
                                                                                                     eo);
                                           e.initialize(zero::from_whole_tensors(whole_init()));
                                           try {
                                             mesh_step(e, m.coordinates().dp, 0, plant::replicated_grad_differs);
                                           } catch (const zero::error& x) {
                                             errors[static_cast<std::size_t>(c.rank())] = x.what();
                                             throw;
                                           }
                                         }),
                         doctest::Contains("replicated tensors differ across the tensor-parallel group"), zero::error);
    for (const auto& x : errors) CHECK(x.find("replicated tensors differ") != std::string::npos);  // every rank
  }
}

TEST_CASE("tensor parallel: the init check catches a replicated tensor filled per piece and pieces filled as wholes") {
  // Every piece filled with the whole tensor's first values, ignoring which piece it is: also
  // what a tensor that is really replicated but declared tp_split looks like.
  const zero::init_range_fn ignores_piece = [](const zero::unit_spec&, const zero::tensor_spec&, zero::range r,
                                               std::span<float> v) {
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.01f * static_cast<float>(r.begin + j);
  };
  struct mistake {
    bool replicated_differs;
    const char* says;
  };
  for (const mistake k :
       {mistake{true, "a replicated tensor (tp_replicated) has other values on tensor-parallel rank 1"},
        mistake{false, "tensor 'w_in': every tensor-parallel rank holds the same values"}}) {
    for (const bool ranges : {false, true})
      for (const int stage : {0, 3}) {
        CAPTURE(k.says);
        CAPTURE(ranges);
        CAPTURE(stage);
        auto body = [&]<class Stage>(Stage) {
          threads::launch(4, [&](threads& c) {
            mesh<threads> m(c, {2, 2});
            zero::engine<Stage, threads, zero::optim::adamw> e(m, model());
            const int tp = m.coordinates().tp;
            const zero::init_range_fn fn = [&](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r,
                                               std::span<float> v) {
              if (k.replicated_differs) {
                zero::from_whole_tensors(whole_init())(u, t, r, v);
                if (u.name == "head" && t.name == "b")
                  for (float& x : v) x += 0.25f * static_cast<float>(tp);
              } else {
                ignores_piece(u, t, r, v);
              }
            };
            if (ranges) {
              e.initialize(fn);
            } else {
              e.initialize([&](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
                fn(u, t, zero::range{0, v.size()}, v);
              });
            }
          });
        };
        if (stage == 0)
          CHECK_THROWS_WITH_AS(body(zero::stage0{}), doctest::Contains(k.says), zero::error);
        else
          CHECK_THROWS_WITH_AS(body(zero::stage3{}), doctest::Contains(k.says), zero::error);
      }
  }
  // The correct fill passes, and constant pieces (a zero bias) are not mistaken for copies.
  threads::launch(4, [&](threads& c) {
    mesh<threads> m(c, {2, 2});
    zero::engine<zero::stage3, threads, zero::optim::adamw> e(m, model());
    e.initialize(zero::from_whole_tensors(whole_init()));
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, zero::range, std::span<float> v) {
      for (float& x : v) x = 0.0f;
    });
  });
}

TEST_CASE("tensor parallel: settings and optimizers that differ across the group are refused on every rank") {
  // At construction: the options of one tensor-parallel rank differ.
  CHECK_THROWS_WITH_AS(threads::launch(4,
                                       [&](threads& c) {
                                         mesh<threads> m(c, {2, 2});
                                         zero::engine_options eo;
                                         eo.clip_norm = m.coordinates().tp == 1 ? 1.0f : 0.0f;
                                         zero::engine<zero::stage2, threads, zero::optim::adamw> e(m, model(), {}, eo);
                                       }),
                       doctest::Contains("engine_options::clip_norm is 0 on rank 0 but 1 on rank 1"), zero::error);
  // At a step: one tensor-parallel rank changed its learning rate. Stage 0 checks it apart from the
  // norm, stage 2 on the norm's collective; either way every rank throws before any update.
  for (const int stage : {0, 2}) {
    CAPTURE(stage);
    std::vector<std::string> errors(4);
    auto body = [&]<class Stage>(Stage) {
      threads::launch(4, [&](threads& c) {
        mesh<threads> m(c, {2, 2});
        zero::engine<Stage, threads, zero::optim::adamw> e(m, model());
        e.initialize(zero::from_whole_tensors(whole_init()));
        if (c.rank() == 3) e.set_learning_rate(0.5f);
        try {
          mesh_step(e, m.coordinates().dp, 0);
        } catch (const zero::error& x) {
          errors[static_cast<std::size_t>(c.rank())] = x.what();
          throw;
        }
      });
    };
    if (stage == 0)
      CHECK_THROWS_AS(body(zero::stage0{}), zero::error);
    else
      CHECK_THROWS_AS(body(zero::stage2{}), zero::error);
    for (const auto& x : errors)
      CHECK(x.find("optim::adamw::lr is 0.001 on rank 0 but 0.5 on rank 3") != std::string::npos);
  }
}

TEST_CASE("tensor parallel: a tensor-wise optimizer is refused inside a mesh (tp > 1), naming it, on every rank") {
  std::vector<std::string> errors(4);
  CHECK_THROWS_AS(threads::launch(4,
                                  [&](threads& c) {
                                    mesh<threads> m(c, {2, 2});
                                    try {
                                      zero::engine<zero::stage1, threads, zero::optim::lamb> e(m, model());
                                    } catch (const zero::error& x) {
                                      errors[static_cast<std::size_t>(c.rank())] = x.what();
                                      throw;
                                    }
                                  }),
                  zero::error);
  for (const auto& x : errors) CHECK(x.find("optim::lamb needs each tensor's norms") != std::string::npos);
  // At tp = 1 the mesh's engine is the plain one, and takes it.
  threads::launch(2, [&](threads& c) {
    mesh<threads> m(c, {2, 1});
    zero::engine<zero::stage1, threads, zero::optim::lamb> e(m, model());
    e.initialize(zero::from_whole_tensors(whole_init()));
    mesh_step(e, m.coordinates().dp, 0);
  });
}
