#!/usr/bin/env bash
# dist-complete.sh SRCDIR DISTDIR: every file git tracks in SRCDIR is in
# DISTDIR (make distcheck's unpacked tree), but for the few listed below
# that only matter to a git checkout. Without git, or outside a checkout
# (building from a tarball), there is nothing to compare: says so, exit 0.
set -euo pipefail
src=$1 dist=$2
# tracked files the tarball leaves out, each for a reason
not_shipped=(
	.gitignore # git's own
)

if ! command -v git >/dev/null || ! git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	echo "dist-complete: $src is not a git checkout: nothing to compare"
	exit 0
fi
missing=0
while IFS= read -r -d '' f; do
	for x in "${not_shipped[@]}"; do [ "$f" = "$x" ] && continue 2; done
	[ -e "$dist/$f" ] && continue
	echo "dist-complete: tracked but not in the tarball: $f"
	missing=$((missing + 1))
done < <(git -C "$src" ls-files -z)
if [ $missing != 0 ]; then
	echo "dist-complete: FAIL: $missing tracked file(s) missing from $dist: add them to an EXTRA_DIST"
	exit 1
fi
echo "dist-complete: every tracked file is in the tarball"
