#!/usr/bin/env bash
# kgrad on JAX on the GPU machine the device tool lends: plain fit against fit with a
# GradientProbe every 1, 10 and 100 steps, and with a NonFiniteGuard: ms/step and ratios
# (benchmarks/jax_overhead.py), beside the one-pass and read-once floors and the floor of any
# guard; then issue 53's depth sweep: the HLO fusions a probed step adds to MLPs of 4, 16 and
# 32 layers (benchmarks/depth_ops.py); each compiled step's memory per device, with and without
# XLA's region analysis in copy insertion (benchmarks/step_memory.py); then issue 52's sharded
# row: the same configurations on a transformer split over the machine's GPUs by ModelParallel
# (benchmarks/sharded.py), where it has two or more (with --quick: 2 simulated CPU devices).
#
# That machine has JAX (CUDA) and TensorBoard but not Keras: its wheels travel in .whl/.
#   here, once:   bash benchmarks/gpu_jax.sh fetch          (wheels for Python 3.12, x86-64)
#   the device:   run(command="bash benchmarks/gpu_jax.sh run", carry=[".whl"], timeout_s=540)
#   a CPU check:  bash benchmarks/gpu_jax.sh run --quick    (here, with the project's environment)
# Results: $OUT/gpu_jax.json and $OUT/gpu_jax.log (OUT defaults to /tmp). Under 8 minutes on
# an H200 for 3 models x 8 configurations x 5 pairs of 200 steps; issue 53 added the transformer,
# four configurations and the depth sweep (not timed on a GPU yet: give it timeout_s=600).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
out=${OUT:-/tmp}
case "$mode" in
fetch)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    mkdir -p .whl
    keras_version=$(python3 -c 'import keras; print(keras.__version__)')
    for package in "keras==$keras_version" namex optree google-crc32c; do
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .whl "$package"
    done
    ls -l .whl
    ;;
run)
    shift || true
    if [ -d .whl ] && ! python3 -c 'import keras' 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site
    fi
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" KERAS_BACKEND=jax PYTHONUNBUFFERED=1
    models=mlp,cnn,transformer,mobilenet pairs=5 steps=200 depths=4,16,32
    if [ "${1:-}" = "--quick" ]; then models=mlp pairs=1 steps=20 depths=2,4; fi
    python3 -c 'import jax; print("JAX devices:", jax.devices())'
    configs=baseline_aa,probe_n100,probe_n10,probe_n1,probe_linear_n1,guard,guard_floor
    configs=$configs,floor_one_pass_n10,floor_one_pass_n1,floor_read_once_n10,floor_read_once_n1
    python3 -m benchmarks.jax_overhead --models "$models" --pairs "$pairs" --steps "$steps" --configs "$configs" \
        --out "$out/gpu_jax.json" 2>&1 | grep -v -e '^I0000' -e '^WARNING: All log' | tee "$out/gpu_jax.log"
    python3 -m benchmarks.depth_ops --depths "$depths" 2>&1 | grep -v -e '^I0000' -e '^WARNING: All log' \
        | tee -a "$out/gpu_jax.log"
    # Per-device memory of each compiled step, with XLA's region analysis in copy insertion for
    # kgrad's steps as kgrad sets it (not on GPUs) and on (xla_gpu_copy_insertion_use_region_analysis).
    for region in auto on; do
        python3 -m benchmarks.step_memory --region-analysis "$region" --out "$out/gpu_jax_memory_$region.json" \
            2>&1 | grep -v -e '^I0000' -e '^WARNING: All log' | tee -a "$out/gpu_jax.log"
    done
    devices=$(python3 -c 'import jax; print(len(jax.devices()))')
    sharded=(--devices $((devices - devices % 2)) --pairs "$pairs" --steps 100)
    if [ "${1:-}" = "--quick" ]; then sharded=(--devices 2 --pairs 1 --steps 4 --width 32); fi
    if [ "${1:-}" = "--quick" ] || [ "$devices" -ge 2 ]; then
        python3 -m benchmarks.sharded "${sharded[@]}" --out "$out/gpu_jax_sharded.json" 2>&1 \
            | grep -v -e '^I0000' -e '^WARNING: All log' | tee -a "$out/gpu_jax.log"
    else
        echo "sharded row: $devices device(s), it needs 2 or more (benchmarks/sharded.py)" | tee -a "$out/gpu_jax.log"
    fi
    ;;
*)
    echo "usage: bash benchmarks/gpu_jax.sh fetch | run [--quick]" >&2
    exit 2
    ;;
esac
