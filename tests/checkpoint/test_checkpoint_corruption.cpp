// Damaged checkpoints and safetensors files: every hand-made and randomized corruption ends in zero::error
// naming the file and the problem, never in a crash, a hang, or a silently wrong load.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <random>

#include "checkpoint_helpers.hpp"

using namespace ckpt_test;
using json = nlohmann::ordered_json;

namespace {


// The same manifest text with its own checksum recomputed: reaches the validation behind the checksum.
std::string with_checksum(std::string text) {
  if (const auto at = ckpt::locate_hex_member(text, ckpt::checksum_member))
    text.replace(*at, 16, ckpt::to_hex(ckpt::xxh64_with_zeroed(text, *at)));
  return text;
}

// One checkpoint (toy model, N = 2, stage 3) and its exported safetensors file, made once.
struct fixture {
  temp_dir root{"corrupt"};
  fs::path base;  // the version directory
  fs::path exported;
  std::vector<float> master;
  fixture() {
    const auto s = train<zero::stage3>(2, 3, root / "ckpt");
    master = s.master;
    base = ckpt::list_versions(root / "ckpt").at(0).path;
    exported = root / "model.safetensors";
    ckpt::export_safetensors(base, exported);
  }
  // A fresh copy of the version directory to damage.
  fs::path copy(const std::string& name) const {
    const fs::path d = root / name;
    fs::remove_all(d);
    fs::copy(base, d, fs::copy_options::recursive);
    return d;
  }
};
const fixture& fx() {
  static const fixture f;
  return f;
}

struct outcome {
  bool loaded = false;
  std::optional<zero::error_kind> kind;
  std::string message;
};

// Loads dir into a one-rank engine; any exception other than zero::error fails the test.
template <class Opt = adamw>
outcome try_load(const fs::path& dir, const zero::model_spec& spec = toy::spec()) {
  outcome o;
  try {
    zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage0, zero::comm::threads, Opt> e(comm, spec);
      ckpt::load(e, comm, dir);
    });
    o.loaded = true;
  } catch (const zero::error& e) {
    o.kind = e.kind();
    o.message = e.what();
  } catch (const std::exception& e) {
    FAIL("an exception other than zero::error: ", e.what());
  }
  return o;
}

// Damages a copy with `mutate(dir)` and expects a refusal of `kind` whose message contains every `parts`.
void expect_refused(const std::string& name, const std::function<void(const fs::path&)>& mutate, zero::error_kind kind,
                    std::initializer_list<const char*> parts) {
  CAPTURE(name);
  const fs::path d = fx().copy(name);
  mutate(d);
  const outcome o = try_load(d);
  REQUIRE_FALSE(o.loaded);
  CAPTURE(o.message);
  CHECK(o.kind == kind);
  for (const char* p : parts) CHECK(o.message.find(p) != std::string::npos);
}

// Edits the manifest as JSON and writes it back with a valid checksum.
std::function<void(const fs::path&)> edit(const std::function<void(json&)>& f) {
  return [f](const fs::path& d) {
    json j = json::parse(slurp(d / "manifest.json"));
    f(j);
    spit(d / "manifest.json", with_checksum(j.dump(1)));
  };
}
std::function<void(const fs::path&)> replace_manifest(const std::string& text) {
  return [text](const fs::path& d) { spit(d / "manifest.json", text); };
}

const std::string data0 = "rank-00000-of-00002.bin", data1 = "rank-00001-of-00002.bin";
using zero::error_kind;

}  // namespace

TEST_CASE("damaged data files are refused, naming the file") {
  expect_refused("missing-data", [](const fs::path& d) { fs::remove(d / data1); }, error_kind::io,
                 {data1.c_str(), "cannot open"});
  expect_refused("truncated-data", [](const fs::path& d) { fs::resize_file(d / data0, fs::file_size(d / data0) - 4); },
                 error_kind::corrupt, {data0.c_str(), "truncated"});
  expect_refused("extended-data", [](const fs::path& d) { std::ofstream(d / data1, std::ios::app) << "x"; },
                 error_kind::corrupt, {data1.c_str(), "extended"});
  expect_refused("flipped-data",
                 [](const fs::path& d) {
                   std::string s = slurp(d / data0);
                   s[s.size() / 2] = static_cast<char>(s[s.size() / 2] ^ 0x10);
                   spit(d / data0, s);
                 },
                 error_kind::corrupt, {data0.c_str(), "checksum mismatch"});
  expect_refused("swapped-data",
                 [](const fs::path& d) {
                   const std::string a = slurp(d / data0), b = slurp(d / data1);
                   spit(d / data0, b.substr(0, std::min(a.size(), b.size())) + a.substr(std::min(a.size(), b.size())));
                 },
                 error_kind::corrupt, {data0.c_str()});
  expect_refused("data-is-a-directory", [](const fs::path& d) { fs::remove(d / data1); fs::create_directory(d / data1); },
                 error_kind::io, {data1.c_str()});
}

TEST_CASE("damaged manifests are refused, naming the file and the problem") {
  expect_refused("no-manifest", [](const fs::path& d) { fs::remove(d / "manifest.json"); }, error_kind::io,
                 {"no committed checkpoint"});
  expect_refused("flipped-manifest",
                 [](const fs::path& d) {
                   std::string s = slurp(d / "manifest.json");
                   const auto at = s.find("\"step\":3");
                   REQUIRE(at != std::string::npos);
                   s[at + 7] = '4';  // still valid JSON, and plausible: only the checksum can tell
                   spit(d / "manifest.json", s);
                 },
                 error_kind::corrupt, {"manifest.json", "checksum mismatch"});
  expect_refused("empty-manifest", replace_manifest(""), error_kind::corrupt, {"manifest.json", "not valid JSON"});
  expect_refused("truncated-manifest",
                 [](const fs::path& d) { fs::resize_file(d / "manifest.json", fs::file_size(d / "manifest.json") / 2); },
                 error_kind::corrupt, {"manifest.json", "not valid JSON"});
  expect_refused("binary-manifest", replace_manifest(std::string("\x00\xff\xfe{\x01", 5)), error_kind::corrupt,
                 {"not valid JSON"});
  expect_refused("array-manifest", replace_manifest("[1, 2, 3]"), error_kind::corrupt, {"top level"});
  expect_refused("nested-manifest", replace_manifest(std::string(100000, '[') + std::string(100000, ']')),
                 error_kind::corrupt, {"manifest.json"});
  expect_refused("not-zero", edit([](json& j) { j["format"] = "safetensors"; }), error_kind::corrupt,
                 {"not a zero checkpoint"});
  expect_refused("newer-version", edit([](json& j) { j["format_version"] = 2; }), error_kind::corrupt,
                 {"manifest.json", "format version 2", "newer"});
  expect_refused("version-zero", edit([](json& j) { j["format_version"] = 0; }), error_kind::corrupt, {"version 0"});
  expect_refused("version-string", edit([](json& j) { j["format_version"] = "1"; }), error_kind::corrupt,
                 {"format_version", "non-negative integer"});
  expect_refused("no-checksum", edit([](json& j) { j.erase("manifest_xxh64"); }), error_kind::corrupt,
                 {"manifest_xxh64"});
  expect_refused("bad-checksum-digits", replace_manifest(std::string(R"({"format":"zero.checkpoint","format_version":1,"manifest_xxh64":"XYZ"})")),
                 error_kind::corrupt, {"manifest_xxh64"});
}

TEST_CASE("a manifest of another model or optimizer is refused") {
  auto tensor = [](json& j, std::size_t u, std::size_t t) -> json& { return j["model"]["units"][u]["tensors"][t]; };
  expect_refused("unit-name", edit([](json& j) { j["model"]["units"][0]["name"] = "embedding"; }), error_kind::corrupt,
                 {"another model", "'embedding'", "'embed'"});
  expect_refused("tensor-name", edit([&](json& j) { tensor(j, 2, 1)["name"] = "bias"; }), error_kind::corrupt,
                 {"another model", "'bias'"});
  expect_refused("shape", edit([&](json& j) { tensor(j, 2, 0)["shape"] = json::array({13, 29}); }), error_kind::corrupt,
                 {"another model", "block.w", "[13, 29]", "[29, 13]"});
  // A unit dropped from the manifest leaves its bytes in the data files unused: refused as such.
  expect_refused("units", edit([](json& j) { j["model"]["units"].erase(3); }), error_kind::corrupt,
                 {"rank-00000-of-00002.bin", "belong to no segment"});
  expect_refused("dtype", edit([&](json& j) { tensor(j, 0, 0)["dtype"] = "BF16"; }), error_kind::corrupt,
                 {"embed.w", "BF16"});
  // The engine's model differs from the checkpoint's.
  zero::model_spec other;
  other.unit("embed").tensor("w", {37, 11});
  const outcome o = try_load(fx().base, other);
  CHECK(o.kind == error_kind::corrupt);
  CHECK(o.message.find("another model") != std::string::npos);
  CHECK(o.message.find("it has 4 units, the engine's model has 1") != std::string::npos);
  // Another optimizer.
  const outcome s = try_load<zero::optim::sgd>(fx().base);
  CHECK(s.kind == error_kind::corrupt);
  CHECK(s.message.find("optimizer 'adamw'") != std::string::npos);
}

TEST_CASE("malformed manifests with a valid checksum are refused by the schema checks") {
  auto seg = [](json& j) -> json& { return j["model"]["units"][0]["tensors"][0]["segments"]; };
  const std::pair<const char*, std::function<void(json&)>> cases[] = {
      {"missing member 'files'", [](json& j) { j.erase("files"); }},
      {"expected an array", [](json& j) { j["files"] = json::object(); }},
      {"not a plain file name", [](json& j) { j["files"][0]["name"] = "../../etc/passwd"; }},
      {"not a plain file name", [](json& j) { j["files"][0]["name"] = "/abs"; }},
      {"listed twice", [](json& j) { j["files"][1]["name"] = j["files"][0]["name"]; }},
      {"non-negative integer", [](json& j) { j["files"][0]["bytes"] = -4; }},
      {"non-negative integer", [](json& j) { j["files"][0]["bytes"] = "12"; }},
      {"non-negative integer", [](json& j) { j["files"][0]["bytes"] = 1.5; }},
      {"hex digits", [](json& j) { j["files"][0]["xxh64"] = "ABCDEF0123456789"; }},
      {"expected begin", [&](json& j) { seg(j)[1]["begin"] = 100; }},
      {"expected begin", [&](json& j) { seg(j).erase(0); }},
      {"cover", [&](json& j) { seg(j).erase(seg(j).size() - 1); }},
      {"end out of range", [&](json& j) { seg(j)[0]["end"] = 0; }},
      {"file index", [&](json& j) { seg(j)[0]["file"] = 9; }},
      {"beyond the end", [&](json& j) { seg(j)[0]["offsets"][1] = 1u << 30; }},
      {"beyond the end", [&](json& j) { seg(j)[0]["offsets"][2] = 18446744073709551615ull; }},
      {"one offset per slot", [&](json& j) { seg(j)[0]["offsets"].erase(2); }},
      {"empty or repeated unit name", [](json& j) { j["model"]["units"][1]["name"] = "embed"; }},
      {"empty or repeated tensor name", [](json& j) { j["model"]["units"][2]["tensors"][1]["name"] = "w"; }},
      {"no tensors", [](json& j) { j["model"]["units"][1]["tensors"] = json::array(); }},
      {"zero or oversized dimension", [](json& j) { j["model"]["units"][1]["tensors"][0]["shape"] = {0}; }},
      {"zero or oversized dimension",
       [](json& j) {
         j["model"]["units"][1]["tensors"][0]["shape"] = {1ull << 40, 1ull << 40};
       }},
      {"dimensions", [](json& j) { j["model"]["units"][1]["tensors"][0]["shape"] = json::array(); }},
      {"first slot must be", [](json& j) { j["slots"][0] = "weights"; }},
      {"slot names repeat", [](json& j) { j["slots"][2] = "m"; }},
      {"one offset per slot", [](json& j) { j["slots"].push_back("extra"); }},
      {"missing member 'training_state'", [](json& j) { j.erase("training_state"); }},
      {"positive finite", [](json& j) { j["training_state"]["loss_scale"] = -1.0; }},
      {"expected a number", [](json& j) { j["training_state"]["loss_scale"] = nullptr; }},
      {"non-negative integer", [](json& j) { j["training_state"]["step"] = -3; }},
      // Counters beyond what a run can reach (2^53): refused naming the field, never resumed with a NaN
      // loss (step) or a wrapped data position (step + skipped_steps).
      {"training_state.step: 18446744073709551615 is more than a run can reach",
       [](json& j) { j["training_state"]["step"] = 18446744073709551615ull; }},
      {"training_state.skipped_steps: 18446744073709551615 is more than",
       [](json& j) { j["training_state"]["skipped_steps"] = 18446744073709551615ull; }},
      {"training_state.clean_steps: 9007199254740993 is more than",
       [](json& j) { j["training_state"]["clean_steps"] = (1ull << 53) + 1; }},
      {"training_state.skipped_steps: step + skipped_steps = 9007199254740995",
       [](json& j) { j["training_state"]["skipped_steps"] = 1ull << 53; }},
      {"world_size", [](json& j) { j["saved_by"]["world_size"] = 0; }},
      {"expected a JSON object", [](json& j) { j["optimizer"]["hyper_parameters"] = 3; }},
      // Parameter groups (optional): each value a finite float >= 0, each name 1 to 256 bytes.
      {"expected an array", [](json& j) { j["optimizer"]["param_groups"] = json::object(); }},
      {"param_groups[0].lr_scale: expected a finite float >= 0",
       [](json& j) { j["optimizer"]["param_groups"] = json::parse(R"([{"name": "a", "lr_scale": -1}])"); }},
      {"param_groups[1].weight_decay: expected a finite float >= 0",
       [](json& j) {
         j["optimizer"]["param_groups"] =
             json::parse(R"([{"name": "a", "lr_scale": 1}, {"name": "b", "lr_scale": 1, "weight_decay": 1e300}])");
       }},
      {"param_groups[0].name: expected 1 to 256 bytes",
       [](json& j) { j["optimizer"]["param_groups"] = json::parse(R"([{"name": "", "lr_scale": 1}])"); }},
      {"missing member 'lr_scale'",
       [](json& j) { j["optimizer"]["param_groups"] = json::parse(R"([{"name": "a"}])"); }},
      {"more than 64 groups",
       [](json& j) {
         j["optimizer"]["param_groups"] = json::array();
         for (int k = 0; k < 65; ++k) j["optimizer"]["param_groups"].push_back(json{{"name", "g"}, {"lr_scale", 1}});
       }},
      {"expected a string", [](json& j) { j["precision"] = 32; }},
      {"no units", [](json& j) { j["model"]["units"] = json::array(); }},
  };
  int i = 0;
  for (const auto& [expect, change] : cases) expect_refused("schema-" + std::to_string(i++), edit(change), error_kind::corrupt, {"manifest.json", expect});
  // Numbers beyond any integer or double.
  for (const char* number : {"1e999", "-1e999", "123456789012345678901234567890"})
    expect_refused(std::string("number-") + number,
                   [number](const fs::path& d) {
                     std::string s = slurp(d / "manifest.json");
                     const auto at = s.find("\"step\":3");
                     s.replace(at, 8, std::string("\"step\":") + number);
                     spit(d / "manifest.json", with_checksum(s));
                   },
                   error_kind::corrupt, {"manifest.json"});
  // Hyper-parameters of the wrong type surface when they are read back.
  json j = json::parse(slurp(fx().base / "manifest.json"));
  j["optimizer"]["hyper_parameters"]["lr"] = "fast";
  const auto m = ckpt::parse_manifest(with_checksum(j.dump()), "edited");
  CHECK_THROWS_WITH_AS(ckpt::optimizer_from<adamw>(m), doctest::Contains("hyper_parameters.lr"), zero::error);
}

TEST_CASE("randomized corruption of every file only ever gives zero::error") {
  const unsigned seed = std::getenv("ZERO_FUZZ_SEED") ? static_cast<unsigned>(std::atoi(std::getenv("ZERO_FUZZ_SEED"))) : 20240611u;
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % (n ? n : 1)); };
  const std::string tokens[] = {"{", "}", "[", "]", "\"", ",", ":", "-1", "1e999", "null", "true", "\\u0000", "0.5", "\xff"};
  const std::vector<std::string> names = {"manifest.json", data0, data1};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  int runs = 0;
  for (; runs < 300 && std::chrono::steady_clock::now() < deadline; ++runs) {
    const fs::path d = fx().copy("random");
    const std::string name = names[pick(names.size())];
    std::string s = slurp(d / name);
    const int mutation = static_cast<int>(pick(5));
    CAPTURE(runs);
    CAPTURE(name);
    CAPTURE(mutation);
    switch (mutation) {
      case 0:  // flip 1 to 4 bytes
        for (std::size_t k = 0, n = 1 + pick(4); k < n; ++k) s[pick(s.size())] ^= static_cast<char>(1 + pick(255));
        break;
      case 1:  // truncate
        s.resize(pick(s.size()));
        break;
      case 2: {  // insert random bytes
        std::string g(1 + pick(16), '\0');
        for (auto& c : g) c = static_cast<char>(rng());
        s.insert(pick(s.size() + 1), g);
        break;
      }
      case 3:  // delete a range
        s.erase(pick(s.size()), 1 + pick(32));
        break;
      default:  // JSON-looking garbage
        s.insert(pick(s.size() + 1), tokens[pick(std::size(tokens))]);
        break;
    }
    spit(d / name, s);
    const outcome o = try_load(d);
    CHECK_FALSE(o.loaded);  // checksums cover every byte, so no damage goes unnoticed
  }
  MESSAGE(runs, " randomized corruptions refused");
}

TEST_CASE("randomized structural edits of the manifest (checksum kept valid) give zero::error or a clean load") {
  std::mt19937_64 rng(424242);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % (n ? n : 1)); };
  const json base = json::parse(slurp(fx().base / "manifest.json"));
  const json replacements[] = {nullptr, -1, 0, 1, 7, 4294967296ull, 18446744073709551615ull, 1.5, -0.0, "", "x",
                               "../x", json::array(), json::object(), json::array({1, 2}), true};
  std::vector<json::json_pointer> pointers;
  std::function<void(const json&, const json::json_pointer&)> collect = [&](const json& v, const json::json_pointer& p) {
    pointers.push_back(p);
    if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it) collect(*it, p / it.key());
    else if (v.is_array())
      for (std::size_t i = 0; i < v.size(); ++i) collect(v[i], p / i);
  };
  collect(base, json::json_pointer());
  int loaded = 0, refused = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  for (int run = 0; run < 300 && std::chrono::steady_clock::now() < deadline; ++run) {
    json j = base;
    for (std::size_t k = 0, n = 1 + pick(2); k < n; ++k) {
      const auto& p = pointers[pick(pointers.size())];
      if (!j.contains(p)) continue;
      if (p.empty() || pick(4) != 0) j[p] = replacements[pick(std::size(replacements))];
      else if (j[p.parent_pointer()].is_object()) j[p.parent_pointer()].erase(p.back());
      else j[p] = j[p];  // arrays: keep (an erase would renumber the collected pointers)
    }
    const fs::path d = fx().copy("structural");
    spit(d / "manifest.json", with_checksum(j.dump()));
    const outcome o = try_load(d);
    (o.loaded ? loaded : refused)++;
  }
  MESSAGE(refused, " structural edits refused, ", loaded, " harmless ones loaded");
  CHECK(refused > 0);
}

TEST_CASE("damaged safetensors headers are refused; any file that parses still has the exported values") {
  const std::string original = slurp(fx().exported);
  auto parse = [](const std::string& bytes) { return ckpt::safetensors::parse_header(bytes, bytes.size(), "test"); };
  CHECK_NOTHROW(parse(original));
  std::uint64_t n = 0;
  std::memcpy(&n, original.data(), 8);
  auto with_header = [&](const std::string& h) {
    std::string s(8, '\0');
    const std::uint64_t len = h.size();
    std::memcpy(s.data(), &len, 8);
    return s + h + original.substr(8 + n);
  };
  const std::pair<const char*, std::string> cases[] = {
      {"shorter than", "abc"},
      {"exceeds the limit", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}"},
      {"does not fit", std::string("\x00\x10\x00\x00\x00\x00\x00\x00", 8) + "{}"},
      {"does not start with", with_header("  {}")},
      {"not valid JSON", with_header("{\"a\":")},
      {"exactly the members", with_header(R"({"a":{"dtype":"F32","shape":[1]}})")},
      {"unknown dtype", with_header(R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})")},
      {"do not match", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})")},
      {"non-negative integer", with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})")},
      {"pair of non-negative", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})")},
      {"not a string", with_header(R"({"__metadata__":{"a":1}})")},
      {"starts at byte", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})")},
      {"cover", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})")},
      {"too large", with_header(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})")},
  };
  for (const auto& c : cases) {
    CAPTURE(c.first);
    CHECK_THROWS_WITH_AS(parse(c.second), doctest::Contains(c.first), zero::error);
  }

  // Random damage, mostly in the header: refused, or (a harmless change such as a name) the same values.
  std::mt19937_64 rng(777);
  auto pick = [&](std::size_t k) { return static_cast<std::size_t>(rng() % (k ? k : 1)); };
  const fs::path f = fx().root / "damaged.safetensors";
  int refused = 0, parsed = 0;
  for (int run = 0; run < 400; ++run) {
    std::string s = original;
    const std::size_t span = pick(4) == 0 ? s.size() : static_cast<std::size_t>(8 + n);
    switch (pick(4)) {
      case 0: s[pick(span)] ^= static_cast<char>(1 + pick(255)); break;
      case 1: s.resize(pick(s.size())); break;
      case 2: s.insert(pick(span), std::string(1 + pick(8), static_cast<char>("{}[]\",:0a "[pick(11)]))); break;
      default: s.erase(pick(span), 1 + pick(8)); break;
    }
    spit(f, s);
    try {
      const auto h = ckpt::safetensors::read_header(f);
      ckpt::safetensors::verify_data(f, h);
      std::vector<float> all;
      for (const auto& t : h.tensors) {
        if (t.dtype != "F32") throw zero::error(zero::error_kind::corrupt, "dtype changed");
        const auto v = ckpt::safetensors::read_f32(f, h, t);
        all.insert(all.end(), v.begin(), v.end());
      }
      CHECK(bit_equal(all, fx().master));
      ++parsed;
    } catch (const zero::error&) {
      ++refused;
    }
  }
  MESSAGE(refused, " damaged safetensors files refused, ", parsed, " parsed with unchanged values");
}

namespace {

// Damages a copy with `mutate`, then expects loading, verifying and exporting it each to end in a
// zero::error (kind corrupt) whose message contains `expect`, with no output file left behind.
void expect_refused_everywhere(const std::string& name, const std::function<void(const fs::path&)>& mutate,
                               const std::string& expect) {
  CAPTURE(name);
  const fs::path d = fx().copy(name);
  mutate(d);
  const outcome o = try_load(d);
  REQUIRE_FALSE(o.loaded);
  CAPTURE(o.message);
  CHECK(o.kind == error_kind::corrupt);
  CHECK(o.message.find(expect) != std::string::npos);
  CHECK_THROWS_WITH_AS(ckpt::verify(d), doctest::Contains(expect.c_str()), zero::error);
  const fs::path out = fx().root / (name + ".safetensors");
  CHECK_THROWS_WITH_AS(ckpt::export_safetensors(d, out), doctest::Contains(expect.c_str()), zero::error);
  CHECK_FALSE(fs::exists(out));
}

// The manifest text with `value` in place of the value that follows `member` (up to the next ',' or '}').
std::function<void(const fs::path&)> replace_value(const std::string& member, const std::string& value) {
  return [member, value](const fs::path& d) {
    std::string s = slurp(d / "manifest.json");
    const auto at = s.find(member);
    REQUIRE(at != std::string::npos);
    const auto from = at + member.size(), to = s.find_first_of(",}", from);
    s.replace(from, to - from, value);
    spit(d / "manifest.json", with_checksum(s));
  };
}

}  // namespace

TEST_CASE("deeply nested JSON is refused wherever it sits, before anything walks it") {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  // In front of the checksum check, as the issue found it; then behind a valid checksum.
  expect_refused_everywhere("deep-format", replace_manifest("{\"format\": " + deep + ", \"x\": 1}"),
                            "nested deeper than 32 levels");
  expect_refused_everywhere("deep-step", replace_value("\"step\":", deep), "nested deeper than 32 levels");
  expect_refused_everywhere("deep-hyper", replace_value("\"hyper_parameters\":{", "\"x\":" + deep),
                            "nested deeper than 32 levels");
  // The safetensors header goes through the same parser.
  const std::string original = slurp(fx().exported);
  std::uint64_t n = 0;
  std::memcpy(&n, original.data(), 8);
  std::string h = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string bytes(8, '\0');
  const std::uint64_t len = h.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += h;
  CHECK_THROWS_WITH_AS(ckpt::safetensors::parse_header(bytes, bytes.size(), "deep"),
                       doctest::Contains("nested deeper than 32 levels"), zero::error);
}

TEST_CASE("repeated JSON members are refused, not silently resolved to one of them") {
  expect_refused_everywhere("duplicate-step", replace_value("\"step\":", "3,\"step\":4"), "\"step\" appears twice");
  const std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string bytes(8, '\0');
  const std::uint64_t len = h.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += h + std::string(4, '\0');
  CHECK_THROWS_WITH_AS(ckpt::safetensors::parse_header(bytes, bytes.size(), "dup"), doctest::Contains("appears twice"),
                       zero::error);
}

TEST_CASE("segments may not share bytes or leave bytes unused: output stays bounded by the data") {
  auto seg = [](json& j, std::size_t u, std::size_t t) -> json& { return j["model"]["units"][u]["tensors"][t]["segments"]; };
  // tiny.scale's master slot moved onto embed.w's first values: both would read the same bytes.
  expect_refused_everywhere("overlap", edit([&](json& j) { seg(j, 1, 0)[0]["offsets"][0] = 0; }), "must not share bytes");
  expect_refused_everywhere("gap", edit([](json& j) { j["files"][0]["bytes"] = j["files"][0]["bytes"].get<std::uint64_t>() + 4; }),
                            "belong to no segment");
  // The amplification: one tensor of 1024 segments that all read the same bytes of a 4 KB file,
  // which an export would write out as a tensor 1024 times larger than the data.
  expect_refused_everywhere("amplified", edit([&](json& j) {
                              const std::uint64_t len = j["files"][0]["bytes"].get<std::uint64_t>() / 4;
                              json& t = j["model"]["units"][1]["tensors"][0];
                              t["shape"] = json::array({1024 * len});
                              json segs = json::array();
                              for (std::uint64_t k = 0; k < 1024; ++k)
                                segs.push_back({{"begin", k * len}, {"end", (k + 1) * len}, {"file", 0}, {"offsets", {0, 0, 0}}});
                              t["segments"] = segs;
                            }),
                            "must not share bytes");
}

TEST_CASE("an unterminated 8 MB string gives a short error message") {
  const outcome o = [] {
    const fs::path d = fx().copy("unterminated");
    spit(d / "manifest.json", "{\"format\": \"" + std::string(8 << 20, 'a'));
    return try_load(d);
  }();
  REQUIRE_FALSE(o.loaded);
  CHECK(o.message.find("not valid JSON") != std::string::npos);
  CHECK(o.message.size() < 1000);
}

TEST_CASE("names from a checkpoint are escaped in messages: no terminal control sequence gets through") {
  temp_dir d("escape");
  zero::model_spec spec;
  spec.unit("emb\x1b[2J\x1b]0;title\x07").tensor("w\xc2\x9b", {3});  // ESC sequences, BEL, a C1 control
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage0, zero::comm::threads, adamw> e(comm, spec);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (auto& x : v) x = 1.0f;
    });
    ckpt::save(e, comm, d.path);
  });
  zero::model_spec other;
  other.unit("embed").tensor("w", {3});
  const outcome o = try_load(d.path, other);  // "another model", naming the unit
  REQUIRE_FALSE(o.loaded);
  CAPTURE(o.message);
  CHECK(o.message.find("another model") != std::string::npos);
  CHECK(o.message.find("emb\\x1B[2J\\x1B]0;title\\x07") != std::string::npos);
  for (char c : o.message) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f));
  // The same in the safetensors reader.
  const std::string h = "{\"a\\u001b[31m\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  std::string bytes(8, '\0');
  const std::uint64_t len = h.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += h + std::string(4, '\0');
  try {
    (void)ckpt::safetensors::parse_header(bytes, bytes.size(), "escape");
    FAIL("an unknown dtype was accepted");
  } catch (const zero::error& e) {
    const std::string m = e.what();
    CHECK(m.find("a\\x1B[31m") != std::string::npos);
    CHECK(m.find('\x1b') == std::string::npos);
  }
}

TEST_CASE("export never writes a header larger than its own reader accepts") {
  temp_dir d("big-header");
  zero::model_spec spec;
  auto unit = spec.unit(std::string(1 << 20, 'u'));  // 1 MiB, repeated in each of 101 exported names
  for (int t = 0; t <= 100; ++t) {
    std::string name = "t";
    name += std::to_string(t);
    unit.tensor(name, {1});
  }
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage0, zero::comm::threads, adamw> e(comm, spec);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (auto& x : v) x = 1.0f;
    });
    ckpt::save(e, comm, d / "ckpt");
  });
  CHECK_THROWS_WITH_AS(ckpt::export_safetensors(d / "ckpt", d / "out.safetensors"),
                       doctest::Contains("a reader accepts"), zero::error);
  CHECK_FALSE(fs::exists(d / "out.safetensors"));
}
