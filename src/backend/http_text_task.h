// Key-value retrieval rendered as text, for served models with real tokenizers (docs/AUDIT.md).
//
// A phase is a position in TOKENS, and only the server knows its tokenizer, so nothing here
// assumes one: every piece of text ("\nkey", " 4821", " -> value", filler sentences, the
// question) is tokenized by the server once, and prompts are spliced from those ids and sent as
// ids. The target key's position is therefore known exactly in what the model sees. What
// splicing can break is the claim that the same TEXT would tokenize the same way; verify()
// re-tokenizes each prompt's text with the server and reports records whose measured key
// position differs from the plan (they are flagged, never silently trusted).
//
//   [bos] [pad x k] filler ... \nkey K1 -> value V1. filler ... \nkey Kt -> value Vt. ...
//   [pad x M-1-k] \n\nQuestion: what is the value of key Kt?\nAnswer: key Kt -> value
//
// In chat (TextTaskOptions::chat) the template's prefix replaces [bos], the question ends
// "... key Kt? Answer with the value only." and the template's suffix follows it:
//   [template prefix] [pad x k] Remember ... [pad x M-1-k] \n\nQuestion: ... only. [suffix]
//
// With several needles (TextTaskOptions::needles) one document holds several targets Kt, each
// asked by its own prompt (the same document, that target's question and padding).
//
// The model should continue with Vt; the scored token is the first non-blank token of " Vt" (the
// blank ones, such as a lone space, are part of the prompt). Padding is a filler token that
// round-trips (k copies tokenize to k tokens), placed after <bos> (prefix) or right before the
// target record (in_sequence) so that the key lands at phase r = position mod M; the prompt
// length is the same for every phase.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "task/tasks.h"

namespace phasekv {

struct TextTokenizerFns {
  // Texts -> ids, in order (add_special: the server's BOS etc.). Throws on failure.
  std::function<std::vector<std::vector<int32_t>>(const std::vector<std::string>&, bool)> tokenize;
  std::function<std::vector<std::string>(const std::vector<std::vector<int32_t>>&)> detokenize;
};

struct TextTaskOptions {
  int records = 8;           // key-value records per prompt
  int context_tokens = 512;  // body length target (filler + records), before padding
  int modulus = 24;          // M
  PaddingMode padding = PaddingMode::kPrefix;
  uint64_t seed = 0;
  // Chat (`--api chat`): the prompt is the chat template's rendering of one user message, so
  // the template's tokens before the content take the BOS's place and its tokens after the
  // content end the prompt (http_chat.h ChatFrame); phases count every templated token. The
  // message asks for the value alone, and the answer is the assistant's first tokens.
  bool chat = false;
  std::vector<int32_t> chat_prefix, chat_suffix;
  // Long documents: filler sentences in document order (task/filler_corpus.h; empty: the eight
  // built-in sentences), read from a random start per example and wrapping around; and the
  // target record's depth in the body as a fraction 0..1 (negative: every record at a random
  // sentence boundary). A depth puts the target at the sentence boundary nearest that fraction
  // of the filler's tokens, as NIAH places its needle; the other records stay random.
  std::vector<std::string> filler;
  std::vector<std::vector<int32_t>> filler_ids;  // filler's ids when tokenized beforehand
  double depth = -1;
  // Multi-needle (as RULER's multi-query needle-in-a-haystack): `needles` of the records are
  // targets, each asked by its own question and scored separately (build's `needle`); the
  // other records stay distractors. Needle 0 is the single-needle target (same document and
  // placement, a depth included); needles 1.. are drawn after it, at random sentence boundaries.
  int needles = 1;
};

// One (example, phase) prompt.
struct TextItem {
  int64_t example_id = 0;
  int phase = 0;
  int needle = 0;               // which target of the document the question asks for
  std::vector<int32_t> tokens;  // the prompt, ending right before the value
  int32_t target = 0;           // first non-blank token of the value
  std::vector<int32_t> answer;  // every value token from `target` on (generate mode)
  std::string answer_text;      // the value's digits (chat answers are read as text)
  int key_pos = 0, value_pos = 0, query_pos = 0;
  double depth = 0;  // the share of the body's other tokens before the target record
  // The document needed more filler sentences than the corpus holds, so its filler wrapped
  // around and repeats (a model may then retrieve from the repetition, not the long context).
  bool filler_repeats = false;
};

// The server's view of an item's text.
struct TextCheck {
  bool identical = false;  // tokenize(detokenize(prompt)) == prompt
  int planned_key_pos = 0;
  int measured_key_pos = 0;  // where the key lands when the text is tokenized by the server
  bool position_ok() const { return measured_key_pos == planned_key_pos; }
};

class TextKvTask {
 public:
  // Tokenizes the fixed pieces, detects the BOS the server adds and picks a padding token that
  // round-trips. Throws phasekv::Error when no candidate padding token does.
  TextKvTask(TextTokenizerFns tokenizer, TextTaskOptions options);

  // An example's prompt length (the same at every phase) and its answer's token count, for the
  // budget check and the plan before anything is scored (tokenizes the example's pieces).
  struct Shape {
    int prompt_tokens = 0;
    int answer_tokens = 0;
    bool filler_repeats = false;  // the document needs more sentences than the corpus has
  };
  Shape shape(int64_t example_id, int needle = 0);
  // Prompts for the given (example, phase) pairs asking for target `needle` (0 .. needles-1),
  // placed so that ITS key is at the phase; each example's pieces are tokenized once.
  std::vector<TextItem> build(const std::vector<std::pair<int64_t, int>>& pairs, int needle = 0);
  // The server's tokenization of each item's text: the key's measured position is the plan's
  // when the re-tokenized text agrees with the prompt up to and including the key, else the
  // number of tokens the text before the key becomes (plus the BOS).
  std::vector<TextCheck> verify(const std::vector<TextItem>& items);
  // Padding token, BOS and the text layout (for audit.json).
  nlohmann::json describe() const;
  int needles() const { return o_.needles; }

 private:
  struct Needle;
  struct Example;
  Example make_example(int64_t id);
  void detect_bos();    // the server's special tokens before a text (completions)
  void pick_padding();  // a filler token whose copies tokenize one for one
  std::vector<int32_t> ids(const std::string& text);

  TextTokenizerFns tok_;
  TextTaskOptions o_;
  std::vector<int32_t> bos_;
  int32_t pad_ = -1;
  std::string pad_text_;
  std::map<std::string, std::vector<int32_t>> cache_;  // piece text -> ids
};

}  // namespace phasekv
