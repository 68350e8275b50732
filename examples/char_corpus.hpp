// The GPT example's data: text files read at run time, a byte-level vocabulary, a held-out split and counter-based batches.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "mlp.hpp"  // mlp::key: the counter-based generator both examples use
#include "tool_files.hpp"
#include "zero/error.hpp"

namespace gpt {

// The corpus as tokens. A "character" is a byte: UTF-8 text stays exact, and a multi-byte character
// is a few tokens. The vocabulary is the set of bytes that occur, in ascending order, so the same
// files always give the same token ids. The corpus is text: any byte but NUL. A file with a NUL
// byte is binary (an executable, an archive, a sparse file's holes) and refused, naming the file
// and where its first NUL is: a byte model would train on it, but not on what was meant.
//
// The corpus is read into memory whole (the batches draw windows anywhere in it), once as text and
// once as byte tokens, so it is bounded: at most max_bytes (train_gpt's --data-limit, default
// default_max_corpus_bytes), checked from each file's size before it is read, and again as it is
// read. An empty file is refused; a FIFO, device or socket is refused without being opened for long
// (it could block forever or never end).
struct corpus {
  std::vector<std::string> files;  // what was read, in order
  std::string text;                // their contents, concatenated
  std::string vocab;               // vocab[id] is the byte of token id
  std::array<int, 256> id{};       // the token id of a byte, -1 where the byte never occurs
  std::vector<std::uint8_t> tokens;  // the text's tokens reordered: the training blocks, then the held-out ones
  std::size_t train_end = 0;       // tokens [0, train_end) train, [train_end, size) are held out

  int vocab_size() const { return static_cast<int>(vocab.size()); }
  std::size_t train_size() const { return train_end; }
  std::size_t held_out_size() const { return tokens.size() - train_end; }
};

// The default bound on the corpus (train_gpt --data-limit): twice that in memory, text and tokens.
inline constexpr std::uint64_t default_max_corpus_bytes = std::uint64_t{256} << 20;

// The files a --data path stands for: a file itself; a directory, its *.md and *.txt files (not
// recursive) in byte order of their names, so a listing order never changes the corpus.
inline std::vector<std::filesystem::path> corpus_files(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return {p};
  ZERO_CHECK(fs::is_directory(p, ec), io, "corpus: ", toolcli::quote(p.string()),
             " is neither a regular file nor a directory");
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(p)) {
    const auto ext = entry.path().extension();
    if (entry.is_regular_file() && (ext == ".md" || ext == ".txt")) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  ZERO_CHECK(!out.empty(), io, "corpus: the directory ", toolcli::quote(p.string()), " holds no .md or .txt file");
  return out;
}

// The text is cut into this many equal blocks, and a `held_out` fraction of them, evenly spread, is
// held out. Why not a tail, as nanoGPT holds out: a corpus of several files is not uniform (the
// tail of this repository's docs is mostly C++), and a tail would measure another distribution.
inline constexpr std::size_t split_blocks = 100;

// Reads the paths in order, builds the vocabulary and splits the tokens: block j of split_blocks is
// held out when floor((j + 1) h) > floor(j h), h = held_out; the training blocks come first in
// `tokens`, in text order, then the held-out ones (a window may span the seam between two blocks of
// one part: a few positions out of a block's length). Both parts must hold `context` + 1 tokens.
inline corpus load_corpus(const std::vector<std::string>& paths, double held_out, int context,
                          std::uint64_t max_bytes = default_max_corpus_bytes) {
  corpus c;
  for (const auto& p : paths)
    for (const auto& f : corpus_files(p)) {
      const std::uint64_t before = c.text.size();
      const std::uint64_t room = max_bytes - before;
      const std::uint64_t got = toolcli::append_input("corpus", f.string(), room, c.text,
                                                      before == 0 ? "the corpus may hold (--data-limit)"
                                                                  : "left of what the corpus may hold (--data-limit " +
                                                                        std::to_string(max_bytes) + ", " +
                                                                        std::to_string(before) + " read before it)");
      ZERO_CHECK(got > 0, invalid_argument, "corpus: ", toolcli::quote(f.string()), " is empty");
      const auto nul = c.text.find('\0', before);
      ZERO_CHECK(nul == std::string::npos, invalid_argument, "corpus: ", toolcli::quote(f.string()),
                 " is binary, not text: it has a NUL byte at offset ", nul - before,
                 " (the character model reads text: any byte but NUL)");
      c.files.push_back(f.string());
    }
  std::array<bool, 256> seen{};
  for (unsigned char ch : c.text) seen[ch] = true;
  c.id.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<std::size_t>(b)]) {
      c.id[static_cast<std::size_t>(b)] = static_cast<int>(c.vocab.size());
      c.vocab.push_back(static_cast<char>(b));
    }
  const std::size_t n = c.text.size();
  std::vector<std::uint8_t> held;
  c.tokens.reserve(n);
  for (std::size_t j = 0; j < split_blocks; ++j) {
    const bool out = std::floor(static_cast<double>(j + 1) * held_out) > std::floor(static_cast<double>(j) * held_out);
    for (std::size_t i = j * n / split_blocks; i < (j + 1) * n / split_blocks; ++i)
      (out ? held : c.tokens).push_back(static_cast<std::uint8_t>(c.id[static_cast<unsigned char>(c.text[i])]));
  }
  c.train_end = c.tokens.size();
  c.tokens.insert(c.tokens.end(), held.begin(), held.end());
  const auto need = static_cast<std::size_t>(context) + 1;
  ZERO_CHECK(c.train_size() >= need && c.held_out_size() >= need, invalid_argument, "corpus: ", c.tokens.size(),
             " bytes split into ", c.train_size(), " for training and ", c.held_out_size(),
             " held out, but each part needs at least --context + 1 = ", need);
  return c;
}

// The unigram entropy, in nats, of tokens [begin, end): -sum p ln p over their own frequencies.
// The cross-entropy of the best model that ignores context, on exactly these tokens: a language
// model has learned something about context when its loss falls below it.
inline double unigram_entropy(const corpus& c, std::size_t begin, std::size_t end) {
  std::vector<std::size_t> count(c.vocab.size(), 0);
  for (std::size_t i = begin; i < end; ++i) ++count[static_cast<std::size_t>(c.tokens[i])];
  double h = 0.0;
  const double n = static_cast<double>(end - begin);
  for (std::size_t k : count)
    if (k > 0) h -= static_cast<double>(k) / n * std::log(static_cast<double>(k) / n);
  return h;
}

// Where training sequence `k` of step `step` starts in the training part: a pure function of the
// seed, the step and k (the counter-based generator), so every rank, stage and world size draws the
// same sequences, and a resumed run continues with the batches an uninterrupted one would see.
inline std::size_t train_window(const corpus& c, int context, std::uint64_t seed, std::uint64_t step, std::uint64_t k) {
  const std::uint64_t starts = c.train_size() - static_cast<std::size_t>(context);  // windows of context + 1
  return static_cast<std::size_t>(mlp::key(seed, 5, step, k) % starts);
}

// The starts of `count` evaluation windows in tokens [begin, end): non-overlapping, evenly spread
// (all of them when count is 0 or more than fit).
inline std::vector<std::size_t> eval_windows(std::size_t begin, std::size_t end, int context, std::size_t count) {
  const std::size_t fit = (end - begin - 1) / static_cast<std::size_t>(context);
  const std::size_t n = count == 0 ? fit : std::min(count, fit);
  std::vector<std::size_t> out;
  for (std::size_t j = 0; j < n; ++j) out.push_back(begin + (j * fit / n) * static_cast<std::size_t>(context));
  return out;
}

}  // namespace gpt
