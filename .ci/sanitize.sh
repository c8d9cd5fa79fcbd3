#!/usr/bin/env bash
# The sanitizer job (issue 24): the C extensions built with AddressSanitizer and
# UndefinedBehaviorSanitizer in a venv of their own, then the native-code tests, a bounded fuzz
# of every C entry point (fuzz/native_fuzz.py) and a bounded atheris run (optimised build)
# whose corpus is replayed under the sanitizers (fuzz/replay.py). Any sanitizer report
# aborts the process (-fno-sanitize-recover=all, halt_on_error): the job fails.
#
# The build is made in a copy of the checkout (the editable install of the main venv keeps its
# own optimised .so files). --system-site-packages: torch and the other test oracles are not
# reinstalled. Python itself is not built with ASan, so libasan is preloaded; leak detection is
# off (the interpreter keeps its objects until exit, which ASan would call leaks).
#
# Env: SANITIZE_DIR (work folder, default a temporary one), NATIVE_FUZZ_SECONDS (default 60),
# ATHERIS_SECONDS (per harness, default 8), ATHERIS_SEED (libFuzzer's, default 24: a CI failure can be
# run again; set another to explore). About 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
WORK="${SANITIZE_DIR:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
mkdir -p "$WORK"
echo "sanitize: building in $WORK"

# a copy of the tracked sources (and the work tree's edits), no build products
rm -rf "$WORK/src"
mkdir -p "$WORK/src"
git ls-files -z --cached --others --exclude-standard | \
    (cd "$ROOT" && xargs -0 cp --parents -t "$WORK/src" 2>/dev/null || true)
rm -f "$WORK"/src/tensorscope/*.so

"$PY" -m venv --system-site-packages "$WORK/venv"
VPY="$WORK/venv/bin/python"
# The test oracles come from the environment that runs this script (CI's venv, which a venv made
# from it would not see: --system-site-packages reaches only the base interpreter's). A plain
# path in a .pth file adds that folder without running its .pth files, so the optimised
# editable install there stays out and the sanitized one below is what imports.
PARENT_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$VPY" -c 'import sys, sysconfig, os; open(os.path.join(sysconfig.get_paths()["purelib"], "_parent_env.pth"), "w").write(sys.argv[1] + "\n")' "$PARENT_SITE"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
(cd "$WORK/src" && CFLAGS="-O1 -g $SAN" LDFLAGS="$SAN" \
    "$VPY" -m pip install -q --no-deps --no-build-isolation -e . )

LIBASAN="$(gcc -print-file-name=libasan.so)"
LIBUBSAN="$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONDONTWRITEBYTECODE=1
run() { LD_PRELOAD="$LIBASAN $LIBUBSAN" "$VPY" "$@"; }

# Every extension must be the sanitized build, and loaded (not silently the Python twins).
(cd "$WORK/src" && run - <<'PY'
import tensorscope, tensorscope.diffing as d
from tensorscope.parsers import pickle_vm, torch_pickle, zipfmt  # noqa: F401 (binds the steps)
import tensorscope._diffkernel as k, tensorscope._torchstep as t, tensorscope._zipscan as z
import tensorscope._stheader as h, tensorscope._jsonrows as j, tensorscope._groupscan as g
from tensorscope import grouping, model
from tensorscope.parsers import safetensors
assert d._KERNEL is not None and pickle_vm._STEP is not None and zipfmt._SCAN is not None
assert safetensors._HEADER is not None and model._ROWS_C is not None and grouping._SCAN is not None
for m in (k, t, z, h, j, g):
    assert m.__file__.startswith(tensorscope.__path__[0]), m.__file__
print("sanitize: extensions loaded from", tensorscope.__path__[0])
PY
)

cd "$WORK/src"
start=$(date +%s)
# --capture=sys: a sanitizer report goes to file descriptor 2, which pytest then leaves alone
run -m pytest -q -x -p no:cacheprovider -o addopts="" --capture=sys \
    tests/test_native_ub.py tests/test_torchstep.py tests/test_zipscan.py \
    tests/test_zip_fast_paths.py tests/test_vm_torch_step.py tests/test_diff_where.py \
    tests/test_listing_only.py tests/test_stats_kernel.py tests/test_diff_sample.py \
    tests/test_stheader.py tests/test_jsonrows.py tests/test_groupscan.py \
    --deselect tests/test_torchstep.py::test_attack_corpus_every_way
# (that one runs the whole attack corpus through three VM modes: 190 s of the job's 5 minutes
# under ASan; the zip scan reads the same corpus under ASan in test_zipscan.py, the main suite
# runs it optimised, and native_fuzz.py fuzzes the torch step under ASan)
echo "sanitize: native tests took $(( $(date +%s) - start )) s"

start=$(date +%s)
run fuzz/native_fuzz.py --seconds "${NATIVE_FUZZ_SECONDS:-60}" --seed "${NATIVE_FUZZ_SEED:-24}"
echo "sanitize: native fuzz took $(( $(date +%s) - start )) s"

# atheris: coverage-guided, in the optimised build ("$PY", whose editable install is the checkout):
# with libasan preloaded into an interpreter not linked with libFuzzer, the sanitizer runtime
# provides the coverage symbols, so libFuzzer sees no coverage and traced comparisons slow down as
# a run goes on (see fuzz/replay.py). Every input it kept is then replayed under ASan+UBSan.
start=$(date +%s)
for harness in listing diffkernel zipfmt pickle_vm; do
    corpus="$WORK/corpus-$harness"
    mkdir -p "$corpus"
    rc=0
    (cd "$WORK" && "$PY" "$ROOT/fuzz/fuzz_$harness.py" "$corpus" \
        -max_total_time="${ATHERIS_SECONDS:-8}" -seed="${ATHERIS_SEED:-24}" -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1) > "$WORK/atheris-$harness.log" 2>&1 || rc=$?
    grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|cov: [0-9]+" \
        "$WORK/atheris-$harness.log" | tail -3 | sed "s/^/sanitize: atheris $harness: /"
    findings="$(ls "$WORK"/crash-* "$WORK"/timeout-* "$WORK"/oom-* 2>/dev/null || true)"
    if [ "$rc" -ne 0 ]; then
        tail -40 "$WORK/atheris-$harness.log"
        echo "sanitize: atheris $harness failed (exit $rc); inputs: $findings"
        exit 1
    fi
    run fuzz/replay.py "$harness" "$corpus" | sed "s/^/sanitize: under ASan+UBSan: /"
done
echo "sanitize: atheris and the replays took $(( $(date +%s) - start )) s"
echo "sanitize: no sanitizer report"
