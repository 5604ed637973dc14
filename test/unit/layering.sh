#!/bin/sh
# layering.sh - the interposer's modules call and include each other without
# cycles: FAILS, printing the cycle, when module A uses module B and B
# (directly or through others) uses A.
#
# A module is one name: interposer/NAME.c and interposer/NAME.h. Calls come
# from the built objects of libcuinterpose.so (nm: the global symbols each
# object defines and the ones it leaves undefined; an undefined symbol that
# another module defines is an arrow to that module); includes come from the
# `#include "x.h"` lines of interposer/*.c and *.h (an arrow to the module
# of x.h when interposer/x.h exists). On success it prints the floors: floor
# 1 uses no other module, floor n uses only floors below n.
#
# The checkpoint layer (the phase machine and what it runs for every kind:
# ops, inspect, carry, carrier) names no resource kind (vmm, ipc,
# multicast, pool, peer, ctx): it reaches them through their slices and
# record extensions only. FAILS, printing the arrow, when one of its
# modules calls or includes a kind's module.
# Run by `make check` with top_srcdir and top_builddir set; by hand:
#   top_srcdir=.. top_builddir=. sh ../test/unit/layering.sh   (in a build dir)
set -u
: "${top_srcdir:?run through make check}"
: "${top_builddir:?run through make check}"
src=$top_srcdir/interposer
objdir=$top_builddir/interposer/.libs
[ -d "$objdir" ] || objdir=$top_builddir/interposer
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# ---- arrows ----------------------------------------------------------------

nobj=0
for o in "$objdir"/libcuinterpose_la-*.o; do
	[ -f "$o" ] || continue
	m=${o##*/libcuinterpose_la-}
	m=${m%.o}
	nobj=$((nobj + 1))
	nm -P -g --defined-only "$o" | awk -v m="$m" '{ print "D", m, $1 }' >>"$tmp/syms" || exit 1
	nm -P -u "$o" | awk -v m="$m" '{ print "U", m, $1 }' >>"$tmp/syms" || exit 1
done
if [ "$nobj" -lt 2 ]; then
	echo "FAIL: no objects of libcuinterpose in $objdir (build it first; or the build layout changed and this check must follow)"
	exit 1
fi
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

for f in "$src"/*.c "$src"/*.h; do
	[ -f "$f" ] || continue
	m=${f##*/}
	m=${m%.*}
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r h; do
		[ -f "$src/$h" ] || continue
		t=${h##*/}
		t=${t%.h}
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

checkpoint=" ops inspect carry carrier "
kinds=" vmm ipc multicast pool peer ctx "
sort -u "$tmp/calls" "$tmp/includes" | while read -r from to via; do
	case "$checkpoint" in *" $from "*) ;; *) continue ;; esac
	case "$kinds" in *" $to "*) ;; *) continue ;; esac
	echo "FAIL: the checkpoint layer uses a resource kind: $from -> $to ($via)"
done >"$tmp/kinds"
cat "$tmp/kinds"

status=0
[ -s "$tmp/kinds" ] && status=1
for what in call include; do
	if [ $what = call ]; then list=$tmp/calls; else list=$tmp/includes; fi
	sort -u "$list" | cycles $what >"$tmp/out"
	cat "$tmp/out"
	grep -q '^FAIL' "$tmp/out" && status=1
done
exit $status
