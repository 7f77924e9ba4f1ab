// phasekv-tokenizer (what `phasekv tokenizer ...` runs): train a sentencepiece tokenizer on a
// corpus manifest, and encode or decode with one (io/sentencepiece_tokenizer.h).
//
// A program of its own because Debian's libsentencepiece carries its own copy of protobuf-lite,
// and libtorch loads Debian's libprotobuf: in one process the two collide in their static
// initialisers (measured: the phasekv binary linked with both crashed before main, in
// protobuf's DescriptorPool). This program links no libtorch.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include "io/sentencepiece_tokenizer.h"
#include "util/error.h"

namespace phasekv {
namespace {

struct TokenizerArgs {
  std::string manifest, out, dir, text, ids;
  SentencePieceTrainOptions train;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error("--ids: '" + item + "' is not a token id (allowed: comma-separated integers)");
    }
  }
  return ids;
}

}  // namespace
}  // namespace phasekv

int main(int argc, char** argv) {
  using namespace phasekv;
  CLI::App app{"phasekv tokenizer: train a sentencepiece tokenizer; encode and decode",
               "phasekv tokenizer"};
  auto a = std::make_shared<TokenizerArgs>();
  CLI::App* cmd = &app;
  cmd->require_subcommand(1);

  auto* train = cmd->add_subcommand("train", "train on a corpus manifest's training files");
  train->add_option("--manifest", a->manifest, "corpus manifest (data/corpus/*.json)")->required();
  train->add_option("--out", a->out, "directory for tokenizer.model and tokenizer.json")->required();
  train->add_option("--vocab-size", a->train.vocab_size, "pieces, >= 260");
  train->add_option("--model-type", a->train.model_type, "bpe|unigram");
  train->add_option("--threads", a->train.threads, "trainer threads");
  train->callback([a] {
    const auto meta = train_sentencepiece(a->manifest, a->out, a->train);
    std::cout << fmt::format("{} pieces from {} lines of {} files ({} held out) -> {}/tokenizer.model\n",
                             meta["vocab_size"].get<int>(), meta["training_lines"].get<int64_t>(),
                             meta["training_files"].get<int>(), meta["held_out_files"].get<int>(),
                             a->out);
  });

  auto* encode = cmd->add_subcommand("encode", "print the ids and pieces of a text");
  encode->add_option("--tokenizer", a->dir, "directory written by `tokenizer train`")->required();
  encode->add_option("--text", a->text, "the text")->required();
  encode->callback([a] {
    const auto t = SentencePieceTokenizer::load(a->dir);
    const auto ids = t.encode(a->text);
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(t.piece(id));
    std::cout << fmt::format("{}\n{}\n", fmt::join(ids, ","), fmt::join(pieces, " "));
  });

  auto* decode = cmd->add_subcommand("decode", "print the text of comma-separated ids");
  decode->add_option("--tokenizer", a->dir, "directory written by `tokenizer train`")->required();
  decode->add_option("--ids", a->ids, "e.g. 12,7,301")->required();
  decode->callback([a] {
    std::cout << SentencePieceTokenizer::load(a->dir).decode(parse_ids(a->ids)) << "\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
