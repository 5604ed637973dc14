#!/bin/sh
# pstree-schema.sh - the schema the CLI decodes CRIU's pstree.img with
# (protocol/criu_pstree.proto, written for this project) agrees with CRIU's own
# description of the entry, field for field: number, label, type, name and
# packing. FAILS, printing both lists, on any difference (a field missing,
# renumbered, retyped, relabelled, or one CRIU added). CRIU's file is
# pstree.proto in the images folder of CRIU's source tree, kept by
# contrib/install-deps.sh in $CUINTERPOSE_CRIU_SRC (default
# /usr/local/src/criu-4.2.1); skips (exit 77) when that tree is absent.
# Run by `make check` with top_srcdir set.
set -u
: "${top_srcdir:?run through make check}"
src=${CUINTERPOSE_CRIU_SRC:-/usr/local/src/criu-4.2.1}
theirs=$src/images/pstree.proto
ours=$top_srcdir/protocol/criu_pstree.proto
[ -f "$theirs" ] || {
	echo "SKIP: no CRIU source tree with its images' schemas ($theirs; contrib/install-deps.sh keeps it)"
	exit 77
}
[ -f "$ours" ] || { echo "FAIL: $ours is missing"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# fields FILE MESSAGE: "NUMBER LABEL TYPE NAME packed|-" per field of
# MESSAGE, by number. Comments are dropped; one field per statement.
fields() {
	sed -e 's://.*$::' "$1" | tr '\n' ' ' | tr ';' '\n' | awk -v msg="$2" '
		{
			line = $0
			if (match(line, /message[ \t]+[A-Za-z0-9_]+[ \t]*\{/)) {
				head = substr(line, RSTART, RLENGTH)
				sub(/^message[ \t]+/, "", head)
				sub(/[ \t]*\{$/, "", head)
				inmsg = (head == msg)
				line = substr(line, RSTART + RLENGTH)
			}
			if (index(line, "}") && !match(line, /(required|optional|repeated)/))
				inmsg = 0
			if (!inmsg)
				next
			if (!match(line, /(required|optional|repeated)[ \t]+[A-Za-z0-9_.]+[ \t]+[A-Za-z0-9_]+[ \t]*=[ \t]*[0-9]+/))
				next
			f = substr(line, RSTART, RLENGTH)
			gsub(/=/, " = ", f)
			split(f, w, /[ \t]+/)
			packed = (line ~ /packed[ \t]*=[ \t]*true/) ? "packed" : "-"
			print w[5], w[1], w[2], w[3], packed
		}' | sort -n
}
fields "$theirs" pstree_entry >"$tmp/theirs"
fields "$ours" PstreeEntry >"$tmp/ours"
[ -s "$tmp/theirs" ] || { echo "FAIL: no field of pstree_entry found in $theirs"; exit 1; }
if ! cmp -s "$tmp/theirs" "$tmp/ours"; then
	echo "FAIL: protocol/criu_pstree.proto differs from CRIU's $theirs (number label type name packing):"
	diff "$tmp/theirs" "$tmp/ours" | sed 's/^</  CRIU:/; s/^>/  ours:/'
	exit 1
fi
echo "PASS: $(wc -l <"$tmp/ours") fields of pstree_entry agree with $theirs:"
sed 's/^/  /' "$tmp/ours"
