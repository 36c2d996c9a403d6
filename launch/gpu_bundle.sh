#!/usr/bin/env bash
# Gathers what a bare GPU machine lacks to build ptrain and run bench/gpu_checks.sh there, into a
# folder of the working tree that git ignores (docs/gpu.md). Such a machine has no network; it has
# a C++ compiler, nvcc, CMake, ninja and a python3 holding torch (never carried), but none of the
# Debian packages launch/setup.sh installs. The bundle holds:
#   debs/   those packages' .deb files (apt-get download), unpacked there with dpkg -x, and the
#           runtime libraries they link against that such an image may lack
#   data/   the datasets the checks' configs train on (setup builds them from Debian's fortunes)
#   py/site bitsandbytes (BNB_VERSION, PyPI's wheel unpacked) for the qlora stage's PEFT reference —
#           the one Python package that stage needs which the GPU machine's image lacks (it has
#           torch, transformers, peft and accelerate) — with only the CUDA 13.0 and CPU libraries of
#           its many builds (the image's torch is cu130): 4.3 MiB of the wheel's 41
#   MANIFEST  package versions and sizes
#
#   launch/gpu_bundle.sh [DIR]      (default: .gpu-bundle; the device tool carries it by that name)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu-bundle}"

# Headers and CMake/pkg-config files for the build, and the shared libraries ptrain then links:
# the dev packages of launch/setup.sh (build tools, test clients and formatters aside), their
# runtime libraries (libmpi's own: Open MPI's runtime, hwloc, libevent, udev), and pkg-config.
PACKAGES=(libtomlplusplus-dev libtomlplusplus3 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
          nlohmann-json3-dev libgtest-dev libopenmpi-dev libopenmpi3 openmpi-common libhwloc15
          libevent-core-2.1-7 libevent-pthreads-2.1-7 libudev1 libpcre2-dev libpcre2-8-0
          libutf8proc-dev libutf8proc2 zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3)
DATA=(fortunes.txt tiny_chat.jsonl tiny_chat_sharegpt.parquet)
BNB_VERSION=0.50.2   # the version the project's test clients pin (launch/setup.sh)
BNB_KEEP=(libbitsandbytes_cuda130.so libbitsandbytes_cpu.so)

say() { printf '[gpu_bundle] %s\n' "$*"; }
mib() { du -sb "$@" | awk '{s += $1} END {printf "%.1f", s / 1048576}'; }

for f in "${DATA[@]}"; do
  [ -s "$ROOT/data/$f" ] || { say "data/$f missing: running launch/setup.sh --deps-only"; "$ROOT/launch/setup.sh" --deps-only; break; }
done

rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp/debs" "$DIR.tmp/data"
(cd "$DIR.tmp/debs" && apt-get download "${PACKAGES[@]}" >/dev/null 2>&1) || {
  say "apt-get download failed; refreshing the package lists once"
  apt-get update -qq
  (cd "$DIR.tmp/debs" && apt-get download "${PACKAGES[@]}" >/dev/null)
}
for f in "${DATA[@]}"; do cp "$ROOT/data/$f" "$DIR.tmp/data/"; done
# bitsandbytes: the wheel is platform-tagged but holds no Python extension, so any python3 may
# download it; unpacked (site-packages layout, its dist-info included: transformers and peft ask
# importlib.metadata for its version), its other builds' libraries removed.
mkdir -p "$DIR.tmp/py/site" "$DIR.tmp/py/wheel"
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_24_x86_64 --python-version 3.12 \
  --implementation cp -d "$DIR.tmp/py/wheel" "bitsandbytes==$BNB_VERSION"
bnb_wheel=$(ls "$DIR.tmp"/py/wheel/bitsandbytes-"$BNB_VERSION"-*.whl)
python3 -m zipfile -e "$bnb_wheel" "$DIR.tmp/py/site"
for lib in "$DIR.tmp"/py/site/bitsandbytes/libbitsandbytes_*; do
  printf '%s\n' "${BNB_KEEP[@]}" | grep -qx "${lib##*/}" || rm -f "$lib"
done
for keep in "${BNB_KEEP[@]}"; do
  [ -s "$DIR.tmp/py/site/bitsandbytes/$keep" ] || { say "bitsandbytes $BNB_VERSION has no $keep"; exit 1; }
done
bnb_line="bitsandbytes $BNB_VERSION ${bnb_wheel##*/} sha256 $(sha256sum "$bnb_wheel" | cut -d' ' -f1), unpacked to py/site keeping ${BNB_KEEP[*]}"
rm -rf "$DIR.tmp/py/wheel"
{
  echo "# ptrain GPU bundle, made $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME") (glibc $(ldd --version | head -1 | awk '{print $NF}'))"
  echo "# highest glibc symbol version the bundled libraries need: $(
    tmp=$(mktemp -d); for d in "$DIR.tmp"/debs/*.deb; do dpkg-deb -x "$d" "$tmp"; done
    find "$tmp" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
    rm -rf "$tmp")"
  for d in "$DIR.tmp"/debs/*.deb; do
    echo "$(dpkg-deb -W --showformat='${Package} ${Version}' "$d") $(stat -c %s "$d") bytes"
  done
  for f in "${DATA[@]}"; do echo "data/$f $(stat -c %s "$DIR.tmp/data/$f") bytes"; done
  echo "py/site: $bnb_line, $(du -sb "$DIR.tmp/py/site" | cut -f1) bytes"
} > "$DIR.tmp/MANIFEST"
rm -rf "$DIR" && mv "$DIR.tmp" "$DIR"

tree_mib=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 |
           awk '{printf "%.1f", $1 / 1048576}')
say "$DIR: $(ls "$DIR/debs" | wc -l) packages ($(mib "$DIR/debs") MiB) + data ($(mib "$DIR/data") MiB) + bitsandbytes ($(mib "$DIR/py") MiB) = $(mib "$DIR") MiB"
say "what travels to the GPU machine: the working tree ($tree_mib MiB) + the bundle = $(
  awk -v a="$tree_mib" -v b="$(mib "$DIR")" 'BEGIN {printf "%.1f", a + b}') MiB of the 64 MiB allowed"
say "$(sed -n 2p "$DIR/MANIFEST" | sed 's/^# //')"
