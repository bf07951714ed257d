#!/usr/bin/env bash
# Makes TensorFlow 2.21 importable with its GPU on a CUDA 13 machine that has
# no TensorFlow and no network (how the README's GPU numbers were taken).
#
# What it needs, carried in beforehand:
#   $STAGE/tf.tar.xz.*   the tensorflow wheel's tensorflow/ and dist-info
#                        (include/ dropped; lite/ must stay: tf.compat.v1
#                        imports it), tar | xz, split in parts (the
#                        transfer limit is per call)
#   .whl/*.whl           TF's pure-Python needs the machine lacks, numpy /
#                        protobuf / ml_dtypes at the versions tested here, and
#                        nvidia-cuda-runtime-cu12 (libcudart.so.12)
# The CUDA 12 math libraries TF 2.21 opens by name (cuBLAS 12, cuFFT 11, ...)
# are the machine's CUDA 13 ones under those names: cuBLAS keeps its C API
# across the two, and the correctness check below compares GPU matmuls with
# float64 numpy before anything is timed.
#
# Usage (on the GPU machine, in the repository root):
#   STAGE=/tmp/stage source bench/gpu_bootstrap.sh && python3 bench/gpu_step.py
set -u
STAGE=${STAGE:-/tmp/stage}
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE" "$SITE/cuda12"
if [ ! -f "$SITE/tensorflow/libtensorflow_cc.so.2" ]; then
  cat "$STAGE"/tf.tar.xz.* | xz -d -T0 | tar -x -C "$SITE" || return 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$SITE" .whl/*.whl || return 1
CU13=$(dirname "$(find /opt /usr/local /usr/lib -name 'libcublas.so.13*' \
  2>/dev/null | head -1)")
CUDNN=$(dirname "$(find /opt /usr/local /usr/lib -name 'libcudnn.so.9*' \
  2>/dev/null | head -1)")
NCCL=$(dirname "$(find /opt /usr/local /usr/lib -name 'libnccl.so.2*' \
  2>/dev/null | head -1)")
echo "gpu_bootstrap: CUDA 13 libraries in $CU13; cuDNN in $CUDNN; NCCL in $NCCL"
for pair in cublas:12:13 cublasLt:12:13 cufft:11:12 cusolver:11:12 \
            cusparse:12:12 curand:10:10 nvJitLink:12:13; do
  IFS=: read -r name want have <<<"$pair"
  src=$(ls "$CU13"/lib"$name".so."$have"* 2>/dev/null | head -1)
  [ -n "$src" ] && ln -sf "$src" "$SITE/cuda12/lib$name.so.$want"
done
export PYTHONPATH="$SITE:$PWD"
export LD_LIBRARY_PATH="$SITE/nvidia/cuda_runtime/lib:$SITE/cuda12:$CU13:$CUDNN:$NCCL:${LD_LIBRARY_PATH:-}"
CUDA_DIR=$(dirname "$(dirname "$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)")")
export XLA_FLAGS="--xla_gpu_cuda_data_dir=$CUDA_DIR ${XLA_FLAGS:-}"
export PATH="$CUDA_DIR/bin:$PATH"
echo "gpu_bootstrap: XLA_FLAGS=$XLA_FLAGS"
