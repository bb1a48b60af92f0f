#ifndef SLUICE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define SLUICE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace sluice::tokenizer {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

// Qwen2's chat template (ChatML):
//
//   <|im_start|>{role}\n{content}<|im_end|>\n   for each message, then
//   <|im_start|>assistant\n                     when add_generation_prompt.
//
// Qwen2's own Jinja template also inserts a system message "You are a
// helpful assistant." when the first message is not a system one; that
// happens here only when `default_system_prompt` is non-empty (pass
// kQwen2DefaultSystemPrompt for the exact Qwen2 string). Content is copied
// as is: encode the result with special tokens allowed so that the markers
// become their ids (and text in content that spells a marker does too, as
// with the reference template).
std::string ApplyChatMlTemplate(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt,
                                absl::string_view default_system_prompt = "");

inline constexpr absl::string_view kQwen2DefaultSystemPrompt = "You are a helpful assistant.";

}  // namespace sluice::tokenizer

#endif  // SLUICE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
