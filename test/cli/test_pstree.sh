#!/bin/sh
# test_pstree.sh: CRIU's pstree.img through the reader `cuinterpose restore`
# uses (cli/cli_pstree.c, run alone as cli/pstreeread). Images are written
# here byte by byte in CRIU's framing (two magic words, then per process a
# 32-bit size and a pstree entry): threads unpacked as CRIU writes them and
# packed, then every way the framing or an entry can be cut short or
# damaged. Each damaged image is exit 1 and one line naming the file and
# what is wrong with it, never a crash; restore says the same before any
# criu runs. No root or CRIU needed (test_pstree_criu.sh reads a real one).
set -u
rd=$CUIP_PSTREEREAD
cli=$CUIP_CLI
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-pstree.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; cat "$T/out"; exit 1; }

# Octal bytes (dash's printf has no \x).
magic='\031\103\126\124\060\060\047\120' # 0x54564319 0x50273030, little-endian
# pid 100, ppid 0, pgid 100, sid 100, threads [100]: 10 bytes
e1='\012\000\000\000\010\144\020\000\030\144\040\144\050\144'
# pid 101, ppid 100, pgid 100, sid 100, threads [101, 102] unpacked: 12 bytes
e2='\014\000\000\000\010\145\020\144\030\144\040\144\050\145\050\146'
# the same entry with threads packed (field 5, length-delimited)
e2p='\014\000\000\000\010\145\020\144\030\144\040\144\052\002\145\146'

# good FILE: decodes to the tree above
good() {
	"$rd" "$T/$1" >"$T/out" 2>&1 || fail "$1 does not decode"
	[ "$(cat "$T/out")" = "root 100 sid 100 entries 2
ids 100 101 102" ] || fail "$1 decodes to something else"
}
# bad FILE WHY: exit 1 (no signal) and the one line naming FILE and WHY
bad() {
	"$rd" "$T/$1" >"$T/out" 2>&1
	rc=$?
	[ $rc = 1 ] || fail "$1: exit $rc, expected 1"
	[ "$(cat "$T/out")" = "pstreeread: $T/$1: $2" ] || fail "$1: expected 'pstreeread: $T/$1: $2'"
}

printf "$magic$e1$e2" >"$T/tree.img"
good tree.img
printf "$magic$e1$e2p" >"$T/packed.img"
good packed.img

: >"$T/empty.img"
bad empty.img "Invalid argument: 0 bytes, short of the 8 of its magic words"
printf '\031\103\126\124\060' >"$T/five.img"
bad five.img "Invalid argument: 5 bytes, short of the 8 of its magic words"
printf 'not an image' >"$T/text.img"
bad text.img "Invalid argument: magic 0x20746f6e 0x69206e61, not a pstree image's (0x54564319 0x50273030)"
printf "$magic" >"$T/magic.img"
bad magic.img "Invalid argument: no entry, no process tree"
printf "$magic\\012\\000" >"$T/halfsize.img"
bad halfsize.img "Invalid argument: entry 1 at byte 8: 2 bytes left, short of its 4-byte size"
head -c 30 "$T/tree.img" >"$T/cut.img"
bad cut.img "Invalid argument: entry 2 at byte 22: size 12 runs past the end, 4 bytes left"
printf "$magic$e1$e2\\001\\002\\003" >"$T/tail.img"
bad tail.img "Invalid argument: entry 3 at byte 38: 3 bytes left, short of its 4-byte size"
printf "$magic\\377\\377\\377\\377" >"$T/huge.img"
bad huge.img "Invalid argument: entry 1 at byte 8: size 4294967295 runs past the end, 0 bytes left"
printf "$magic\\003\\000\\000\\000\\377\\377\\377" >"$T/garbage.img"
bad garbage.img "Invalid argument: entry 1 at byte 8: 3 bytes that do not decode as a pstree entry"
# a pid alone: the entry's other fields are required
printf "$magic\\002\\000\\000\\000\\010\\144" >"$T/pidonly.img"
bad pidonly.img "Invalid argument: entry 1 at byte 8: 2 bytes that do not decode as a pstree entry"
printf "$magic$e1\\003\\000\\000\\000\\010\\145\\020" >"$T/cutentry.img"
bad cutentry.img "Invalid argument: entry 2 at byte 22: 3 bytes that do not decode as a pstree entry"
printf "$magic\\010\\000\\000\\000\\010\\000\\020\\000\\030\\000\\040\\000" >"$T/pid0.img"
bad pid0.img "Invalid argument: the root's pid is 0"
truncate -s 17M "$T/big.img" || fail "truncate"
bad big.img "File too large: 17825792 bytes, more than a pstree image holds (16777216)"
bad none.img "No such file or directory"
mkdir "$T/dir.img"
"$rd" "$T/dir.img" >"$T/out" 2>&1
[ $? = 1 ] || fail "a directory as pstree.img: not exit 1"
grep -qx "pstreeread: $T/dir.img: Invalid argument: not a regular file" "$T/out" ||
	fail "a directory as pstree.img: no line saying it"

# restore names the file and what is wrong before criu runs
mkdir "$T/ck"
: >"$T/cuinterpose_plugin.so"
cp "$T/cut.img" "$T/ck/pstree.img"
"$cli" restore --libdir "$T" --criu /bin/true "$T/ck" >"$T/out" 2>&1
[ $? = 1 ] || fail "restore of a cut pstree.img: not exit 1"
grep -qx "cuinterpose restore: cannot read $T/ck/pstree.img: Invalid argument: entry 2 at byte 22: size 12 runs past the end, 4 bytes left; is $T/ck a criu image directory?" "$T/out" ||
	fail "restore of a cut pstree.img: no line naming it"
echo "PASS: pstree.img decoded, and each damaged one named"
