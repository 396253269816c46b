#!/usr/bin/env bash
# Packaging check: build the sdist and the wheel, then install each in a fresh virtual
# environment and smoke-test it there, away from the source tree:
#   1. without torch: `import replay` works and `import torch` fails (replay needs only numpy
#      and cffi), an ArrayQueue put/get and a ReplayBuffer add/sample round trip;
#   2. with torch and the [train] extra: a short `a3c train cartpole` (the shipped config,
#      found by name inside the installed package), then `a3c eval` on its run folder.
# Run from the repository root, with `build` installed (the [test] extra):
#   bash scripts/check_dist.sh
# Exits non-zero at the first failure; its temporary folders are removed either way.
set -euo pipefail

TORCH="torch==2.13.0"  # the pin README.md installs (a CPU build)
STEPS=2000             # env steps of the training smoke test

repo=$(pwd)
if [[ ! -f "$repo/pyproject.toml" || ! -f "$repo/configs/cartpole.yaml" ]]; then
    echo "check_dist: run from the repository root (bash scripts/check_dist.sh)" >&2
    exit 2
fi
if ! python -m build --version >/dev/null 2>&1; then
    echo "check_dist: the 'build' package is missing; pip install -e \".[test]\"" >&2
    exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/check_dist.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The smoke tests must import the installed copy, never the source tree's.
unset PYTHONPATH

say() { printf '\n==> %s\n' "$*"; }
passed=0  # checks passed so far; a failure exits at once

# Run a command with its output in a log, shown only if the command fails.
quietly() {
    if ! "$@" >"$work/log" 2>&1; then
        tail -n 60 "$work/log"
        echo "check_dist: FAILED: $*" >&2
        return 1
    fi
}

start=$SECONDS
say "build the sdist, then the wheel from the sdist (python -m build)"
quietly python -m build --outdir "$work/dist" "$repo"
sdist=$(echo "$work"/dist/*.tar.gz)
wheel=$(echo "$work"/dist/*.whl)
ls -l "$work/dist"
passed=$((passed + 1))

say "the sdist holds what compiling the C core needs, and no stress-test file"
tar tzf "$sdist" > "$work/sdist.txt"
for f in setup.py pyproject.toml native/build_rq.py native/rq.c native/rq.h native/rb.c native/rb.h \
         native/atomic64.h native/common.h native/rqpy_glue.h native/rqpy.cdef; do
    grep -qx "[^/]*/$f" "$work/sdist.txt" || { echo "check_dist: the sdist lacks $f" >&2; exit 1; }
done
if grep -E '/native/stress' "$work/sdist.txt"; then
    echo "check_dist: the sdist holds stress-test files (above)" >&2
    exit 1
fi
echo "ok"
passed=$((passed + 1))

say "the wheel holds the compiled C core"
python -m zipfile -l "$wheel" | grep -E 'replay/_rq[^/]*\.so' \
    || { echo "check_dist: the wheel has no replay/_rq*.so" >&2; exit 1; }
passed=$((passed + 1))

smoke() {  # smoke ARTIFACT NAME
    local artifact=$1 name=$2
    local env="$work/venv-$name" cwd="$work/cwd-$name"
    mkdir -p "$cwd"

    say "[$name] fresh virtual environment; pip install $(basename "$artifact")"
    python -m venv "$env"
    quietly "$env/bin/python" -m pip install "$artifact"

    say "[$name] without torch: import replay, ArrayQueue put/get, ReplayBuffer add/sample"
    (cd "$cwd" && "$env/bin/python" - <<'EOF'
import sys

import numpy as np

import replay
from replay import ArrayQueue, ReplayBuffer

assert "site-packages" in replay.__file__, f"replay imported from {replay.__file__}"
try:
    import torch  # noqa: F401
except ImportError:
    pass
else:
    sys.exit("torch is installed here; this check needs an environment without it")
assert "torch" not in sys.modules

record = [("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4")]
with ArrayQueue(16, record) as q:
    q.put((np.arange(4), 3, 0.5))
    got = q.get(timeout=1.0)
    assert got["obs"].tolist() == [0, 1, 2, 3] and got["action"] == 3 and got["reward"] == 0.5, got
    assert q.empty()

buf = ReplayBuffer(64, record)
items = np.zeros(10, buf.dtype)
items["action"] = np.arange(10)
items["obs"] = np.arange(10)[:, None]
assert buf.add_many(items) == 0 and len(buf) == 10
sample = buf.sample(32, rng=np.random.default_rng(0))
assert len(sample) == 32 and set(sample["action"].tolist()) <= set(range(10)), sample
assert (sample["obs"] == sample["action"][:, None]).all(), "a torn record"
buf.close()
print(f"ok: replay from {replay.__file__}, no torch")
EOF
    )
    passed=$((passed + 1))

    say "[$name] pip install $TORCH, then the [train] extra"
    quietly "$env/bin/python" -m pip install "$TORCH"
    quietly "$env/bin/python" -m pip install "$artifact[train]"
    "$env/bin/python" -c 'import torch; print("torch", torch.__version__)'

    say "[$name] a3c train cartpole, $STEPS steps, then a3c eval"
    (cd "$cwd" && "$env/bin/a3c" train cartpole "total_timesteps=$STEPS" \
        "logging.run_root=$work/runs-$name" logging.progress=false checkpoint.interval_s=0)
    local run_dir
    run_dir=$(echo "$work/runs-$name"/cartpole-*)
    for f in config.yaml checkpoint.pt; do
        [[ -f "$run_dir/$f" ]] || { echo "check_dist: the run folder lacks $f" >&2; exit 1; }
    done
    passed=$((passed + 1))
    (cd "$cwd" && "$env/bin/a3c" eval "$run_dir" --episodes 2)
    passed=$((passed + 1))
    rm -rf "$env"  # one environment on disk at a time
}

smoke "$sdist" sdist
smoke "$wheel" wheel

say "dist check done in $((SECONDS - start)) s"
# The closing line in the plain form CI reads after a test run.
echo "check_dist: $passed passed, 0 failed"
