#!/usr/bin/env bash
# ptrain setup: installs what the build needs when it is missing, then configures and builds.
# Idempotent: every step checks first and does nothing when already done.
#
#   launch/setup.sh              deps + tiny corpus + build the ptrain binary (Release, build/)
#   launch/setup.sh --tests      the same, plus the tests' reference clients, and build every test
#   launch/setup.sh --deps-only  deps (the tests' clients included) + tiny corpus, no build
#
# Environment:
#   PTRAIN_VENV     venv holding torch (default: ${XDG_CACHE_HOME:-~/.cache}/ptrain/venv-torch-2.11.0),
#                   shared by every clone so LibTorch (several GB) is installed once per machine.
#   PTRAIN_BUILD    build directory (default: build)
#   PTRAIN_BUILD_TYPE  CMake build type (default: Release)
#   PTRAIN_FUZZ=1   also install clang-14 + libFuzzer and build the fuzz targets (fuzz/,
#                   docs/fuzzing.md); ctest then runs their corpora and a short fuzzing smoke
set -euo pipefail

TORCH_VERSION=2.11.0
# pyarrow, whose wheel ships the Arrow/Parquet C++ libraries ptrain reads Parquet datasets with.
PY_BUILD_PACKAGES=(pyarrow==26.0.1)
# Reference clients for the tests (HF export round trips, PEFT adapters, bitsandbytes' 4-bit
# models and NF4 kernels, llama.cpp's gguf-py for GGUF exports — transformers' GGUF loader needs it
# too —, TRL's DPO and CPO trainers for the preference objectives, fixture scripts): installed by
# --tests and --deps-only.
PY_TEST_PACKAGES=(transformers==5.23.0 peft==0.21.2 safetensors==0.8.0 bitsandbytes==0.50.2 gguf==0.19.0 trl==1.16.0)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"
VENV="${PTRAIN_VENV:-$CACHE_HOME/ptrain/venv-torch-$TORCH_VERSION}"
BUILD_DIR="${PTRAIN_BUILD:-$ROOT/build}"
BUILD_TYPE="${PTRAIN_BUILD_TYPE:-Release}"
DEPS_ONLY=0
TESTS=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) DEPS_ONLY=1; TESTS=1 ;;
    --tests) TESTS=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

say() { printf '[setup] %s\n' "$*"; }

# --- 1. Debian packages --------------------------------------------------------------
APT_PACKAGES=(build-essential cmake ninja-build ccache pkg-config python3 python3-venv
              libtomlplusplus-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev
              openmpi-bin libopenmpi-dev libpcre2-dev libutf8proc-dev zlib1g-dev fortunes gnuplot-nox clang-format)
[ "${PTRAIN_FUZZ:-0}" = 1 ] && APT_PACKAGES+=(clang-14 libfuzzer-14-dev)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "Debian packages present"
fi

# --- 2. torch venv (outside the checkout, shared by every clone) ------------------------
mkdir -p "$(dirname "$VENV")"
torch_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<PY 2>/dev/null
import torch, sys
sys.exit(0 if torch.__version__.split('+')[0] == "$TORCH_VERSION" else 1)
PY
}
(
  # One installer at a time per venv: two clones set up concurrently must not race.
  flock 9
  if torch_ok; then
    say "torch $TORCH_VERSION present in $VENV"
  else
    say "installing torch==$TORCH_VERSION into $VENV (several GB, once per machine)"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy
    torch_ok || { echo "setup.sh: torch $TORCH_VERSION did not import from $VENV" >&2; exit 1; }
  fi
  # pyarrow for the build; with --tests, the reference clients the tests check ptrain against
  # (exports loaded back, fixtures).
  packages=("${PY_BUILD_PACKAGES[@]}")
  [ "$TESTS" = 1 ] && packages+=("${PY_TEST_PACKAGES[@]}")
  if "$VENV/bin/python" - <<PY 2>/dev/null
import sys, importlib.metadata as md
pins = {$(for p in "${packages[@]}"; do printf '"%s": "%s", ' "${p%%==*}" "${p##*==}"; done)}
sys.exit(0 if all(md.version(n) == v for n, v in pins.items()) else 1)
PY
  then
    say "python packages present: ${packages[*]}"
  else
    say "installing into $VENV: ${packages[*]}"
    "$VENV/bin/pip" install -q "${packages[@]}"
  fi
) 9>"$VENV.lock"

# --- 3. tiny corpus: English text from Debian's fortunes package, nothing downloaded -----
CORPUS="$ROOT/data/fortunes.txt"
if [ ! -s "$CORPUS" ]; then
  mkdir -p "$ROOT/data"
  # Every plain fortune file in a fixed order (strfile indexes *.dat and UTF-8 copies *.u8 skipped).
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 \
    | LC_ALL=C sort -z | xargs -0 cat > "$CORPUS.tmp"
  mv "$CORPUS.tmp" "$CORPUS"
  say "built $CORPUS ($(wc -c < "$CORPUS") bytes)"
fi

# --- 3b. tiny chat dataset for configs/tiny_chat_qlora.toml: generated, seeded -----------
CHATS="$ROOT/data/tiny_chat.jsonl"
if [ ! -s "$CHATS" ]; then
  python3 "$ROOT/launch/make_chat_data.py" "$CHATS.tmp" >/dev/null
  mv "$CHATS.tmp" "$CHATS"
  say "built $CHATS ($(wc -l < "$CHATS") chats)"
fi

# --- 3c. the same chats as ShareGPT Parquet, for configs/tiny_qwen_chat_qlora.toml (venv pyarrow)
SHAREGPT="$ROOT/data/tiny_chat_sharegpt.parquet"
if [ ! -s "$SHAREGPT" ]; then
  "$VENV/bin/python" "$ROOT/launch/make_chat_data.py" "$SHAREGPT.tmp.parquet" >/dev/null
  mv "$SHAREGPT.tmp.parquet" "$SHAREGPT"
  say "built $SHAREGPT"
fi

[ "$DEPS_ONLY" = 1 ] && exit 0

# --- 4. configure + build (incremental; ccache across clones) ---------------------------
FUZZ=OFF; [ "${PTRAIN_FUZZ:-0}" = 1 ] && FUZZ=ON
if [ ! -f "$BUILD_DIR/build.ninja" ] || ! grep -q "^PTRAIN_FUZZ:BOOL=$FUZZ$" "$BUILD_DIR/CMakeCache.txt"; then
  say "configuring $BUILD_DIR ($BUILD_TYPE, fuzz targets $FUZZ)"
  # LibTorch's CMake files warn about settings of theirs that do not apply here: the output is
  # kept in a log, and shown when configuring fails.
  mkdir -p "$BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DPTRAIN_VENV="$VENV" \
    -DPTRAIN_FUZZ="$FUZZ" >"$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log" >&2; exit 1; }
fi
# Without --tests only the binary: the first run waits for nothing it does not use.
if [ "$TESTS" = 1 ]; then
  say "building ptrain and every test (ninja, $(nproc) jobs)"
  cmake --build "$BUILD_DIR" -j "$(nproc)"
else
  say "building ptrain (ninja, $(nproc) jobs; launch/setup.sh --tests builds the tests too)"
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target ptrain
fi
say "done: $BUILD_DIR/ptrain"
