// `ptrain eval`: the mean loss and perplexity of a model — the preset init, model.hf_path's
// weights or a checkpoint — over every consecutive non-overlapping seq_len+1 window of a text or
// token file (every row of a JSONL dataset), in order.
#pragma once
#include <string>
#include <vector>

namespace ptrain {

struct EvalRequest {
  std::string config;             // --config FILE
  std::vector<std::string> sets;  // --set overrides
  std::string checkpoint;         // --checkpoint DIR ("" : the config's own weights)
  std::string data;               // --data PATH ("" : data.path), recognised by content
  bool json = false;              // --json: one JSON line
};

int run_eval(const EvalRequest& request);  // the exit code

}  // namespace ptrain
