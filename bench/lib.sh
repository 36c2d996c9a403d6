# Shared by the bench drivers (sourced): paths, and the model/batch of a ptrain config as
# ptrain itself resolves it (`ptrain check`), so a reference trains exactly the same thing.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ptrain/venv-torch-2.11.0}"
BIN="${PTRAIN_BUILD:-$ROOT/build}/ptrain"; PY="$VENV/bin/python"
[ -x "$BIN" ] || { echo "build first: launch/setup.sh" >&2; exit 1; }
"$PY" -c "import transformers" 2>/dev/null || "$VENV/bin/pip" install -q transformers==5.23.0

# read_config CONFIG [--set k=v ...]: sets DIM LAYERS HEADS KV FFN VOCAB THETA TIED BATCH SEQ MODE AC,
# and LORA (enabled), LORA_RANK LORA_ALPHA LORA_DROPOUT LORA_TARGETS (comma-separated) QUANT DOUBLE_QUANT
read_config() {
  local check; check=$(mktemp)
  "$BIN" check --config "$@" > "$check"
  # (a shape read from model.hf_path is printed as "# (from hf_path) key = value")
  val() { sed 's/^# (from hf_path) //' "$check" | awk -v s="[$1]" -v k="$2" '$0==s{f=1;next} /^\[/{f=0} f && $1==k {print $3}' |
          tr -d "\"'"; }
  DIM=$(val model dim); LAYERS=$(val model n_layers); HEADS=$(val model n_heads); KV=$(val model n_kv_heads)
  FFN=$(val model ffn_dim); VOCAB=$(val model vocab_size); THETA=$(val model rope_theta)
  TIED=$(val model tie_embeddings); BATCH=$(val data micro_batch_size); SEQ=$(val data seq_len)
  MODE=$(val precision mode); AC=$(val memory activation_checkpointing)
  LORA=$(val lora enabled); LORA_RANK=$(val lora rank); LORA_ALPHA=$(val lora alpha); LORA_DROPOUT=$(val lora dropout)
  LORA_TARGETS=$(awk '$0=="[lora]"{f=1;next} /^\[/{f=0} f && $1=="targets" {sub(/^[^=]*= */, ""); print}' "$check" |
                 tr -d "[]'\" ")
  QUANT=$(val quant base); DOUBLE_QUANT=$(val quant double_quant)
  rm -f "$check"
}
