// Checkpoints of an engine in a tensor-parallel mesh: split tensors stored in pieces, loaded at another tp, dp and stage.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../tp_model.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/zero.hpp"

using zero::comm::mesh;
using zero::comm::mesh_shape;
using zero::comm::threads;
using namespace tp_model;

namespace {

// Trains `steps` steps from step `from` on a dp x tp mesh, after a load from `dir` where it is not
// empty (else from the initial values); saves into `save_to` where it is not empty. Returns the
// whole model's parameters.
template <class Stage>
std::vector<float> resume(mesh_shape shape, const std::filesystem::path& dir, std::uint64_t from, int steps,
                          const std::filesystem::path& save_to = {}) {
  std::vector<float> whole;
  threads::launch(shape.dp * shape.tp, [&](threads& c) {
    mesh<threads> m(c, shape);
    zero::engine<Stage, threads, zero::optim::adamw> e(m, model());
    if (dir.empty())
      e.initialize(zero::from_whole_tensors(whole_init()));
    else
      (void)zero::checkpoint::load(e, m.world(), dir);
    for (int t = 0; t < steps; ++t) mesh_step(e, m.coordinates().dp, from + static_cast<std::uint64_t>(t));
    if (!save_to.empty()) (void)zero::checkpoint::save(e, m.world(), save_to);
    auto p = e.full_model_params();
    if (c.rank() == 0) whole = std::move(p);
  });
  return whole;
}

}  // namespace

TEST_CASE("tensor parallel: a checkpoint saved by a 2 x 2 mesh loads at another tp, dp and stage, and exports whole") {
  const auto dir = std::filesystem::temp_directory_path() / "zero_tp_checkpoint";
  std::filesystem::remove_all(dir);
  const std::vector<float> saved = resume<zero::stage1>({2, 2}, {}, 0, 2, dir);
  const std::vector<float> uninterrupted = resume<zero::stage1>({2, 2}, {}, 0, 4);
  // The manifest holds the mesh and each split tensor's pieces.
  const zero::checkpoint::manifest info = zero::checkpoint::verify(dir);
  CHECK(info.world_size == 4);
  CHECK(info.tensor_parallel == 2);
  CHECK(info.units[1].tensors[0].parts == 2);  // block.w_in, split along dim 1
  CHECK(info.units[1].tensors[0].split_dim == 1);
  CHECK(info.units[1].tensors[3].parts == 1);  // block.b_out, replicated: saved once
  // Loaded at every shape, the same whole model; where dp is the same (2), training goes on as if
  // never interrupted, at tp = 2 or 1, in another stage (the optimizer's moments came back too).
  CHECK(resume<zero::stage3>({2, 2}, dir, 2, 0) == saved);
  CHECK(resume<zero::stage0>({2, 1}, dir, 2, 0) == saved);
  CHECK(resume<zero::stage2>({1, 2}, dir, 2, 0) == saved);
  CHECK(resume<zero::stage3>({4, 1}, dir, 2, 0) == saved);
  CHECK(resume<zero::stage3>({2, 2}, dir, 2, 2) == uninterrupted);
  CHECK(resume<zero::stage0>({2, 1}, dir, 2, 2) == uninterrupted);
  // zero_export's library call puts each split tensor together: the file's data is the whole model.
  const auto out = dir / "model.safetensors";
  (void)zero::checkpoint::export_safetensors(dir, out);
  const std::uintmax_t size = std::filesystem::file_size(out);
  REQUIRE(size >= saved.size() * sizeof(float));
  std::vector<float> data(saved.size());
  std::FILE* f = std::fopen(out.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::fseek(f, static_cast<long>(size - saved.size() * sizeof(float)), SEEK_SET);
  CHECK(std::fread(data.data(), sizeof(float), data.size(), f) == data.size());
  std::fclose(f);
  CHECK(data == saved);
  std::filesystem::remove(out);
  // A manifest whose pieces do not match its mesh, or do not tile a piece, is refused naming the member.
  {
    std::ifstream in(zero::checkpoint::resolve(dir) / zero::checkpoint::manifest_name);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto damaged = [&](const std::string& from, const std::string& to) {
      std::string t = text;
      const auto at = t.find(from);
      REQUIRE(at != std::string::npos);
      return t.replace(at, from.size(), to);
    };
    CHECK_THROWS_WITH_AS(
        (void)zero::checkpoint::parse_manifest(damaged("\"tp_parts\":2", "\"tp_parts\":3"), "m", false),
        doctest::Contains("tp_parts"), zero::error);
    CHECK_THROWS_WITH_AS((void)zero::checkpoint::parse_manifest(damaged("\"piece\":1", "\"piece\":0"), "m", false),
                         doctest::Contains("expected piece 1"), zero::error);
    CHECK_NOTHROW((void)zero::checkpoint::parse_manifest(text, "m"));
  }
  // A communicator that is not the mesh's world is refused naming what to pass.
  CHECK_THROWS_WITH_AS(threads::launch(4,
                                       [&](threads& c) {
                                         mesh<threads> m(c, {2, 2});
                                         zero::engine<zero::stage1, threads, zero::optim::adamw> e(m, model());
                                         (void)zero::checkpoint::load(e, m.dp(), dir);
                                       }),
                       doctest::Contains("in a tensor-parallel mesh, pass the mesh's world"), zero::error);
  zero::checkpoint::remove_checkpoint(dir);
}
