// What saves, loads and exports never do to the file system: follow or delete through a symbolic link, wait
// on a FIFO, write through a planted temporary name, leave a failed save behind, number a version past
// what readers accept, or fall back to an older version when the newest cannot be read.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <thread>

#include "checkpoint_helpers.hpp"

using namespace ckpt_test;

namespace {


// Runs `f` in a child process and returns its exit status (128 + signal if it was killed by one). A
// child still running after `limit` is killed and fails the test: a regression that hangs becomes a
// failure within seconds instead of a stuck CI job.
int run_bounded(const std::function<int()>& f, std::chrono::seconds limit) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 99;
    try {
      rc = f();
    } catch (...) {
      rc = 98;
    }
    ::_exit(rc);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("the child did not finish within ", limit.count(), " s (it was waiting, not failing)");
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Loads dir at 2 ranks; the message of the zero::error it ends with, or "" if it loaded.
std::string load_error(const fs::path& dir) {
  try {
    (void)load_state<zero::stage3>(2, dir);
  } catch (const zero::error& e) {
    return e.what();
  }
  return "";
}

// Exit status of a child that expects `action` to throw a zero::error containing `expect`: 0 when it
// did, 1 when it succeeded, 2 when the message is another one.
int expect_error_in_child(const std::function<void()>& action, const std::string& expect) {
  try {
    action();
  } catch (const zero::error& e) {
    return std::string(e.what()).find(expect) != std::string::npos ? 0 : 2;
  }
  return 1;
}

}  // namespace

TEST_CASE("an old version that is a symbolic link is neither followed nor removed by a save") {
  temp_dir d("files");
  // A checkpoint kept elsewhere, linked into the directory a job saves into as its "v-00000001".
  const fs::path kept = d / "kept";
  (void)train<zero::stage3>(2, 1, kept);
  const fs::path kept_version = ckpt::list_versions(kept).at(0).path;
  const fs::path dir = d / "ckpt";
  fs::create_directories(dir);
  fs::create_directory_symlink(kept_version, dir / ckpt::version_name(1));
  // An old incomplete version whose files are links to files outside: removed as links, targets kept.
  fs::create_directory(dir / ckpt::version_name(2));
  spit(d / "precious.bin", "do not delete");
  fs::create_symlink(d / "precious.bin", dir / ckpt::version_name(2) / "rank-00000-of-00002.bin");

  const auto saved = train<zero::stage3>(2, 2, dir);  // a new version, then the clean-up of older ones
  CHECK(fs::exists(kept_version / "manifest.json"));
  CHECK(bit_equal(load_state<zero::stage0>(1, kept), load_state<zero::stage0>(1, kept_version)));
  CHECK(fs::is_symlink(dir / ckpt::version_name(1)));  // not ours: left in place
  CHECK(slurp(d / "precious.bin") == "do not delete");
  CHECK_FALSE(fs::exists(fs::symlink_status(dir / ckpt::version_name(2))));  // ours: removed
  CHECK(bit_equal(load_state<zero::stage0>(1, dir), saved));
  CHECK(ckpt::list_versions(dir).back().number == 3);  // numbered past the link, not into it
}

TEST_CASE("a FIFO where a manifest or data file should be is refused at once, not waited on") {
  temp_dir d("files");
  (void)train<zero::stage3>(2, 1, d / "ckpt");
  const fs::path v = ckpt::list_versions(d / "ckpt").at(0).path;
  for (const std::string name : {"rank-00001-of-00002.bin", "manifest.json"}) {
    CAPTURE(name);
    const fs::path copy = d / ("fifo-" + name);
    fs::copy(v, copy, fs::copy_options::recursive);
    fs::remove(copy / name);
    REQUIRE(::mkfifo((copy / name).c_str(), 0644) == 0);
    // Loading at 2 thread-ranks, verifying and exporting: each must end with an error naming the FIFO.
    CHECK(run_bounded([&] { return expect_error_in_child([&] { (void)load_state<zero::stage3>(2, copy); }, "a FIFO"); },
                      std::chrono::seconds(20)) == 0);
    CHECK(run_bounded([&] { return expect_error_in_child([&] { (void)ckpt::verify(copy); }, "a FIFO"); },
                      std::chrono::seconds(20)) == 0);
    CHECK(run_bounded([&] {
            return expect_error_in_child([&] { (void)ckpt::export_safetensors(copy, d / "out.safetensors"); }, "a FIFO");
          },
                      std::chrono::seconds(20)) == 0);
  }
}

TEST_CASE("a symbolic link planted at the predictable temporary name is never written through") {
  temp_dir d("files");
  const auto saved = train<zero::stage3>(2, 1, d / "ckpt");
  spit(d / "victim", "unchanged");
  const fs::path out = d / "model.safetensors";
  for (const char* planted : {"model.safetensors.tmp", "model.safetensors.tmp-0000000000000000"})
    fs::create_symlink(d / "victim", d / planted);
  const auto r = ckpt::export_safetensors(d / "ckpt", out);
  CHECK(slurp(d / "victim") == "unchanged");
  CHECK(fs::is_symlink(d / "model.safetensors.tmp"));
  CHECK(r.bytes == fs::file_size(out));
  CHECK(ckpt::safetensors::verify_data(out, ckpt::safetensors::read_header(out)));

  // Temporary names are unpredictable and created exclusively; a writer that gives up removes its own.
  std::string first, second;
  {
    ckpt::durable_writer a(d / "x"), b(d / "x");
    first = a.temporary_path().string();
    second = b.temporary_path().string();
    CHECK(fs::exists(first));
  }
  CHECK(first != second);
  CHECK(first.find("x.tmp-") != std::string::npos);
  CHECK_FALSE(fs::exists(first));
  CHECK_FALSE(fs::exists(d / "x"));
  // Refusing to replace is atomic: commit() fails on an existing file and leaves it alone.
  spit(d / "y", "first");
  {
    ckpt::durable_writer w(d / "y", ckpt::existing_file::refuse);
    w.write("second", 6);
    CHECK_THROWS_WITH_AS(w.commit(), doctest::Contains("exists"), zero::error);
  }
  CHECK(slurp(d / "y") == "first");
  (void)saved;
}

TEST_CASE("the newest version that exists but cannot be read is reported, never passed over for an older one") {
  temp_dir d("files");
  const fs::path dir = d / "ckpt";
  ckpt::save_options keep_all;
  keep_all.keep = 10;
  // Two committed versions: step 1 and step 2.
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    for (int t = 0; t < 2; ++t) {
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
      ckpt::save(e, comm, dir, keep_all);
    }
  });
  const fs::path v2 = dir / ckpt::version_name(2);
  REQUIRE(load_state<zero::stage0>(1, dir).state.step == 2);

  SUBCASE("a version directory that cannot be searched (permissions)") {
    REQUIRE(::chmod(v2.c_str(), 0) == 0);
    // As root, permissions do not apply: the child drops to an unprivileged user first.
    const int rc = run_bounded(
        [&] {
          if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 77;
          return expect_error_in_child([&] { (void)load_state<zero::stage0>(1, dir); }, "not falling back");
        },
        std::chrono::seconds(20));
    ::chmod(v2.c_str(), 0755);
    if (rc == 77) MESSAGE("skipped: cannot drop privileges to test permissions");
    else CHECK(rc == 0);
  }
  SUBCASE("a manifest.json that is a directory") {
    fs::remove(v2 / "manifest.json");
    fs::create_directory(v2 / "manifest.json");
    CHECK(load_error(dir).find("not a regular file") != std::string::npos);
  }
  SUBCASE("a manifest.json that is a symbolic link") {
    fs::rename(v2 / "manifest.json", d / "elsewhere.json");
    fs::create_symlink(d / "elsewhere.json", v2 / "manifest.json");
    CHECK(load_error(dir).find("symbolic link") != std::string::npos);
  }
  SUBCASE("a newest version that is a symbolic link") {
    fs::rename(v2, d / "moved");
    fs::create_directory_symlink(d / "moved", dir / ckpt::version_name(3));
    CHECK(load_error(dir).find("not falling back") != std::string::npos);
  }
  SUBCASE("a newest version whose number is wider than readers accept") {
    fs::rename(v2, dir / "v-1000000000000000000");
    CHECK(load_error(dir).find("wider than the 18 digits") != std::string::npos);
  }
  // An interrupted save (a version without a manifest) is still passed over, as it must be.
  SUBCASE("an incomplete newest version") {
    fs::create_directory(dir / ckpt::version_name(3));
    CHECK(load_state<zero::stage0>(1, dir).state.step == 2);
  }
}

TEST_CASE("a failed save removes its whole version, the other ranks' completed files included") {
  temp_dir d("files");
  const auto before = train<zero::stage3>(3, 2, d.path);
  auto fail_at = [&](ckpt::save_phase when, int who) {
    int threw = 0;
    zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
      ckpt::load(e, comm, d.path);
      toy::train_step(e, comm.rank(), e.steps());
      ckpt::save_options o;
      o.on_phase = [&](ckpt::save_phase p, int rank) {
        if (p == when && rank == who) throw zero::error(zero::error_kind::io, "No space left on device (simulated)");
      };
      try {
        ckpt::save(e, comm, d.path, o);
      } catch (const zero::error&) {
        if (comm.rank() == 0) threw = 1;
      }
    });
    return threw;
  };
  // After rank 1 failed, ranks 0 and 2 had completed and renamed their files: they go too.
  CHECK(fail_at(ckpt::save_phase::data_written, 1) == 1);
  auto versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 1);
  CHECK(versions[0].number == 1);
  // A failure after the manifest is in place but before any older version is touched.
  CHECK(fail_at(ckpt::save_phase::committed, 0) == 1);
  versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 1);
  CHECK(versions[0].number == 1);
  CHECK(bit_equal(load_state<zero::stage3>(2, d.path), before));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d.path)) ++entries;
  CHECK(entries == 1);
}

TEST_CASE("version numbers stop at the width readers accept") {
  temp_dir d("files");
  const auto saved = train<zero::stage3>(2, 1, d.path);
  fs::rename(ckpt::list_versions(d.path).at(0).path, d / "v-999999999999999999");
  CHECK(bit_equal(load_state<zero::stage0>(1, d.path), saved));
  CHECK_THROWS_WITH_AS(train<zero::stage3>(2, 2, d.path), doctest::Contains("18 digits"), zero::error);
  // Nothing was committed beside it, and it is still what loads.
  CHECK(ckpt::list_versions(d.path).size() == 1);
  CHECK(bit_equal(load_state<zero::stage0>(1, d.path), saved));
}

TEST_CASE("a temporary checkpoint directory is created afresh and removed without touching anything else") {
  temp_dir d("files");
  const fs::path tmp = d / "scratch";
  fs::create_directory(tmp);
  spit(tmp / "someone-elses", "keep");
  ckpt::save_options fresh;
  fresh.new_directory = true;
  // An existing directory is refused, not used.
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    CHECK_THROWS_WITH_AS(ckpt::save(e, comm, tmp, fresh), doctest::Contains("exists"), zero::error);
    ckpt::save(e, comm, d / "new", fresh);
  });
  CHECK(slurp(tmp / "someone-elses") == "keep");
  fs::create_directory_symlink(tmp, d / "new" / ckpt::version_name(7));
  CHECK_FALSE(ckpt::remove_checkpoint(d / "new"));  // the link is not its own: it stays, so does the directory
  CHECK(fs::is_symlink(d / "new" / ckpt::version_name(7)));
  CHECK(slurp(tmp / "someone-elses") == "keep");
  fs::remove(d / "new" / ckpt::version_name(7));
  CHECK(ckpt::remove_checkpoint(d / "new"));
  CHECK_FALSE(fs::exists(d / "new"));
}

TEST_CASE("thread-ranks that load one checkpoint together parse its manifest once") {
  temp_dir d("files");
  (void)train<zero::stage3>(2, 1, d.path);
  auto& registry = ckpt::detail::manifest_registry::instance();
  const std::size_t before = registry.parses();
  (void)load_state<zero::stage1>(4, d.path);
  CHECK(registry.parses() == before + 1);
  // A damaged manifest is parsed once too; every rank reports its error.
  const fs::path m = ckpt::list_versions(d.path).at(0).path / "manifest.json";
  spit(m, "{\"format\": [1, 2");
  const std::size_t damaged = registry.parses();
  CHECK_THROWS_WITH_AS(load_state<zero::stage1>(4, d.path), doctest::Contains("not valid JSON"), zero::error);
  CHECK(registry.parses() == damaged + 1);
}

TEST_CASE("verify compares every size before hashing: a listed file of 1 TiB is refused in seconds") {
  temp_dir d("files");
  (void)train<zero::stage3>(2, 1, d.path);
  const fs::path v = ckpt::list_versions(d.path).at(0).path;
  // A sparse file of 1 TiB that the manifest lists with its true size, but that no segment uses:
  // hashing it would take hours.
  {
    std::ofstream(v / "extra.bin").put('x');
  }
  fs::resize_file(v / "extra.bin", std::uintmax_t{1} << 40);
  std::string text = slurp(v / "manifest.json");
  const auto at = text.find("\n  ],\n  \"model\"");  // the end of the files array, as the writer lays it out
  REQUIRE(at != std::string::npos);
  text.insert(at, ",\n    {\"name\":\"extra.bin\",\"bytes\":1099511627776,\"xxh64\":\"0000000000000000\"}");
  const auto sum = ckpt::locate_hex_member(text, ckpt::checksum_member);
  REQUIRE(sum.has_value());
  text.replace(*sum, 16, ckpt::to_hex(ckpt::xxh64_with_zeroed(text, *sum)));
  spit(v / "manifest.json", text);
  CHECK(run_bounded([&] { return expect_error_in_child([&] { (void)ckpt::verify(d.path); }, "belong to no segment"); },
                    std::chrono::seconds(20)) == 0);
}

TEST_CASE("the POSIX file layer reads and writes whole lengths and names the file and the bytes when it cannot") {
  temp_dir d("io");
  const fs::path p = d / "f";
  spit(p, "0123456789");
  const std::string prefix = "test: ";
  auto open_as = [&](int access) {
    return zero::io::posix_file(zero::io::open_existing(p, access, S_IFREG, zero::io::symlinks::refuse, "here", prefix),
                                zero::io::path_label(prefix, p));
  };
  auto message = [](const std::function<void()>& f, zero::error_kind want) {
    try {
      f();
    } catch (const zero::error& e) {
      CHECK(e.kind() == want);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const zero::io::posix_file rw = open_as(O_RDWR);
  rw.pwrite_all("abc", 3, 12);  // past the end: the gap reads as zeros
  CHECK(rw.size() == 15);
  char buf[16] = {};
  CHECK(rw.pread_full(buf, 16, 8) == 7);  // stops at the end of the file, not before
  CHECK(std::string(buf, 7) == std::string("89\0\0abc", 7));
  // A read past the end is a truncated file (corrupt), with where it ends and what is missing.
  CHECK(message([&] { rw.pread_exact(buf, 10, 10); }, zero::error_kind::corrupt) ==
        "test: '" + p.string() + "' is truncated: it ends at byte 15 but 5 more bytes were expected");
  // A write the descriptor does not allow: io, naming the byte range.
  const zero::io::posix_file ro = open_as(O_RDONLY);
  CHECK(message([&] { ro.pwrite_all("xy", 2, 4); }, zero::error_kind::io) ==
        "test: cannot write '" + p.string() + "', bytes 4 to 6: " + zero::io::errno_text(EBADF));
  // A read of a directory's descriptor fails in the call: io, naming the byte range.
  const zero::io::posix_file dir(
      zero::io::open_existing(d.path, O_RDONLY, S_IFDIR, zero::io::symlinks::follow, "as a directory", prefix),
      zero::io::path_label(prefix, d.path));
  CHECK(message([&] { (void)dir.pread_full(buf, 4, 0); }, zero::error_kind::io) ==
        "test: cannot read '" + d.path.string() + "', bytes 0 to 4: " + zero::io::errno_text(EISDIR));
  // The open policy: a symbolic link is refused, and says so.
  fs::create_symlink(p, d / "link");
  CHECK(message(
            [&] { zero::io::open_existing(d / "link", O_RDONLY, S_IFREG, zero::io::symlinks::refuse, "here", prefix); },
            zero::error_kind::io) ==
        "test: cannot open '" + (d / "link").string() +
            "' here: it is a symbolic link, not a regular file (symbolic links are not followed here)");
}

TEST_CASE("a durable writer past the page cache writes the same bytes, aligned blocks direct and the rest buffered") {
  temp_dir d("direct");
  // Blocks from an aligned buffer: two aligned ones, a ragged one, then an aligned one (which the page
  // cache takes: past a ragged block, everything does), then bytes unhashed and overwritten.
  constexpr std::size_t A = ckpt::durable_writer::direct_alignment;
  void* raw = std::aligned_alloc(A, 4 * A);
  REQUIRE(raw != nullptr);
  auto* buf = static_cast<unsigned char*>(raw);
  for (std::size_t i = 0; i < 4 * A; ++i) buf[i] = static_cast<unsigned char>(i * 7 + 3);
  std::string want;
  const auto append = [&](const unsigned char* p, std::size_t n) { want.append(reinterpret_cast<const char*>(p), n); };
  std::uint64_t checksum = 0, direct = 0;
  bool on = false;
  {
    ckpt::durable_writer w(d / "f");
    on = w.bypass_page_cache();
    w.write(buf, 2 * A);
    append(buf, 2 * A);
    direct = w.direct_bytes();
    w.write(buf + 5, 100);
    append(buf + 5, 100);
    w.write(buf, A);
    append(buf, A);
    CHECK(w.direct_bytes() == direct);  // nothing direct after the ragged block
    CHECK(w.bytes() == want.size());
    checksum = w.checksum();
    w.commit();
  }
  std::free(raw);
  CHECK(slurp(d / "f") == want);
  CHECK(checksum == ckpt::xxh64(want.data(), want.size()));
  // Where the file system takes O_DIRECT (not tmpfs), the aligned blocks before the ragged one went
  // past the page cache; where it does not, none did.
  CHECK(direct == (on ? 2 * A : 0));
}
