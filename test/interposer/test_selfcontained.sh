#!/bin/sh
# test_selfcontained.sh: libcuinterpose.so stands alone in a container image.
# Run by `make check` (test/interposer/Makefile.am, through run-test.sh).
# Asserts on the built library ($CUIP_LIB):
#  - its NEEDED entries are glibc's only (libc, libdl, libpthread, the
#    dynamic loader; the sanitizer runtimes too in a sanitizer build);
#  - the dynamic symbols it defines are exactly the global list of
#    interposer/libcuinterpose.map (nothing of protobuf-c or of our own
#    internals leaks, and nothing the map names is missing);
#  - every symbol it needs from outside comes versioned from glibc;
#  - it loads and resolves in a process whose library path holds nothing
#    but glibc (a private directory of glibc's own files).
# Paths come from AM_TESTS_ENVIRONMENT: CUIP_LIB, CUIP_MAP, CUIP_SAN_CFLAGS.
set -u
fail=0
err() {
	echo "FAIL: $*" >&2
	fail=1
}
for t in readelf nm; do
	command -v $t >/dev/null 2>&1 || {
		echo "SKIP: $t not found (binutils)" >&2
		exit 77
	}
done
[ -f "$CUIP_LIB" ] || {
	echo "FAIL: $CUIP_LIB not built" >&2
	exit 1
}
san=no
[ -n "${CUIP_SAN_CFLAGS:-}" ] && san=yes

# 1. NEEDED
needed=$(readelf -d "$CUIP_LIB" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || err "readelf -d $CUIP_LIB lists no NEEDED entry at all (libc expected)"
for n in $needed; do
	case $n in
	libc.so.6 | libdl.so.2 | libpthread.so.0 | ld-linux-x86-64.so.2 | ld-linux-aarch64.so.1) ;;
	libasan.so.* | libubsan.so.*) [ $san = yes ] || err "NEEDED $n in a build without sanitizers" ;;
	*) err "NEEDED $n: libcuinterpose.so must depend on glibc only" ;;
	esac
done
echo "NEEDED:" $needed

# 2. exported symbols == the version script's global list
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cuip-selfc.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
sed -e 's,/\*.*\*/,,g' "$CUIP_MAP" |
	awk '/^[ \t]*global:/ { g = 1; next } /^[ \t]*local:/ { g = 0 } g' |
	tr ';' '\n' | tr -d ' \t' | grep -v '^$' | sort -u >"$tmp/map"
[ -s "$tmp/map" ] || err "no global symbol parsed from $CUIP_MAP"
# Defined dynamic symbols, without the version-definition (A) entries.
nm -D --defined-only "$CUIP_LIB" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/exported"
if ! cmp -s "$tmp/map" "$tmp/exported"; then
	extra=$(comm -13 "$tmp/map" "$tmp/exported" | tr '\n' ' ')
	missing=$(comm -23 "$tmp/map" "$tmp/exported" | tr '\n' ' ')
	[ -n "$extra" ] && err "exported but not in $(basename "$CUIP_MAP"): $extra"
	[ -n "$missing" ] && err "in $(basename "$CUIP_MAP") but not exported: $missing"
fi
echo "exported: $(wc -l <"$tmp/exported") symbols, as the version script lists"
if nm "$CUIP_LIB" | grep -q ' protobuf_c_message_pack$'; then
	nm -D --defined-only "$CUIP_LIB" | grep -q protobuf_c && err "protobuf-c symbols are exported"
else
	nm -D "$CUIP_LIB" | grep -q 'U protobuf_c' && err "protobuf-c is resolved at run time, not linked in"
fi

# 3. every undefined symbol comes from glibc (versioned GLIBC_*), apart from
# the weak hooks every shared object carries and the sanitizer runtime.
nm -D --undefined-only "$CUIP_LIB" | awk '{ print $NF }' >"$tmp/undef"
while read -r s; do
	case $s in
	*@GLIBC_*) ;;
	__gmon_start__ | _ITM_deregisterTMCloneTable | _ITM_registerTMCloneTable) ;;
	__asan_* | __ubsan_* | __sanitizer_* | __lsan_*) [ $san = yes ] || err "undefined $s without sanitizers" ;;
	*) [ $san = yes ] || err "undefined symbol $s does not come from glibc" ;;
	esac
done <"$tmp/undef"

# 4. it loads where nothing but glibc exists: a chroot holding the dynamic
# loader, glibc's libraries, /bin/true and the interposer; ld.so binds every
# symbol at once (LD_BIND_NOW) and must print nothing. (ld.so always falls
# back to the system's library directories, so only a chroot proves this.)
if [ $san = no ] && [ "$(id -u)" -eq 0 ] && command -v chroot >/dev/null 2>&1; then
	libc=$(ldd /bin/true | sed -n 's/.*libc\.so\.6 => \([^ ]*\).*/\1/p')
	ldso=$(ldd /bin/true | sed -n 's,^[ \t]*\(/[^ ]*ld-linux[^ ]*\).*,\1,p')
	if [ -z "$libc" ] || [ -z "$ldso" ]; then
		err "cannot locate libc.so.6 / ld-linux through ldd /bin/true"
	else
		r=$tmp/root
		mkdir -p "$r/lib" "$r$(dirname "$ldso")"
		cp -L "$ldso" "$r$ldso"
		for f in libc.so.6 libdl.so.2 libpthread.so.0; do
			[ -e "$(dirname "$libc")/$f" ] && cp -L "$(dirname "$libc")/$f" "$r/lib/"
		done
		cp -L /bin/true "$r/true"
		cp -L "$CUIP_LIB" "$r/libcuinterpose.so"
		out=$(LD_BIND_NOW=1 chroot "$r" "$ldso" --library-path /lib --preload /libcuinterpose.so /true 2>&1)
		rc=$?
		[ $rc -eq 0 ] || err "/true with the preload in a glibc-only chroot: rc=$rc: $out"
		[ -z "$out" ] || err "the loader printed, in a glibc-only chroot: $out"
		out=$(chroot "$r" "$ldso" --library-path /lib --list /libcuinterpose.so 2>&1)
		echo "$out" | grep -q 'not found' && err "in a glibc-only chroot: $out"
		[ $fail -eq 0 ] && echo "loads in a glibc-only chroot"
	fi
else
	echo "(glibc-only chroot load not tried: needs root and a build without sanitizers)"
fi

[ $fail -eq 0 ] && echo "PASS: libcuinterpose.so is self-contained"
exit $fail
