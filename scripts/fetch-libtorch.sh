#!/usr/bin/env bash
# Obtains the C++ parts of libtorch from PyPI, for building cgt.torch where no PyTorch is installed
# (CI has none). Prints the prefix to put on CMAKE_PREFIX_PATH, or fails with a message.
#
# The wheel is the release the GPU machine runs (torch==2.11.0, CUDA 13.0). Only its headers,
# libraries and CMake config are unpacked. libtorch_cuda.so also needs three libraries that the
# wheel takes from other PyPI packages (cuSPARSELt, NVSHMEM, cuFile); they are fetched too and put
# beside it, so that binaries linked against it also start (and report GPU tests as skipped)
# on a machine without a GPU. Everything is cached (default ~/.cache/cgt): a second run downloads
# nothing.
#
#   prefix=$(scripts/fetch-libtorch.sh)   ->   cmake -DCMAKE_PREFIX_PATH="$prefix" ...
set -euo pipefail
version="${CGT_TORCH_VERSION:-2.11.0}"
cache="${CGT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cgt}"
prefix="$cache/libtorch-$version"
wheels="$cache/wheels"
extras=("nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5" "nvidia-cufile==1.15.1.6")

if [ -f "$prefix/.complete" ]; then
  echo "$prefix"
  exit 0
fi
mkdir -p "$wheels"
log="$cache/fetch-libtorch.log"
pip_download() {  # a bounded download: a missing registry must fail fast, not hang
  timeout 900 python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
    --timeout 30 --retries 2 -d "$wheels" "$@" >>"$log" 2>&1
}
if ! ls "$wheels"/torch-"$version"-*manylinux*x86_64.whl >/dev/null 2>&1; then
  echo "fetch-libtorch: downloading torch==$version from PyPI (about 530 MB, once)" >&2
  pip_download "torch==$version" || { echo "fetch-libtorch: could not download torch==$version (see $log)" >&2; exit 1; }
fi
for extra in "${extras[@]}"; do
  name="${extra%%==*}"
  if ! ls "$wheels"/"${name//-/_}"-*.whl >/dev/null 2>&1; then
    echo "fetch-libtorch: downloading $extra (a runtime dependency of libtorch_cuda.so)" >&2
    pip_download "$extra" || { echo "fetch-libtorch: could not download $extra (see $log)" >&2; exit 1; }
  fi
done

tmp="$prefix.partial"
rm -rf "$tmp"
mkdir -p "$tmp/lib"
wheel=$(ls "$wheels"/torch-"$version"-*manylinux*x86_64.whl | head -1)
unzip -q "$wheel" 'torch/include/*' 'torch/lib/*' 'torch/share/cmake/*' -x 'torch/lib/libtorch_python.so' -d "$tmp/unzip"
mv "$tmp/unzip/torch/include" "$tmp/include"
mv "$tmp/unzip/torch/share" "$tmp/share"
mv "$tmp/unzip/torch/lib/"* "$tmp/lib/"
for extra in "${extras[@]}"; do
  name="${extra%%==*}"
  unzip -q -o -j "$(ls "$wheels"/"${name//-/_}"-*.whl | head -1)" '*.so*' -d "$tmp/lib"
done
rm -rf "$tmp/unzip"
touch "$tmp/.complete"
rm -rf "$prefix"
mv "$tmp" "$prefix"
echo "$prefix"
