// A chat template from anywhere (tokenizer_config.json's chat_template or chat_template.jinja of a
// downloaded model): read as transformers' Jinja environment reads it and recognized as one ptrain
// renders, or refused. A template ptrain does not recognize must be refused with an exception; a
// crash, a hang, an out-of-bounds read or undefined behaviour is a finding.
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>

#include "tokenizer/chat.h"
#include "tokenizer/template_scan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)ptrain::scan_template(text);
  } catch (const std::exception&) {
  }
  try {
    const ptrain::RecognizedTemplate known = ptrain::recognize_chat_template(text, "chat_template.jinja");
    if (known.kind == ptrain::ChatTemplate::automatic || known.model.empty()) std::abort();
  } catch (const std::exception&) {
  }
  return 0;
}
