#!/bin/sh
# refs.sh - every file the repository names is in the repository: FAILS,
# printing `FILE:LINE: names X, which the repository does not have`, for
# each reference to a file that is not there.
#
# Scanned: every tracked file (git ls-files, untracked files that git does
# not ignore included) when the source tree is a git checkout; in a tarball
# (make distcheck: no .git) the sources under top_srcdir, less what
# autotools generate and the build trees.
#
# A reference is
#   - a name ending in .md, .c, .h, .sh, .py, .proto, .am, .ac, .cu or .map,
#     or a path ending in /README, that holds a '/' (a path: protocol/wire.h,
#     $(top_srcdir)/test/e2e/lib.sh) or ends in .md (README.md, SECURITY.md);
#     a bare source name (ops.c) is left alone, as are #include lines (the
#     compiler checks those), absolute paths (/usr/..., /proc/...), names
#     after '<' (system headers), globs, placeholders in capitals
#     (interposer/FOLDER/NAME.c) and "a.c/b.c" alternatives;
#   - in a .md file, the target of a link `](target)` that is no URL.
# A path is found relative to the referencing file's folder or any folder
# above it up to the root, or as the tail of a path the repository has
# (checkpoint/carry.c); a link's target only relative to its file's folder.
# A path after a variable ($srcdir/lib.sh, $(top_srcdir)/x.c) is checked the
# same way when the variable names the source tree (srcdir, top, top_srcdir);
# after any other variable (a scratch directory) it is left alone.
#
# The allowlist below holds the few names that are not this repository's
# files: CRIU's and the CUDA toolkit's sources, paths of an installed
# system, of the GPU suite's bundle, and files made at build or run time.
# Run by `make check` with top_srcdir set; by hand: top_srcdir=. sh test/unit/refs.sh
set -u
: "${top_srcdir:?run through make check}"
cd "$top_srcdir" || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# Each line: an ERE the name must match, optionally preceded by an ERE the
# referencing file's path must match. Keep it short; a stale reference
# belongs fixed, not listed here. In order: CRIU's sources and its zdtm
# runner; the CUDA toolkit's header; the Linux kernel's headers in its
# source tree; paths of an installed system
# (debian/*.install); the GPU suite's bundle as unpacked on the GPU machine
# (test/gpu/bundle.sh); dist-complete.sh's scratch repository; where older
# revisions kept the carrier, which pipeline-compare.sh builds.
cat >"$tmp/allow" <<'EOF'
^(criu|plugins)/
(^|/)zdtm\.py$
^include/cuda\.h$
^include/(linux|net|uapi)/
^usr/
^(bundle|\.device/bundle)/
^test/unit/dist-complete\.sh$ ^sub/b\.sh$
^test/carrier/pipeline-compare\.sh$ ^interposer/carrier\.c$
EOF

if command -v git >/dev/null 2>&1 && git rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
	[ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then
	git ls-files -co --exclude-standard >"$tmp/list" || exit 1
	how="git checkout"
else
	find . -type f \
		! -path './_build/*' ! -path './_inst/*' ! -path './build*' ! -path './autom4te.cache/*' \
		! -path './build-aux/*' ! -path './m4/*' ! -path './debian/build/*' ! -path '*/.deps/*' \
		! -path '*/.libs/*' ! -name Makefile.in ! -name Makefile ! -name configure ! -name aclocal.m4 \
		! -name config.h.in ! -name '*.o' ! -name '*.lo' ! -name '*.la' ! -name '*.so' ! -name '*.log' \
		! -name '*.trs' ! -name '*.tar.*' | sed 's|^\./||' | sort >"$tmp/list"
	how="source tree (no git checkout)"
fi
# Existing files only (a tracked file deleted in the working tree is gone).
while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done <"$tmp/list" >"$tmp/files"
[ -s "$tmp/files" ] || { echo "FAIL: found no file to scan under $top_srcdir"; exit 1; }
# Text files only.
tr '\n' '\0' <"$tmp/files" | xargs -0 grep -Il '' >"$tmp/text" 2>/dev/null

awk -v allowf="$tmp/allow" -v filesf="$tmp/files" '
function dirof(p) { return (p ~ /\//) ? substr(p, 1, match(p, /\/[^\/]*$/) - 1) : "" }
# join a folder and a relative path, resolving "." and ".."; "" when it
# climbs above the root
function join(d, t,    n, i, parts, out, k, m, res) {
	n = split((d == "" ? "" : d "/") t, parts, "/")
	k = 0
	for (i = 1; i <= n; i++) {
		if (parts[i] == "" || parts[i] == ".")
			continue
		if (parts[i] == "..") {
			if (k == 0)
				return ""
			k--
			continue
		}
		out[++k] = parts[i]
	}
	res = ""
	for (m = 1; m <= k; m++)
		res = res (m > 1 ? "/" : "") out[m]
	return res
}
function exists(p) { return p != "" && (p in have) }
function found(d, t,    p, c) {
	p = d
	while (1) {
		c = join(p, t)
		if (exists(c))
			return 1
		if (p == "")
			break
		p = dirof(p)
	}
	sub(/^(\.\.?\/)+/, "", t)
	return (t ~ /\//) && (("/" t) in tail)
}
function allowed(f, t,    i) {
	for (i = 1; i <= nallow; i++)
		if (t ~ atok[i] && (afile[i] == "" || f ~ afile[i]))
			return 1
	return 0
}
function report(f, n, t) {
	if (allowed(f, t) || ((f, n, t) in said))
		return
	said[f, n, t] = 1
	printf "%s:%d: names %s, which the repository does not have\n", f, n, t
	bad++
}
BEGIN {
	while ((getline l < allowf) > 0) {
		if (l == "")
			continue
		nallow++
		if (split(l, w, " ") == 2) {
			afile[nallow] = w[1]
			atok[nallow] = w[2]
		} else
			atok[nallow] = l
	}
	while ((getline l < filesf) > 0) {
		have[l] = 1
		p = l
		while (p ~ /\//) {
			have[dirof(p)] = 1
			p = dirof(p)
		}
		q = l
		while (q ~ /\//) {
			q = substr(q, index(q, "/") + 1)
			tail["/" q] = 1
		}
		tail["/" l] = 1
	}
	RE = "(\\$\\{?[A-Za-z_][A-Za-z0-9_]*\\}?|\\$\\([A-Za-z_][A-Za-z0-9_]*\\)|@[A-Za-z_]+@)?[A-Za-z0-9_.+-]*(/[A-Za-z0-9_.+-]+)*(\\.(md|c|h|sh|py|proto|am|ac|cu|map)|/README)"
	LINK = "\\]\\([^)]+\\)"
}
FNR == 1 { d = dirof(FILENAME); md = (FILENAME ~ /\.md$/) }
{
	line = $0
	if (line ~ /^[ \t]*#[ \t]*include[ \t]*[<"]/)
		next
	if (md) {
		s = line
		while (match(s, LINK)) {
			t = substr(s, RSTART + 2, RLENGTH - 3)
			s = substr(s, RSTART + RLENGTH)
			sub(/[ \t].*$/, "", t)
			sub(/#.*$/, "", t)
			if (t == "" || t ~ /^[a-z]+:/ || t ~ /^\//)
				continue
			if (!exists(join(d, t)) && !exists(join(d, t "/")))
				report(FILENAME, FNR, t)
		}
	}
	s = line
	pre = ""
	while (match(s, RE)) {
		t = substr(s, RSTART, RLENGTH)
		before = (RSTART > 1) ? substr(s, RSTART - 1, 1) : pre
		after = substr(s, RSTART + RLENGTH, 2)
		pre = substr(t, length(t), 1)
		s = substr(s, RSTART + RLENGTH)
		# a longer name (x.conf, x.h.in, x.c~) or a glob, a system header
		if (after ~ /^[A-Za-z0-9_*~]/ || after ~ /^\.[A-Za-z0-9_]/ || before ~ /[*<]/)
			continue
		var = ""
		if (t ~ /^[$@]/) {
			match(t, /^(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\$\([A-Za-z_][A-Za-z0-9_]*\)|@[A-Za-z_]+@)/)
			var = substr(t, 1, RLENGTH)
			t = substr(t, RLENGTH + 1)
			if (var !~ /srcdir|^\$\{?top\}?$|^\$\(top\)$/)
				continue
			sub(/^\/+/, "", t)
		} else if (t ~ /^\//)
			continue # an absolute path: a system file
		if (t !~ /\// && t !~ /\.md$/)
			continue # a bare source name
		if (t ~ /(^|\/)\.(md|c|h|sh|py|proto|am|ac|cu|map)$/ || t ~ /(^|\/)\.\.?$/)
			continue # no name before the extension: the tail of a glob
		if (t ~ /(^|\/)[A-Z][A-Z_]+\// || t ~ /\/[A-Z][A-Z_]+\.[a-z]+$/)
			continue # a placeholder (OUTDIR/run.sh, FOLDER/NAME.c)
		if (t ~ /\.(md|c|h|sh|py|proto|am|ac|cu|map)\//)
			continue # alternatives: forked.sh/bench.sh
		if (!found(d, t))
			report(FILENAME, FNR, t)
	}
}
END { exit bad > 0 }
' $(cat "$tmp/text") >"$tmp/out"
status=$?
if [ $status != 0 ] || [ -s "$tmp/out" ]; then
	cat "$tmp/out"
	echo "FAIL: $(wc -l <"$tmp/out") reference(s) to files the repository does not have ($how)"
	exit 1
fi
echo "PASS: every file named in $(wc -l <"$tmp/text") files of the $how is there"
exit 0
