#include "common/tokenizer/chat_template.h"

#include "gtest/gtest.h"

namespace sluice::tokenizer {
namespace {

TEST(ChatTemplateTest, ChatMlMatchesQwen2Template) {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "hi"}, {"assistant", "hello"}, {"user", "2+2?"}};
  EXPECT_EQ(ApplyChatMlTemplate(messages, /*add_generation_prompt=*/true),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\nhello<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ApplyChatMlTemplate({{"user", "hi"}}, /*add_generation_prompt=*/false),
            "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplateTest, DefaultSystemPromptOnlyWhenAskedAndMissing) {
  EXPECT_EQ(ApplyChatMlTemplate({{"user", "hi"}}, true, kQwen2DefaultSystemPrompt),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ApplyChatMlTemplate({{"system", "S"}}, false, kQwen2DefaultSystemPrompt),
            "<|im_start|>system\nS<|im_end|>\n");
  EXPECT_EQ(ApplyChatMlTemplate({}, true), "<|im_start|>assistant\n");
}

}  // namespace
}  // namespace sluice::tokenizer
