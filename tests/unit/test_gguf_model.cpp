// The GGUF model reader's refusal that sweep.gguf_import cannot stage — gguf-py writes
// general.architecture into every file — on a file GgufWriter writes without it. (Every other
// refusal has its file there.)
#include <gtest/gtest.h>

#include <string>

#include "checkpoint/gguf.h"
#include "checkpoint/gguf_model.h"
#include "common/error.h"
#include "test_util.h"

using namespace ptrain;

TEST(GgufModelFile, NoArchitectureIsRefusedByName) {
  test::TempDir dir;
  const std::string path = (dir.path / "no_arch.gguf").string();
  GgufWriter w;
  w.add("llama.block_count", uint32_t{2});
  w.add("llama.embedding_length", uint32_t{64});
  w.write(path);
  try {
    GgufModel model(path);
    ADD_FAILURE() << "a GGUF file without general.architecture was read as a model";
  } catch (const UnsupportedInput& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": no general.architecture"), std::string::npos) << e.what();
  }
}
