#!/usr/bin/env bash
# Rehearses the GPU kit (launch/gpu_bundle.sh + bench/gpu_checks.sh, docs/gpu.md) on a machine
# without a GPU, as a bare GPU machine would run it: a clean clone of the committed tree plus the
# bundle, no network, and none of the Debian packages setup installs on the compiler's paths.
#   - a mount namespace holds an overlay of / in which every file of those packages (the bundle's
#     list, every -dev package but the C/C++ toolchain's own, pkg-config, ccache, Open MPI's
#     tools, the fortunes corpus) is deleted (an overlayfs whiteout); the checks run chrooted in it
#   - a network namespace with only a loopback device: nothing outside can be reached (the env
#     stage tries pypi.org and records the failure)
#   - the torch venv's python3 first on PATH, as the GPU machine's own python3 holds torch
# Needs root (namespaces, overlayfs). The CPU-runnable stages run; the GPU stages say "not run".
#
#   launch/gpu_rehearsal.sh [STAGE ...]     (default: every stage of bench/gpu_checks.sh)
#   results: the printed folder's out/gpu_results.md and out/gpu_logs.tgz
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ptrain/venv-torch-2.11.0}"
[ "$(id -u)" = 0 ] || { echo "gpu_rehearsal.sh: needs root (mount and network namespaces)" >&2; exit 1; }
[ -x "$VENV/bin/python3" ] || { echo "gpu_rehearsal.sh: no torch venv at $VENV (launch/setup.sh)" >&2; exit 1; }
[ -d "$ROOT/.gpu-bundle/debs" ] && [ -d "$ROOT/.gpu-bundle/py/site" ] || bash "$ROOT/launch/gpu_bundle.sh"
say() { printf '[gpu_rehearsal] %s\n' "$*"; }

W="$(mktemp -d /tmp/ptrain-gpu-rehearsal.XXXXXX)"
git clone -q "$ROOT" "$W/tree"
mkdir -p "$W/tree/.gpu-bundle"  # what launch/gpu_bundle.sh makes, and what is carried: nothing unpacked
cp -r "$ROOT/.gpu-bundle/debs" "$ROOT/.gpu-bundle/data" "$ROOT/.gpu-bundle/py" "$ROOT/.gpu-bundle/MANIFEST" "$W/tree/.gpu-bundle/"
mkdir -p "$W/upper" "$W/work" "$W/root" "$W/out"
say "clean tree: $(git -C "$W/tree" log -1 --format='%h %s' | cut -c1-80) + the bundle ($(du -sm "$W/tree/.gpu-bundle" | cut -f1) MiB)"

# What a bare GPU image does not have: the bundle's packages (but the base libraries every
# image has: zlib, udev, PCRE2's runtime), every installed -dev package but the toolchain's own,
# and the tools setup installs.
keep_dev='^(libc6-dev|linux-libc-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libcrypt-dev|libnsl-dev|libtirpc-dev|manpages-dev|dpkg-dev)$'
bundle_pkgs=$(for d in "$ROOT"/.gpu-bundle/debs/*.deb; do dpkg-deb -W --showformat='${Package}\n' "$d"; done)
mapfile -t hide < <(
  { dpkg-query -W -f '${Package}\n' | grep -E -- '-dev$' | grep -Ev "$keep_dev"
    echo "$bundle_pkgs" | grep -Ev '^(zlib1g|libudev1|libpcre2-8-0)$'
    dpkg-query -W -f '${Package}\n' | grep -E '^(openmpi-bin|ccache|pkg-config|pkgconf.*|fortunes.*|clang-format.*)$'
  } | sort -u | while read -r p; do dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && echo "$p"; done)
n=0
while read -r f; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  [ -d "$f" ] && continue  # directories (and links to them, like /lib) stay
  d="$(readlink -f "$(dirname "$f")")"  # /lib is /usr/lib here: whiteouts go where the files are
  [ -e "$W/upper$d/${f##*/}" ] && continue
  mkdir -p "$W/upper$d"
  mknod "$W/upper$d/${f##*/}" c 0 0 && n=$((n + 1))
done < <(dpkg -L "${hide[@]}" 2>/dev/null | sort -u)
say "hidden: $n files of ${#hide[@]} packages (e.g. $(printf '%s ' "${hide[@]:0:8}")...)"
printf '%s\n' "${hide[@]}" > "$W/out/hidden_packages.txt"

inner=$(cat <<EOF
set -uo pipefail
ip link set lo up
echo "network devices: \$(ip -o link | awk -F': ' '{print \$2}' | paste -sd' ')"
for h in /usr/include/spdlog/spdlog.h /usr/include/toml++/toml.h /usr/include/gtest/gtest.h /usr/bin/pkg-config /usr/bin/ccache /usr/bin/mpicc; do
  [ -e "\$h" ] && echo "NOT hidden: \$h" || echo "absent: \$h"
done
cd "$W/tree" && OUT="$W/out" bash bench/gpu_checks.sh $*
EOF
)
say "running bench/gpu_checks.sh ${*:-(every stage)} without network in the overlay root"
t0=$SECONDS
set +e
VENV="$VENV" unshare -m -n --fork bash -c '
  set -e
  W="$1"; shift
  mount -t overlay overlay -o "lowerdir=/,upperdir=$W/upper,workdir=$W/work" "$W/root"
  for d in dev proc sys; do mount --rbind "/$d" "$W/root/$d"; done
  for d in tree out; do mount --bind "$W/$d" "$W/root$W/$d"; done
  exec chroot "$W/root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH="$VENV/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" bash -c "$0"
' "$inner" "$W" 2>&1 | tee "$W/out/rehearsal.log"
rc=${PIPESTATUS[0]}
say "rc $rc after $((SECONDS - t0)) s; results: $W/out/gpu_results.md, logs: $W/out/gpu_logs.tgz, console: $W/out/rehearsal.log"
exit "$rc"
