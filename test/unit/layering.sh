#!/bin/sh
# layering.sh - the interposer's modules call and include each other without
# cycles, and so do the carrier's files: FAILS, printing the cycle, when
# module A uses module B and B (directly or through others) uses A.
#
# A module is one name: interposer/FOLDER/NAME.c and NAME.h (or a header
# in interposer/ itself). Calls come from the built objects of
# libcuinterpose.so (nm: the global symbols each object defines and the
# ones it leaves undefined; an undefined symbol that another module defines
# is an arrow to that module); includes come from the `#include "x.h"`
# lines of the interposer's .c and .h files (an arrow to the module of x.h
# when the interposer has x.h). On success it prints the floors: floor 1
# uses no other module, floor n uses only floors below n.
#
# The folders show the floors (interposer/README.md): core/ (and the
# public header beside the folders) at the bottom, kinds/ and checkpoint/
# on it, entry/ on top. FAILS, printing the arrow, when a module calls or
# includes one of a folder above its own, or when kinds/ and checkpoint/
# use each other: the checkpoint machinery reaches a kind only through its
# slice and its record extension, and a kind never calls the machinery.
# Run by `make check` with top_srcdir and top_builddir set; by hand:
#   top_srcdir=.. top_builddir=. sh ../test/unit/layering.sh   (in a build dir)
set -u
: "${top_srcdir:?run through make check}"
: "${top_builddir:?run through make check}"
src=$top_srcdir/interposer
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# ---- arrows ----------------------------------------------------------------

# symbols DIR LIB OUT: "D module symbol" and "U module symbol" lines of
# the objects of libtool library LIB built under DIR (under .libs/ when
# libtool builds PIC ones there, else beside the sources), one module per
# object; fails the check when there are fewer than two.
symbols() {
	local n=0 o m
	find "$1" -name "$2_la-*.o" >"$tmp/objs"
	grep -q '/\.libs/' "$tmp/objs" && grep '/\.libs/' "$tmp/objs" >"$tmp/objs2" && mv "$tmp/objs2" "$tmp/objs"
	: >"$3"
	while read -r o; do
		[ -f "$o" ] || continue
		m=${o##*/"$2"_la-}
		m=${m%.o}
		n=$((n + 1))
		nm -P -g --defined-only "$o" | awk -v m="$m" '{ print "D", m, $1 }' >>"$3" || exit 1
		nm -P -u "$o" | awk -v m="$m" '{ print "U", m, $1 }' >>"$3" || exit 1
	done <"$tmp/objs"
	if [ "$n" -lt 2 ]; then
		echo "FAIL: no objects of $2 under $1 (build it first; or the build layout changed and this check must follow)"
		exit 1
	fi
}
symbols "$top_builddir/interposer" libcuinterpose "$tmp/syms"
# "from to via" for every call arrow.
awk '$1 == "D" { if ($3 in def && def[$3] != $2) dup[$3] = def[$3] " and " $2; def[$3] = $2; next }
     $1 == "U" && ($3 in def) && def[$3] != $2 { print $2, def[$3], $3 }
     END { for (s in dup) print "DUP", s, dup[s] > "/dev/stderr" }' \
	"$tmp/syms" "$tmp/syms" >"$tmp/calls" 2>"$tmp/dups"
if [ -s "$tmp/dups" ]; then
	echo "FAIL: symbols defined by two modules:"
	sed 's/^DUP /  /' "$tmp/dups"
	exit 1
fi

# "module folder" for every source and header ("." beside the folders).
for f in "$src"/*.h "$src"/*/*.c "$src"/*/*.h; do
	[ -f "$f" ] || continue
	d=${f%/*}
	d=${d#"$src"}
	d=${d#/}
	m=${f##*/}
	echo "${m%.*} ${d:-.}"
done | sort -u >"$tmp/folders"
for f in "$src"/*.h "$src"/*/*.c "$src"/*/*.h; do
	[ -f "$f" ] || continue
	m=${f##*/}
	m=${m%.*}
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r h; do
		t=${h##*/}
		t=${t%.h}
		grep -q "^$t " "$tmp/folders" || continue
		[ "$t" = "$m" ] || echo "$m $t ${f##*/}:$h"
	done
done >"$tmp/includes"

# ---- cycles ----------------------------------------------------------------

# Reads "from to via" lines; prints each strongly connected set of two or
# more modules with one cycle through it, arrow by arrow with what ties it;
# otherwise the floors. Exit status 1 on a cycle.
cycles()
{
	awk -v what="$1" '
	{
		if (!(($1, $2) in edge)) {
			edge[$1, $2] = 1
			adj[$1] = adj[$1] " " $2
			via[$1, $2] = $3
		} else if (index(" " via[$1, $2] " ", " " $3 " ") == 0 && nvia[$1, $2]++ < 3)
			via[$1, $2] = via[$1, $2] " " $3
		node[$1] = node[$2] = 1
	}
	function strong(v,    n, i, w, ws) {
		idx[v] = low[v] = ++counter
		stack[++sp] = v
		on[v] = 1
		n = split(adj[v], ws, " ")
		for (i = 1; i <= n; i++) {
			w = ws[i]
			if (!(w in idx)) {
				strong(w)
				if (low[w] < low[v])
					low[v] = low[w]
			} else if (on[w] && idx[w] < low[v])
				low[v] = idx[w]
		}
		if (low[v] == idx[v]) {
			nscc++
			do {
				w = stack[sp--]
				on[w] = 0
				scc[w] = nscc
				size[nscc]++
			} while (w != v)
		}
	}
	# A shortest cycle through s inside its set (breadth first).
	function cycle(s,    q, h, t, v, n, i, ws, w, prev, seen, path, c) {
		h = 1; t = 0
		q[++t] = s
		while (h <= t) {
			v = q[h++]
			n = split(adj[v], ws, " ")
			for (i = 1; i <= n; i++) {
				w = ws[i]
				if (scc[w] != scc[s])
					continue
				if (w == s) {
					path = ""
					c = v
					while (c != s) {
						path = c " " path
						c = prev[c]
					}
					path = s " " path s
					return path
				}
				if (!(w in seen)) {
					seen[w] = 1
					prev[w] = v
					q[++t] = w
				}
			}
		}
		return s
	}
	function floor_of(v,    n, i, ws, f, best) {
		if (v in fl)
			return fl[v]
		best = 0
		n = split(adj[v], ws, " ")
		for (i = 1; i <= n; i++) {
			f = floor_of(ws[i])
			if (f > best)
				best = f
		}
		fl[v] = best + 1
		return fl[v]
	}
	END {
		for (v in node)
			if (!(v in idx))
				strong(v)
		bad = 0
		for (v in node) {
			if (size[scc[v]] < 2 || (scc[v] in shown))
				continue
			shown[scc[v]] = 1
			bad = 1
			members = ""
			for (w in node)
				if (scc[w] == scc[v])
					members = members " " w
			printf "FAIL: %s cycle between%s:\n", what, members
			n = split(cycle(v), p, " ")
			for (i = 1; i < n; i++)
				printf "  %s -> %s (%s)\n", p[i], p[i + 1], via[p[i], p[i + 1]]
		}
		if (bad)
			exit 1
		top = 0
		for (v in node)
			if (floor_of(v) > top)
				top = floor_of(v)
		printf "%s: no cycles; floors, top first:\n", what
		for (f = top; f >= 1; f--) {
			k = 0
			for (v in node)
				if (fl[v] == f)
					at[++k] = v
			for (i = 2; i <= k; i++)
				for (j = i; j > 1 && at[j] < at[j - 1]; j--) {
					t = at[j]; at[j] = at[j - 1]; at[j - 1] = t
				}
			line = ""
			for (i = 1; i <= k; i++)
				line = line " " at[i]
			printf "  %2d:%s\n", f, line
		}
	}'
}

# ---- folders ---------------------------------------------------------------

rank() {
	case $1 in
	. | core) echo 0 ;;
	kinds | checkpoint) echo 1 ;;
	entry) echo 2 ;;
	*) echo 9 ;;
	esac
}
sort -u "$tmp/calls" "$tmp/includes" | while read -r from to via; do
	ff=$(awk -v m="$from" '$1 == m { print $2; exit }' "$tmp/folders")
	ft=$(awk -v m="$to" '$1 == m { print $2; exit }' "$tmp/folders")
	[ "$ff" = "$ft" ] && continue
	if [ "$(rank "$ff")" = 9 ] || [ "$(rank "$ft")" = 9 ]; then
		echo "FAIL: $from ($ff) -> $to ($ft): a folder this check does not know ($via)"
	elif [ "$(rank "$ft")" -gt "$(rank "$ff")" ]; then
		echo "FAIL: $from in $ff/ uses $to in $ft/, a folder above it ($via)"
	elif [ "$ff" != "$ft" ] && [ "$(rank "$ff")" = 1 ] && [ "$(rank "$ft")" = 1 ]; then
		echo "FAIL: $from in $ff/ uses $to in $ft/: the kinds and the checkpoint machinery name each other ($via)"
	fi
done >"$tmp/folder-arrows"
cat "$tmp/folder-arrows"

status=0
[ -s "$tmp/folder-arrows" ] && status=1
for what in call include; do
	if [ $what = call ]; then list=$tmp/calls; else list=$tmp/includes; fi
	sort -u "$list" | cycles $what >"$tmp/out"
	cat "$tmp/out"
	grep -q '^FAIL' "$tmp/out" && status=1
done

# ---- the carrier -------------------------------------------------------------

# carrier/ calls one way too: carrier.c (the public save and load) calls
# the engine (pipeline.c) and the sides (save.c, load.c), the sides call
# the engine, and the engine reaches a side's worker only through a
# pointer. Its call arrows, from libcuipcarrier's objects, must not close
# a cycle.
symbols "$top_builddir/carrier" libcuipcarrier "$tmp/csyms"
awk '$1 == "D" { def[$3] = $2; next }
     $1 == "U" && ($3 in def) && def[$3] != $2 { print $2, def[$3], $3 }' "$tmp/csyms" "$tmp/csyms" |
	sort -u | cycles "carrier call" >"$tmp/out"
cat "$tmp/out"
grep -q '^FAIL' "$tmp/out" && status=1
exit $status
