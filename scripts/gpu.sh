#!/usr/bin/env bash
# make gpu: the CUDA path on a machine with a GPU and a CUDA build of PyTorch, in one command (its builds included;
# over 10 minutes on an H100 with every model). Each part prints its figures as JSON lines, gathered in
# $GPU_OUT/benchmarks.jsonl (out/gpu by default) beside each part's log. GPU_MODELS="resnet vit ..." times those
# models only (default: all of benchmarks/models.py's), GPU_ZOO=0 leaves out the zoo on CUDA, GPU_TIMED="models ..."
# times those parts only (of mish, mish_no_graphs, models_full, models, norms, mish_python): a shorter run.
# GPU_FULL="gpt2_block bert_layer" (the default) names the models also built and timed at their full sizes
# (benchmarks/models.py --size full: batch 8, 8x128x768 for a layer), against eager and torch.compile; "" none.
#
# A GPU machine that reaches no package index gets DaCe and what its image lacks from .whl/ (`make gpu-wheels`
# fills it where pip reaches one), installed beside its own Python's packages, never over them.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${GPU_OUT:-out/gpu}
JOBS=${GPU_JOBS:-$(nproc)}
read -ra MODELS <<<"${GPU_MODELS:-}"
ONLY=(${MODELS[@]:+--only "${MODELS[@]}"})
read -ra FULL <<<"${GPU_FULL-gpt2_block bert_layer}"
mkdir -p "$OUT_DIR"
: >"$OUT_DIR/benchmarks.jsonl"

if ! "$PY" -c "import dace" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "make gpu: DaCe is not installed for $PY and .whl/ holds no wheels (make gpu-wheels where pip reaches an index)" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dcnb-site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/dcnb-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# builds on local disk, and none in the background: on a GPU the steps' own builds are the CUDA builds
export DCNB_CACHE=${DCNB_CACHE:-/tmp/dcnb-cache} DCNB_CUDA_BUILD=0
"$PY" -c "import sys, torch; torch.cuda.is_available() or sys.exit('make gpu needs a GPU and a CUDA PyTorch')" || exit 2
"$PY" -c "
import json, torch, dace, numpy
print(json.dumps({'figure': 'machine', 'gpu': torch.cuda.get_device_name(), 'torch': torch.__version__,
                  'cuda': torch.version.cuda, 'dace': dace.__version__, 'numpy': numpy.__version__}))
" | tee -a "$OUT_DIR/benchmarks.jsonl"

FAILED="$OUT_DIR/failed"
: >"$FAILED"
# a part's JSON lines go to benchmarks.jsonl; a part that fails is named in $FAILED and the next one still runs
part() {
    local name=$1
    shift
    [[ " ${GPU_TIMED:-$name} " == *" $name "* ]] || return 0
    echo "== $name: $*" >&2
    local start=$SECONDS
    "$@" 2>>"$OUT_DIR/$name.err" | tee -a "$OUT_DIR/benchmarks.jsonl"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc in $((SECONDS - start)) s" >&2
    [ "$rc" = 0 ] || { echo "$name" >>"$FAILED"; tail -n 30 "$OUT_DIR/$name.err" >&2; }
}

# pytest over tests/gpu with N builds at a time: one JSON line of counts
tests() {
    local name=$1 jobs=$2
    shift 2
    echo "== $name" >&2
    local start=$SECONDS
    "$PY" -m pytest --gpu tests/gpu -q -p no:cacheprovider -n "$jobs" --junitxml="$OUT_DIR/$name.xml" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$OUT_DIR/$name.log" >&2
    [ "$rc" = 0 ] || echo "$name" >>"$FAILED"
    "$PY" -c "
import json, sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot().find('testsuite')
print(json.dumps({'figure': sys.argv[2], 'tests': int(s.get('tests')), 'failures': int(s.get('failures')),
                  'errors': int(s.get('errors')), 'skipped': int(s.get('skipped')), 'seconds': int(sys.argv[3])}))
" "$OUT_DIR/$name.xml" "$name" $((SECONDS - start)) | tee -a "$OUT_DIR/benchmarks.jsonl"
}

export DCNB_NATIVE_CUDA=1
# first what builds and checks, side by side on the machine's cores: the C++ call path against eager (a side
# stream, CUDA graphs replayed, cuBLAS and cuDNN), the model zoo on CUDA in eval and training mode, and the Hugging
# Face models' steps made for the timed run below
tests tests_path $((JOBS / 3)) -k "not zoo" &
[ "${GPU_ZOO:-1}" = 0 ] || tests tests_zoo $((JOBS / 2)) -k zoo &
GPU_TIMED= part models_build "$PY" benchmarks/models.py --device cuda --warm $((JOBS / 2)) --build-only "${ONLY[@]}" &
[ ${#FULL[@]} = 0 ] || GPU_TIMED= part models_full_build "$PY" benchmarks/models.py --device cuda --size full \
    --warm ${#FULL[@]} --build-only --only "${FULL[@]}" &
wait
# then what is timed, one at a time on a quiet machine, what has run least first: Mish 8x32x224x224
# forward+backward through the C++ path with CUDA graphs and without them, each one interleaved run against eager,
# torch.compile and torch.jit, then the models of GPU_FULL at their full sizes, their naive and best steps against
# eager and torch.compile (a model's process ended after 150 s), the models' at the test sizes against eager (120 s),
# the norms, and Mish from Python
MISH=(benchmarks/mish.py --device cuda --json --jit --budget 10 --recipe map_fusion,tasklet_fusion,simplify_algebra)
part mish "$PY" "${MISH[@]}"
part mish_no_graphs env DCNB_CUDA_GRAPHS=0 "$PY" "${MISH[@]}"
[ ${#FULL[@]} = 0 ] || part models_full "$PY" benchmarks/models.py --device cuda --size full --json --budget 1 \
    --timeout 150 --only "${FULL[@]}"
part models "$PY" benchmarks/models.py --device cuda --json --budget 1 --baselines torch --timeout 120 "${ONLY[@]}"
part norms "$PY" benchmarks/norms.py --device cuda --json --budget 5
part mish_python env DCNB_NATIVE=0 "$PY" "${MISH[@]}"

status=0
[ -s "$FAILED" ] && status=1
echo "make gpu: $([ $status = 0 ] && echo passed || echo FAILED); figures in $OUT_DIR/benchmarks.jsonl" >&2
exit $status
