// libFuzzer target: the manifest parser (with and without its checksum gate) and the safetensors header
// parser on arbitrary bytes. Only zero::error may leave them; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/optimizer_settings.hpp"
#include "zero/checkpoint/safetensors.hpp"
#include "zero/checkpoint/versions.hpp"
#include "zero/optim/adamw.hpp"  // the checkpoint headers name no optimizer

namespace {

// The toy model of the tests, so that a fuzzed manifest can also reach the model comparison.
const zero::model_spec& toy_spec() {
  static const zero::model_spec s = [] {
    zero::model_spec m;
    m.unit("embed").tensor("w", {37, 11});
    m.unit("tiny").tensor("scale", {1});
    m.unit("block").tensor("w", {29, 13}).tensor("b", {29}).tensor("gain", {1});
    m.unit("head").tensor("w", {5, 29}).tensor("b", {5});
    return m;
  }();
  return s;
}

}  // namespace

// The first byte picks the parser: 0 manifest, 1 manifest without the checksum gate (so mutations
// reach the schema checks), 2 safetensors header; the rest is the input.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  namespace ckpt = zero::checkpoint;
  try {
    switch (data[0] % 3) {
      case 0:
      case 1: {
        const ckpt::manifest m = ckpt::parse_manifest(body, "fuzz", data[0] % 3 == 0);
        (void)ckpt::spec_of(m);
        ckpt::check_model(m, toy_spec(), "fuzz");
        (void)ckpt::optimizer_from<zero::optim::adamw>(m);
        (void)ckpt::serialize_manifest(m);
        break;
      }
      default: {
        const auto h = ckpt::safetensors::parse_header(body, body.size(), "fuzz");
        (void)h;
        break;
      }
    }
  } catch (const zero::error&) {
  }
  return 0;
}
