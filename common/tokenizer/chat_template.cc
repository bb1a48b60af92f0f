#include "common/tokenizer/chat_template.h"

#include "absl/strings/str_cat.h"

namespace sluice::tokenizer {

std::string ApplyChatMlTemplate(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt,
                                absl::string_view default_system_prompt) {
  std::string text;
  if (!default_system_prompt.empty() && (messages.empty() || messages[0].role != "system")) {
    absl::StrAppend(&text, "<|im_start|>system\n", default_system_prompt, "<|im_end|>\n");
  }
  for (const ChatMessage& message : messages) {
    absl::StrAppend(&text, "<|im_start|>", message.role, "\n", message.content, "<|im_end|>\n");
  }
  if (add_generation_prompt) absl::StrAppend(&text, "<|im_start|>assistant\n");
  return text;
}

}  // namespace sluice::tokenizer
