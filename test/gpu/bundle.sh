#!/usr/bin/env bash
# Builds cuinterpose and collects what a GPU machine without a package
# registry needs to run the GPU validation: criu with its non-libc shared
# libraries, CRIU's cuda_plugin (baseline), our interposer, plugin, CLI and
# test workloads, all into one directory that travels with the run.
#
#   test/gpu/bundle.sh [OUTDIR]        (default: .device/bundle)
#
# Run it here (Debian 12); on the GPU machine run test/gpu/run.sh, which
# sets LD_LIBRARY_PATH to OUTDIR/lib. Nothing of the fake driver travels.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$top/.device/bundle}
build=$top/build-gpu

[ -x "$top/configure" ] || (cd "$top" && ./autogen.sh >/dev/null)
mkdir -p "$build"
cd "$build"
[ -f Makefile ] || "$top/configure" --quiet
make -j"$(nproc)" >/dev/null
make -j"$(nproc)" -C test check TESTS= >/dev/null # builds the workloads without running tests

rm -rf "$out"
mkdir -p "$out"/{bin,lib,plugins,baseline,workloads}

copy_libs() {
	# Every non-libc library the given binaries need (libc, libm, libdl,
	# libpthread, ld.so come from the GPU machine's newer glibc).
	ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | sort -u | while read -r l; do
		case "$(basename "$l")" in
		libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux*) ;;
		libcuda.so*) ;;
		*) cp -L "$l" "$out/lib/" ;;
		esac
	done
}

crt=$(command -v criu || echo /usr/local/sbin/criu)
cp "$crt" "$out/bin/criu"
copy_libs "$crt"
if [ -f /usr/local/lib/cuinterpose/baseline/cuda_plugin.so ]; then
	cp /usr/local/lib/cuinterpose/baseline/cuda_plugin.so "$out/baseline/"
fi
for f in interposer/.libs/libcuinterpose.so plugin/.libs/cuinterpose_plugin.so plugin/cuinterpose; do
	[ -e "$f" ] || continue
	case "$f" in
	*plugin.so) cp -L "$f" "$out/plugins/" ;;
	*.so) cp -L "$f" "$out/lib/" ;;
	*) cp -L "$(dirname "$f")/.libs/$(basename "$f")" "$out/bin/" 2>/dev/null || cp -L "$f" "$out/bin/" ;;
	esac
	copy_libs "$f"
done
find test -maxdepth 3 -type f -perm -u+x -path '*workloads*' ! -name '*.sh' | while read -r w; do
	real=$(dirname "$w")/.libs/$(basename "$w")
	[ -f "$real" ] && w=$real
	cp -L "$w" "$out/workloads/"
	copy_libs "$w"
done
cp -r "$top/test/gpu" "$out/scripts"
du -sh "$out"
