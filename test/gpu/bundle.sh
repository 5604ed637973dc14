#!/usr/bin/env bash
# Builds cuinterpose and collects what a GPU machine without a package
# registry needs to run the GPU suite (run.sh), into one directory that
# travels with the run:
#
#   test/gpu/bundle.sh [OUTDIR]        (default: .device/bundle)
#   BUILD=DIR to use (or create) a configured build tree (default: build-gpu)
#
#   bin/        criu (with its non-libc shared libraries in lib/), the
#               cuinterpose CLI, contrib/bounded
#   lib/        libcuinterpose.so and every non-libc library of the above
#   plugins/    cuinterpose_plugin.so (alone: CRIU's -L directory)
#   baseline/   CRIU's upstream cuda_plugin.so (never beside ours)
#   workloads/  gpu_job, gpu_pool, gpu_microbench, facts-workload, fakecuda-ckpt,
#               cuda-checkpoint-shim, e2e_reaper (test/gpu/build.sh)
#   scripts/    test/gpu/*.sh and the sources they were built from (with
#               test/e2e/e2e_pool.c and the workload library test/workloads/wl.[ch])
#   BUILDINFO   commit, build tree (run.sh finds the fake driver there with FAKE=1)
#
# On the GPU machine: bash OUTDIR/scripts/run.sh --out DIR. Nothing of the
# fake driver travels; libcuda.so.1 comes from the machine.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$top/.device/bundle}
build=${BUILD:-$top/build-gpu}

[ -x "$top/configure" ] || (cd "$top" && ./autogen.sh >/dev/null)
mkdir -p "$build"
build=$(cd "$build" && pwd)
cd "$build"
[ -f Makefile ] || "$top/configure" --quiet
make -j"$(nproc)" >/dev/null
make -j"$(nproc)" -C test/fakecuda >/dev/null
make -j"$(nproc)" -C test/e2e e2e_reaper >/dev/null

rm -rf "$out"
mkdir -p "$out"/{bin,lib,plugins,baseline,workloads,scripts}
out=$(cd "$out" && pwd)

copy_libs() {
	# Every non-libc library the given binaries need (libc, libm, libdl,
	# libpthread, librt and ld.so come from the GPU machine's newer glibc;
	# libcuda from its driver).
	ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | sort -u | while read -r l; do
		case "$(basename "$l")" in
		libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so*) ;;
		*) [ -e "$out/lib/$(basename "$l")" ] || cp -L "$l" "$out/lib/" ;;
		esac
	done
}

crt=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
cp "$crt" "$out/bin/criu"
copy_libs "$crt"
base=/usr/local/lib/cuinterpose/baseline/cuda_plugin.so
if [ -f "$base" ]; then
	cp "$base" "$out/baseline/"
	copy_libs "$base"
else
	echo "bundle.sh: WARNING: no $base: the suite will skip the upstream baseline" >&2
fi
cp -L interposer/.libs/libcuinterpose.so "$out/lib/"
cp -L plugin/.libs/cuinterpose_plugin.so "$out/plugins/"
cp -L cli/cuinterpose "$out/bin/"
cp "$top/contrib/bounded" "$out/bin/" # every criu call of the suite is bounded
copy_libs interposer/.libs/libcuinterpose.so plugin/.libs/cuinterpose_plugin.so cli/cuinterpose

bash "$top/test/gpu/build.sh" "$build" "$out/workloads"
copy_libs "$out"/workloads/*
# What compress-bench dlopens (ldd cannot see it).
for l in libzstd.so.1 liblz4.so.1; do
	f=$({ /sbin/ldconfig -p || ldconfig -p || true; } 2>/dev/null | awk -v l="$l" '$1 == l && /x86-64/ && !f { f = $NF } END { print f }')
	if [ -n "$f" ]; then cp -L "$f" "$out/lib/"; else echo "bundle.sh: WARNING: no $l here: compress-bench will not run" >&2; fi
done
cp "$top"/test/gpu/*.sh "$top"/test/gpu/*.py "$top"/test/gpu/*.c "$top"/test/gpu/*.cu "$out/scripts/"
cp -r "$top/test/gpu/frameworks" "$out/scripts/"
cp "$top/test/e2e/e2e_pool.c" "$out/scripts/" # gpu_pool
cp "$top/test/e2e/procstate.sh" "$out/scripts/" # stat_state, live for run.sh and jobs.sh
cp "$top/test/workloads/wl.c" "$top/test/workloads/wl.h" "$out/scripts/" # the workloads' library
strip --strip-debug "$out"/bin/* "$out"/lib/* "$out"/plugins/* "$out"/workloads/* 2>/dev/null || true
{
	echo "commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$top" diff --quiet HEAD 2>/dev/null || echo -dirty)"
	echo "build=$build"
	echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
} >"$out/BUILDINFO"

# Nothing may be left unresolved on the GPU machine but libcuda.
missing=$(LD_LIBRARY_PATH=$out/lib ldd "$out"/bin/* "$out"/lib/*.so* "$out"/plugins/* "$out"/baseline/* \
	"$out"/workloads/* 2>/dev/null | grep "not found" | grep -v "libcuda.so" | sort -u || true)
if [ -n "$missing" ]; then
	echo "bundle.sh: unresolved libraries:" >&2
	echo "$missing" >&2
	exit 1
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1)), $(find "$out" -type f | wc -l) files, $(cat "$out/BUILDINFO" | head -n 1)"
