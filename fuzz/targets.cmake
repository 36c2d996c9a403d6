# The fuzz targets (fuzz/<name>.cpp builds fuzz_<name>): read by fuzz/CMakeLists.txt (to build
# them), the main CMakeLists.txt (their ctest entries) and fuzz/make_corpus.py (their seed folders).
set(PTRAIN_FUZZ_TARGETS safetensors tokenizer jsonl_record token_file checkpoint_meta config hf_index hf_config
    peft_config chat_template tokenizer_dir parquet json_array gguf torch_pickle)
