// LoRA and QLoRA through the trainer: adapters over a frozen base (dense or NF4) start as the
// base, train, resume, checkpoint, export to PEFT and merge; activation checkpointing gives the
// same losses with the measured saving.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "app/export.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "checkpoint/safetensors.h"
#include "common/alloc_meter.h"
#include "common/error.h"
#include "config/config.h"
#include "data/dataset.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "parallel/fsdp.h"
#include "parallel/weights.h"
#include "quant/nf4.h"
#include "test_util.h"
#include "train/memory.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "train_util.h"

using namespace ptrain;
namespace fs = std::filesystem;
using test::last_line;
using test::load;
using test::losses;

// LoRA and QLoRA under activation checkpointing: the recomputed blocks differentiate the
// adapters over the frozen base (and draw the forward's dropout masks again), so training gives
// the same losses as without checkpointing;
// forward keeps only each block's input, measured by the allocation meter and equal to the
// planner's prediction in both cases.
TEST(Lora, ActivationCheckpointingTrainsIdenticallyAndSavesMemory) {
  const std::string all = "[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\",\"output\"]";
  for (const auto& [base, targets, dropout] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"none", all, "0.0"}, {"nf4", all, "0.0"}, {"none", "[\"q\",\"v\",\"up\"]", "0.0"}, {"nf4", all, "0.1"}}) {
    SCOPED_TRACE("quant.base=" + base + " lora.targets=" + targets + " lora.dropout=" + dropout);
    test::TempDir dir;
    const std::string cfg = test::small_config(dir);
    const std::vector<std::string> lora{
        "lora.enabled=true",           "lora.targets=" + targets, "lora.rank=4",
        "optimizer.lr=1e-2",           "training.steps=6",        "checkpoint.save_final=false",
        "quant.base=\"" + base + "\"", "lora.dropout=" + dropout};
    std::map<std::string, int64_t> saved;
    std::map<std::string, std::map<int64_t, double>> curve;
    for (const std::string ac : {"none", "full"}) {
      std::vector<std::string> sets = lora;
      sets.insert(sets.end(), {"memory.activation_checkpointing=\"" + ac + "\"", "run.output_dir=" + (dir / ac)});
      const Config c = load(cfg, sets);
      ASSERT_EQ(train(c), 0);
      curve[ac] = losses(dir / (ac + "/metrics.jsonl"));
      auto model = build_model(c, at::kCPU, test::local_comm());
      at::Tensor tokens = at::randint(0, 256, {c.data.micro_batch_size, c.data.seq_len + 1}, at::kLong);
      at::Tensor in = tokens.narrow(1, 0, c.data.seq_len), tgt = tokens.narrow(1, 1, c.data.seq_len);
      model->forward_loss(in, tgt, 0).backward();  // RoPE tables
      model->zero_grad();
      {
        MeterScope scope;
        at::Tensor loss = model->forward_loss(in, tgt, 0);
        saved[ac] = scope.meter().net.load() - static_cast<int64_t>(loss.nbytes());
        loss.backward();
      }
      if (dropout == "0.0") {
        EXPECT_EQ(saved[ac], predict_activations(c.model.shape, activation_inputs(c)).saved_bytes()) << ac;
      }
    }
    ASSERT_EQ(curve["none"].size(), 6u);
    if (dropout == "0.0") {
      for (const auto& [step, loss] : curve["none"])
        EXPECT_NEAR(curve["full"][step], loss, 1e-6 * loss) << "step " << step;
    } else {
      // With dropout, compare one step's adapter gradients from the same RNG state: the
      // recompute must draw the forward's masks. (Training curves with dropout are not
      // bit-reproducible on the CPU even without checkpointing.)
      std::map<std::string, std::vector<at::Tensor>> grads;
      at::Tensor tokens = at::randint(0, 256, {4, 33}, at::kLong);
      for (const std::string ac : {"none", "full"}) {
        std::vector<std::string> sets = lora;
        sets.push_back("memory.activation_checkpointing=\"" + ac + "\"");
        auto model = build_model(load(cfg, sets), at::kCPU, test::local_comm());
        at::manual_seed(11);
        model->forward_loss(tokens.narrow(1, 0, 32), tokens.narrow(1, 1, 32), 0).backward();
        for (auto& u : model->trained_units())
          if (u.shard.grad().defined()) grads[ac].push_back(u.shard.grad().clone());
      }
      ASSERT_EQ(grads["none"].size(), grads["full"].size());
      for (size_t i = 0; i < grads["none"].size(); ++i)
        EXPECT_TRUE(at::allclose(grads["full"][i], grads["none"][i], 1e-5, 1e-7)) << "adapter unit " << i;
    }
    EXPECT_LT(curve["none"][6], curve["none"][1]);
    EXPECT_LT(saved["full"], saved["none"] / 3) << "checkpointing keeps each block's input only";
    std::cout << "LoRA (base " << base << ", targets " << targets
              << ") saved activations per micro-batch: " << saved["none"] << " B without, " << saved["full"]
              << " B with activation checkpointing\n";
  }
}

// LoRA over a frozen base through the same FSDP units: step 0 is exactly the base model (B is
// zero), only adapter parameters get gradients and optimizer state, the base never changes,
// the loss falls, memory.json equals the prediction, and resume is bit-exact.
TEST(Lora, StartsAsBaseTrainsOnlyAdaptersAndResumes) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 10\nkeep = 5\n");
  const std::vector<std::string> lora{"lora.enabled=true",
                                      "lora.targets=[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"]", "lora.rank=4",
                                      "optimizer.lr=1e-2"};
  Config base_cfg = load(cfg), lora_cfg = load(cfg, lora);
  auto base = build_model(base_cfg, at::kCPU, test::local_comm());
  auto adapted = build_model(lora_cfg, at::kCPU, test::local_comm());
  at::manual_seed(3);
  at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  EXPECT_TRUE(at::equal(base->logits(tokens), adapted->logits(tokens)));
  for (size_t i = 0; i < base->units(UnitRole::base).size(); ++i) {
    EXPECT_FALSE(adapted->units(UnitRole::base)[i].shard.requires_grad());
    EXPECT_TRUE(at::equal(adapted->units(UnitRole::base)[i].shard, base->units(UnitRole::base)[i].shard)) << i;
  }

  ASSERT_EQ(train(lora_cfg), 0);  // 20 steps, checkpoints at 10 and 20
  auto l = losses(dir / "run/metrics.jsonl");
  // The frozen random base alone stays at its step-1 loss (5.49 here, ~log 256 minus little);
  // the adapters (under a fifth of the base's parameters at rank 4) must take it well below.
  EXPECT_LT(l[20], l[1] - 0.2);
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(lora_cfg, 1).to_json()));
  EXPECT_EQ(measured["frozen_base_bytes"].get<int64_t>(), base->plan().num_params() * 4);
  EXPECT_LT(measured["num_params"].get<int64_t>(), base->plan().num_params() / 5);
  SafetensorsFile saved(dir / "run/checkpoints/step_20/model.rank0.safetensors");
  for (const auto& e : saved.entries()) EXPECT_NE(e.name.find(".lora"), std::string::npos) << e.name;  // adapters only

  std::vector<std::string> resumed = lora;
  resumed.insert(resumed.end(),
                 {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + (dir / "run/checkpoints/step_10")});
  ASSERT_EQ(train(load(cfg, resumed)), 0);
  auto r = losses(dir / "resumed/metrics.jsonl");
  for (int64_t step = 11; step <= 20; ++step) EXPECT_EQ(r[step], l[step]) << step;
  // A LoRA checkpoint is refused by a full-model config, naming the mismatch.
  try {
    Config full =
        load(cfg, {"run.output_dir=" + (dir / "x"), "checkpoint.resume=" + (dir / "run/checkpoints/step_10")});
    train(full);
    ADD_FAILURE() << "accepted";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("lora.enabled"), std::string::npos) << e.what();
  }
}

namespace {

// Calls fn(unit, HF weight slot, its NF4 module) for every projection of `m`'s NF4 base, in block
// and Proj order; returns how many there were (a block without its seven modules fails the test).
int64_t for_each_nf4_module(const FsdpModel& m,
                            const std::function<void(size_t, const ParamSlot&, const nf4::Quantized&)>& fn) {
  int64_t modules = 0;
  for (size_t i = 0; i < m.plan().full.size(); ++i) {
    if (m.plan().full[i].kind != UnitKind::block) continue;
    int p = 0;
    for (const auto& group : block_matrix_groups(m.plan().full[i]))
      for (const auto& module : group) {
        const nf4::Quantized* q = m.nf4_weight(i, static_cast<Proj>(p++));
        if (!q) {
          ADD_FAILURE() << "no NF4 module for " << module.name;
          continue;
        }
        fn(i, module, *q);
        ++modules;
      }
    EXPECT_EQ(p, kProjections);
  }
  return modules;
}

// The same codes, absmax (codes) and, with double quantization, absmax2 and mean.
void expect_same_nf4(const nf4::Quantized& got, const nf4::Quantized& want, const std::string& name) {
  EXPECT_TRUE(at::equal(got.packed.reshape({-1}), want.packed.reshape({-1}))) << name;
  EXPECT_TRUE(at::equal(got.absmax.reshape({-1}), want.absmax.reshape({-1}))) << name;
  if (!want.double_quant) return;
  EXPECT_TRUE(at::equal(got.absmax2, want.absmax2)) << name;
  EXPECT_EQ(got.offset, want.offset) << name;
}

}  // namespace

// QLoRA through the trainer: an NF4 base (every block's matrices) + LoRA. At step 0 the model
// equals a dense LoRA model whose base matrices are the NF4 weights dequantized; it trains;
// memory.json equals `ptrain check`'s prediction, with 0.516 bytes per 4-bit weight under
// double quantization and 0.5625 without (plus alignment padding).
TEST(Qlora, Nf4BaseTrainsAndEqualsItsDequantizedDenseModel) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  const std::vector<std::string> lora{"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"o\",\"down\"]", "lora.rank=4",
                                      "optimizer.lr=1e-2"};
  std::vector<std::string> q = lora;
  q.push_back("quant.base=\"nf4\"");
  Config qc = load(cfg, q), dc = load(cfg, lora);
  auto qm = build_model(qc, at::kCPU, test::local_comm());
  auto dm = build_model(dc, at::kCPU, test::local_comm());
  // The dense model's base matrices <- the NF4 model's dequantized matrices.
  {
    at::NoGradGuard no_grad;  // each projection is its own NF4 module
    const int64_t modules = for_each_nf4_module(*qm, [&](size_t i, const ParamSlot& module, const nf4::Quantized& q) {
      slot_view(dm->units(UnitRole::base)[i].shard.detach(), module).copy_(nf4::dequantize(q, at::kFloat));
    });
    EXPECT_EQ(modules, kProjections * qc.model.shape.n_layers);
  }
  at::manual_seed(3);
  at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  EXPECT_TRUE(at::allclose(qm->logits(tokens), dm->logits(tokens), 1e-5, 1e-6));
  ASSERT_EQ(train(qc), 0);
  auto l = losses(dir / "run/metrics.jsonl");
  EXPECT_LT(l[20], l[1] - 0.2);
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(qc, 1).to_json()));
  // The format's bytes per weight (4 bits + a float32 absmax per 64, or with double quantization
  // an 8-bit absmax per 64 + a float32 per 256 x 64), plus at most the alignment padding of each
  // block's byte unit: kUnitAlign at its end and kByteAlign after each of its 21 parts (codes,
  // absmax, absmax2 of 7 projections).
  const double params = measured["nf4_params"].get<double>();
  const double padding = qc.model.shape.n_layers * (kUnitAlign + 3 * kProjections * nf4::kByteAlign) / params;
  const double dq = 0.5 + 1.0 / 64 + 4.0 / (64 * 256), plain_format = 0.5 + 4.0 / 64;
  EXPECT_GE(measured["nf4_bytes_per_param"].get<double>(), dq);
  EXPECT_LE(measured["nf4_bytes_per_param"].get<double>(), dq + padding);
  q.push_back("quant.double_quant=false");
  auto plain = nlohmann::json::parse(predict_memory(load(cfg, q), 1).to_json());
  EXPECT_GE(plain["nf4_bytes_per_param"].get<double>(), plain_format);
  EXPECT_LE(plain["nf4_bytes_per_param"].get<double>(), plain_format + padding);
}

// Loading hf_odd into an NF4 base quantizes each projection as bitsandbytes quantizes a
// Linear4bit: every module's packed codes, absmax codes, absmax2 and mean equal bitsandbytes
// 0.50.2's (its portable kernels, tests/fixtures/make_qlora_fixtures.py), bit for bit — 96-column
// rows, so NF4 blocks straddle rows; 48 to 317 blocks per module, the last one short.
TEST(Qlora, EveryProjectionQuantizesToBitsandbytesBytes) {
  test::TempDir dir;
  test::small_config(dir);  // the corpus
  SafetensorsFile expected(test::fixture("qlora_nf4_expected.safetensors"));
  test::write_text(dir / "q.toml", "[model]\nhf_path = \"" + test::fixture("hf_odd") + "\"\n[data]\npath = \"" +
                                       (dir / "corpus.txt") +
                                       "\"\nseq_len = 24\n[training]\ndevice = \"cpu\"\n[lora]\nenabled = true\n"
                                       "[quant]\nbase = \"nf4\"\n");
  Config c = load(dir / "q.toml");
  auto m = build_model(c, at::kCPU, test::local_comm());
  const int64_t modules = for_each_nf4_module(*m, [&](size_t, const ParamSlot& module, const nf4::Quantized& q) {
    nf4::Quantized want;
    want.double_quant = true;
    want.packed = expected.tensor(module.name + ".packed");
    want.absmax = expected.tensor(module.name + ".absmax");
    want.absmax2 = expected.tensor(module.name + ".absmax2");
    want.offset = expected.tensor(module.name + ".offset").item<float>();
    expect_same_nf4(q, want, module.name);
  });
  EXPECT_EQ(modules * 4, static_cast<int64_t>(expected.entries().size()));
}

// A pre-quantized bitsandbytes checkpoint (tests/fixtures/make_bnb4bit_fixtures.py: transformers +
// bitsandbytes saved hf_odd in NF4, with and without double quantization) loads into the NF4 base
// as stored — every projection's codes, absmax, nested absmax and mean equal the file's bytes —
// and the model scores as its dequantized reference: transformers with each Linear holding
// bitsandbytes' dequantization of the stored weight, bare and with a PEFT adapter applied.
// `check --plan` counts the same NF4 bytes the model holds.
TEST(Qlora, BitsandbytesCheckpointLoadsAsStoredAndScoresAsItsDequantizedReference) {
  test::TempDir dir;
  test::small_config(dir);  // the corpus
  SafetensorsFile expected(test::fixture("hf_bnb4_expected.safetensors"));
  const at::Tensor tokens = expected.tensor("tokens");
  for (const std::string name : {"hf_odd_bnb4", "hf_odd_bnb4_nodq"}) {
    const std::string base = test::fixture(name);
    const bool dq = name == "hf_odd_bnb4";
    const HfStorage stored = read_hf_storage(base);
    EXPECT_TRUE(stored.nf4);
    EXPECT_EQ(stored.double_quant, dq);
    const std::string toml = "[model]\nhf_path = \"" + base + "\"\n[data]\npath = \"" + (dir / "corpus.txt") +
                             "\"\nseq_len = 24\n[training]\ndevice = \"cpu\"\n[precision]\nmode = \"fp32\"\n"
                             "[lora]\nenabled = true\nrank = 4\nalpha = 8.0\n"
                             "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n"
                             "[quant]\nbase = \"nf4\"\ndouble_quant = " +
                             (dq ? "true" : "false") + "\n";
    test::write_text(dir / (name + ".toml"), toml);
    Config c = load(dir / (name + ".toml"));
    auto m = build_model(c, at::kCPU, test::local_comm());
    // The bytes as stored: nothing dequantized and requantized.
    const HfCheckpoint ckpt(base);
    const int64_t modules = for_each_nf4_module(*m, [&](size_t, const ParamSlot& module, const nf4::Quantized& q) {
      expect_same_nf4(q, read_bnb_nf4(ckpt, module.name, module.shape, dq), module.name);
    });
    EXPECT_EQ(modules, kProjections * c.model.shape.n_layers);
    auto diff = [&](const at::Tensor& want) {
      const at::Tensor got = m->logits(tokens).view(want.sizes());
      return ((got - want).abs().max() / want.abs().max()).item<double>();
    };
    const double bare = diff(expected.tensor("logits." + name));
    load_adapters(*m, read_peft(test::fixture("qlora_adapter"), c.model.shape).tensors);
    const double adapted = diff(expected.tensor("adapter_logits." + name));
    std::cout << name << ": logits vs the dequantized reference " << bare << " (with the PEFT adapter " << adapted
              << ", relative to the largest)\n";
    EXPECT_LE(bare, 1e-5) << name;
    EXPECT_LE(adapted, 1e-5) << name;
    EXPECT_EQ(m->nf4_bytes(), predict_memory(c, 1).nf4_bytes) << name;
  }
}

// PEFT: an adapter saved by PEFT 0.21.2 over hf_tiny (tests/fixtures/make_peft_fixtures.py)
// loaded through lora.adapter_path gives PEFT's logits; a ptrain LoRA checkpoint exports to
// PEFT's files and key names and loads back exactly.
// Adapters PEFT saves in other configurations (tests/fixtures/make_peft_fixtures.py) load as PEFT
// reads them — a null base model, rsLoRA's alpha/sqrt(r), target_modules as a regex or
// "all-linear" — and give PEFT's logits; the configurations ptrain does not implement are refused
// naming the key, by `ptrain check` too.
TEST(Peft, AdaptersPeftSavesLoadAsPeftReadsThemOrAreRefusedByName) {
  test::TempDir dir;
  test::small_config(dir);  // the corpus
  const std::string base = test::fixture("hf_tiny");
  const LlamaShape shape = read_hf_config(base);
  SafetensorsFile expected(test::fixture("peft_variants_expected.safetensors"));
  const std::map<std::string, std::pair<std::string, bool>> accepted{
      {"null_base", {"[\"q\", \"v\", \"down\"]", false}},
      {"rslora", {"[\"q\", \"k\", \"v\", \"o\"]", true}},
      {"regex", {"[\"q\", \"down\"]", false}},
      {"all_linear", {"[\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]", false}}};
  for (const auto& [name, how] : accepted) {
    const std::string adapter = test::fixture("peft_variants/" + name);
    test::write_text(dir / "peft.toml",
                     "[model]\nhf_path = \"" + base + "\"\n[data]\npath = \"" + (dir / "corpus.txt") +
                         "\"\nseq_len = 24\n[training]\ndevice = \"cpu\"\n[lora]\nenabled = true\n"
                         "targets = " +
                         how.first + "\nrank = 4\nalpha = 8.0\nrslora = " + (how.second ? "true" : "false") +
                         "\nadapter_path = \"" + adapter + "\"\n");
    Config c = load(dir / "peft.toml");
    auto m = build_model(c, at::kCPU, test::local_comm());
    const double diff = (m->logits(expected.tensor("tokens")).view({2, 24, 256}) - expected.tensor(name + ".logits"))
                            .abs()
                            .max()
                            .item<double>();
    EXPECT_LE(diff, 1e-4) << name;
    std::cout << name << ": max |logits - PEFT's| = " << diff << "\n";
  }
  {  // a tensor of a kind ptrain does not train (DoRA's magnitude) beside the LoRA pairs: named
    namespace fs = std::filesystem;
    const fs::path extra = dir.path / "extra_tensor";
    fs::create_directories(extra);
    fs::copy_file(test::fixture("peft_variants/null_base/adapter_config.json"), extra / "adapter_config.json");
    SafetensorsFile src(test::fixture("peft_variants/null_base/adapter_model.safetensors"));
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& e : src.entries()) named.emplace_back(e.name, src.tensor(e.name));
    named.emplace_back("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", at::ones({64}));
    write_safetensors((extra / "adapter_model.safetensors").string(), named, {});
    Config c = load(dir / "peft.toml", {"lora.adapter_path=\"" + extra.string() + "\"",
                                        "lora.targets=[\"q\", \"v\", \"down\"]", "lora.rslora=false"});
    try {
      build_model(c, at::kCPU, test::local_comm());
      ADD_FAILURE() << "an adapter with a DoRA magnitude tensor loaded";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("ptrain would not use, e.g. "
                                           "'model.layers.0.self_attn.q_proj.lora_magnitude_vector'"),
                std::string::npos)
          << e.what();
    }
  }
  for (const auto& [name, key] :
       std::vector<std::pair<std::string, std::string>>{{"rank_pattern", "\"rank_pattern\""},
                                                        {"layers_to_transform", "\"layers_to_transform\""},
                                                        {"modules_to_save", "\"modules_to_save\""},
                                                        {"bias", "\"bias\""},
                                                        {"use_dora", "\"use_dora\""},
                                                        {"regex_one_layer", "in 1 of 2 blocks"}}) {
    try {
      read_peft_config(test::fixture("peft_variants/" + name), shape);
      ADD_FAILURE() << name << " was accepted";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  // Through the config: rsLoRA that the config does not say is named, exit 2 in `ptrain check`.
  try {
    load(dir / "peft.toml", {"lora.adapter_path=\"" + test::fixture("peft_variants/rslora") + "\"",
                             "lora.targets=[\"q\", \"k\", \"v\", \"o\"]", "lora.rslora=false"});
    ADD_FAILURE() << "an rsLoRA adapter loaded into a plain LoRA config";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lora.adapter_path: the adapter uses rsLoRA"), std::string::npos) << e.what();
  }
}

// target_modules as a string is matched as PEFT matches it, with Python's re.fullmatch against
// every module name: Python's syntax (a named group) reads, and a pattern that backtracks without
// end (Python itself would never return) is refused naming the key instead of hanging.
TEST(Peft, TargetModulesRegexMatchesAsPythonsFullmatchWithinABound) {
  test::TempDir dir;
  const LlamaShape shape = read_hf_config(test::fixture("hf_tiny"));
  auto config = [&](const std::string& pattern) {
    test::write_text(
        dir / "adapter_config.json",
        nlohmann::json{{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 8}, {"target_modules", pattern}}.dump());
    return read_peft_config(dir.path.string(), shape);
  };
  // re.fullmatch(r"model\.layers\.\d+\.(?:self_attn|mlp)\.(?P<p>q|down)_proj", name) holds for q_proj
  // and down_proj of every block; "q_proj" alone matches no full name.
  EXPECT_EQ(config(R"(model\.layers\.\d+\.(?:self_attn|mlp)\.(?P<p>q|down)_proj)").targets,
            (std::vector<std::string>{"q", "down"}));
  EXPECT_THROW(config("q_proj"), RuntimeError);
  try {
    config("(.*)*x");
    ADD_FAILURE() << "a backtracking pattern was accepted";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("target_modules \"(.*)*x\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(config("(unclosed"), RuntimeError);
  // r written as a float (found by fuzz_peft_config: 2.2e72 was converted with undefined behaviour)
  for (const double r : {2.2e72, 4.0}) {
    test::write_text(
        dir / "adapter_config.json",
        nlohmann::json{{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 8}, {"target_modules", "all-linear"}}.dump());
    try {
      read_peft_config(dir.path.string(), shape);
      ADD_FAILURE() << "r = " << r << " was read";
    } catch (const UnsupportedInput& e) {
      EXPECT_NE(std::string(e.what()).find("r must be an integer"), std::string::npos) << e.what();
    }
  }
}

// adapter_config.json against PEFT (tests/fixtures/make_peft_config_variants.py: the config PEFT
// 0.21.2 saves over hf_tiny and 227 variants — every key absent, null and at values of other
// types, target_modules in every form PEFT takes, seeded combinations). Each is read into the
// network PEFT builds from it — the same modules adapted, each with PEFT's rank and scaling — or
// refused naming adapter_config.json; what PEFT refuses ptrain refuses.
TEST(Peft, EveryAdapterConfigVariantIsReadAsPeftBuildsItOrRefused) {
  const auto fixture = nlohmann::json::parse(read_text_file(test::fixture("peft_config_variants.json")));
  const LlamaShape shape = read_hf_config(test::fixture("hf_tiny"));
  test::TempDir dir;
  int read = 0, refused = 0, refused_by_both = 0;
  for (const auto& v : fixture.at("variants")) {
    const std::string name = v.at("name").get<std::string>();
    test::write_text(dir / "adapter_config.json", v.at("config").dump());
    std::optional<PeftAdapter> a;
    std::string why;
    try {
      a = read_peft_config(dir.path.string(), shape);
    } catch (const std::runtime_error& e) {
      why = e.what();
    }
    if (v.contains("error")) {
      EXPECT_FALSE(a) << name << ": PEFT refuses it (" << v.at("error") << ") but ptrain reads it";
      refused_by_both += !a;
      continue;
    }
    if (!a) {
      ++refused;
      EXPECT_NE(why.find("adapter_config.json"), std::string::npos) << name << ": " << why;
      EXPECT_NE(name, "as saved") << why;
      continue;
    }
    ++read;
    std::set<std::tuple<std::string, int64_t, double>> got, want;
    const double scale = a->alpha / (a->rslora ? std::sqrt(static_cast<double>(a->rank)) : a->rank);
    auto adapted = [&](const std::string& t) { return std::count(a->targets.begin(), a->targets.end(), t) > 0; };
    for (int64_t l = 0; l < shape.n_layers; ++l)
      for (const auto& p : block_projections(shape))
        if (adapted(p.target)) got.emplace("model.layers." + std::to_string(l) + "." + p.module, a->rank, scale);
    if (adapted("output")) got.emplace("lm_head", a->rank, scale);
    for (const auto& m : v.at("modules"))
      want.emplace(m[0].get<std::string>(), m[1].get<int64_t>(), m[2].get<double>());
    EXPECT_EQ(got, want) << name;
  }
  std::printf(
      "[ adapter configs ] %zu variants: %d read as PEFT builds them, %d refused by ptrain, %d refused by both\n",
      fixture.at("variants").size(), read, refused, refused_by_both);
}

TEST(Peft, ImportMatchesPeftLogitsAndExportRoundTrips) {
  test::TempDir dir;
  const std::string base = test::fixture("hf_tiny"), peft = test::fixture("peft_tiny");
  test::small_config(dir);  // writes the corpus
  test::write_text(dir / "peft.toml",
                   "[model]\nhf_path = \"" + base + "\"\n[data]\npath = \"" + (dir / "corpus.txt") +
                       "\"\nseq_len = 24\n[training]\ndevice = \"cpu\"\n[lora]\nenabled = true\n"
                       "targets = [\"q\", \"v\", \"down\"]\nrank = 4\nalpha = 8.0\nadapter_path = \"" +
                       peft + "\"\n");
  Config c = load(dir / "peft.toml");
  auto m = build_model(c, at::kCPU, test::local_comm());
  SafetensorsFile expected(test::fixture("peft_tiny_expected.safetensors"));
  at::Tensor logits = m->logits(expected.tensor("tokens")).view({2, 24, 256});
  EXPECT_LE((logits - expected.tensor("logits")).abs().max().item<double>(), 1e-4);
  // Without the adapter the logits differ (the adapter is not a no-op).
  Config plain = load(dir / "peft.toml", {"lora.adapter_path=\"\""});
  EXPECT_GT((build_model(plain, at::kCPU, test::local_comm())->logits(expected.tensor("tokens")).view({2, 24, 256}) -
             expected.tensor("logits"))
                .abs()
                .max()
                .item<double>(),
            1e-3);

  // Export: train a LoRA checkpoint (small config), export it, compare files and reload.
  test::TempDir d2;
  Config t = load(test::small_config(d2), {"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"down\"]", "lora.rank=4",
                                           "training.steps=3", "optimizer.lr=1e-2"});
  ASSERT_EQ(train(t), 0);
  const std::string ck = d2 / "run/checkpoints/step_3";
  export_hf(ck, d2 / "peft");
  PeftAdapter a = read_peft(d2 / "peft", test::small_shape());
  EXPECT_EQ(a.rank, 4);
  EXPECT_EQ(a.alpha, 16.0);
  SafetensorsFile mine(d2 / "peft/adapter_model.safetensors"), theirs(peft + "/adapter_model.safetensors");
  std::set<std::string> mine_keys, their_keys;
  for (const auto& e : mine.entries()) mine_keys.insert(e.name);
  for (const auto& e : theirs.entries()) their_keys.insert(e.name);
  EXPECT_EQ(mine_keys, their_keys);  // the same modules at the same 2 layers: PEFT's key names
  Config back = load(test::small_config(d2), {"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"down\"]", "lora.rank=4",
                                              "lora.adapter_path=\"" + (d2 / "peft") + "\""});
  auto reloaded = build_model(back, at::kCPU, test::local_comm());
  SafetensorsFile saved(ck + "/model.rank0.safetensors");
  for (const auto& u : reloaded->trained_units())
    if (u.layout.numel > 0) {
      EXPECT_TRUE(at::equal(u.shard.detach(), saved.tensor(u.layout.name))) << u.layout.name;
    }
}

// export --merge: the adapters folded into the base (dense, or NF4 dequantized) give a plain
// HF model whose logits equal the adapted model's.
TEST(Lora, MergedExportEqualsTheAdaptedModel) {
  for (const std::string base : {"none", "nf4"}) {
    test::TempDir dir;
    Config c = load(test::small_config(dir),
                    {"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"o\",\"down\",\"output\"]", "lora.rank=4",
                     "training.steps=3", "optimizer.lr=1e-2", "quant.base=\"" + base + "\""});
    ASSERT_EQ(train(c), 0);
    const std::string ck = dir / "run/checkpoints/step_3";
    export_merged(ck, dir / "merged");
    auto adapted = build_model(c, at::kCPU, test::local_comm());
    TrainProgress progress;
    load_checkpoint(ck, *adapted, nullptr, progress);
    FsdpModel merged(test::plan(read_hf_config(dir / "merged")), PrecisionPolicy{}, at::kCPU, test::local_comm());
    load_weights(merged, HfCheckpoint(dir / "merged").by_name());
    at::manual_seed(4);
    at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
    at::Tensor want = adapted->logits(tokens), got = merged.logits(tokens);
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-4) << base;
    // and the adapters did move the model away from its base
    auto fresh = build_model(load(test::small_config(dir), {"quant.base=\"none\""}), at::kCPU, test::local_comm());
    if (base == "none") {
      EXPECT_GT((fresh->logits(tokens) - want).abs().max().item<double>(), 1e-3);
    }
  }
}

// PEFT loads adapter_model.bin where a directory has no adapter_model.safetensors (the file PEFT
// wrote before 0.6, and with safe_serialization=False since): tests/fixtures/peft_tiny_bin is
// PEFT 0.21.2's save of peft_tiny's adapter so, read to the same tensors, bit for bit.
TEST(Peft, AnAdapterModelBinIsReadAsItsSafetensors) {
  const LlamaShape shape = read_hf_config(test::fixture("hf_tiny"));
  const PeftAdapter st = read_peft(test::fixture("peft_tiny"), shape);
  const PeftAdapter bin = read_peft(test::fixture("peft_tiny_bin"), shape);
  ASSERT_EQ(bin.tensors.size(), st.tensors.size());
  ASSERT_FALSE(st.tensors.empty());
  for (const auto& [name, t] : st.tensors) {
    ASSERT_TRUE(bin.tensors.count(name)) << name;
    EXPECT_TRUE(at::equal(bin.tensors.at(name), t)) << name;
  }
}
