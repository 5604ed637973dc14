#!/bin/sh
# test_show_slab.sh: `cuinterpose show` of a shared slab of small cuMemAlloc
# pieces: the pieces and one carrier entry per live piece are printed and
# verified; a carrier entry at an offset where no piece lives, or a live
# piece without an entry, is what restore would refuse, and show says so
# (exit 1). Images from mkimages (the plugin's own writer).
set -u
cli=$CUIP_CLI
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-show.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; [ -f "$T/out" ] && cat "$T/out"; exit 1; }
show() { "$cli" show "$@" >"$T/out" 2>&1; echo $?; }
fresh() { rm -rf "$T/d" && mkdir "$T/d" && ./mkimages "$T/d" "$1" || fail "mkimages $1"; }
CARRIER=cuinterpose-carrier-100.img

fresh slab
[ "$(show "$T/d")" = 0 ] || fail "a good slab checkpoint is refused"
grep -q "origin malloc  creator this process" "$T/out" || fail "the slab's record"
grep -q "^    slab  2 pieces  4196 bytes in them" "$T/out" || fail "slab line"
grep -q "^      piece +0x2000  size 100$" "$T/out" || fail "piece line"
grep -q "1111111111111111:1 piece +0  $CARRIER  offset 0  size 4096  chunks 1 x 4096  checksums 1  OK" "$T/out" ||
	fail "carrier entry of the first piece"
grep -q "1111111111111111:1 piece +0x2000  $CARRIER  offset 4096  size 100  chunks 1 x 4096  checksums 1  OK" \
	"$T/out" || fail "carrier entry of the second piece"
grep -q "^OK: .* 4196 carrier bytes in 2 chunks match" "$T/out" || fail "summary"
[ "$(show "$T/d" --json)" = 0 ] || fail "--json of a good slab checkpoint"
for f in '"slab":true,"pieces":\[{"offset":0,"size":4096},{"offset":8192,"size":100}\]' '"piece_offset":8192'; do
	grep -q "$f" "$T/out" || fail "json lacks $f"
done

fresh slab-moved
[ "$(show "$T/d")" = 1 ] || fail "an entry of no live piece exits 0"
grep -q "restore would refuse: cuinterpose-100.img: carrier entry for 1111111111111111:1 holds 100 bytes at offset 0x2200, which is no live piece of that slab" "$T/out" ||
	fail "the misplaced entry is not named"

fresh slab-missing
[ "$(show "$T/d")" = 1 ] || fail "a piece without an entry exits 0"
grep -q "restore would refuse: cuinterpose-100.img: shared slab 1111111111111111:1 has 2 live pieces but 1 carrier entries" "$T/out" ||
	fail "the missing entry is not named"
echo PASS
