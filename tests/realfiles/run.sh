#!/usr/bin/env bash
# realfiles.compare: the real-files corpus (made once, cached under ~/.cache/ptrain/realfiles or
# $PTRAIN_REALFILES, like the torch venv), then ptrain against transformers on every set of it.
#   bash tests/realfiles/run.sh PYTHON PTRAIN_BIN
set -euo pipefail
py=$1 bin=$2
here=$(cd "$(dirname "$0")" && pwd)
corpus=${PTRAIN_REALFILES:-${XDG_CACHE_HOME:-$HOME/.cache}/ptrain/realfiles}
mkdir -p "$(dirname "$corpus")"
# one maker at a time per corpus: two clones testing at once must not race
(flock 9; "$py" "$here/make_corpus.py" "$corpus") 9>"$corpus.lock"
"$py" "$here/compare.py" "$bin" "$corpus"
