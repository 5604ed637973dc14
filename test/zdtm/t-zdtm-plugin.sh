#!/bin/bash
# t-zdtm-plugin.sh - CRIU's own test suite (zdtm) with and without the
# cuinterpose plugin loaded, as CRIU's CI does for its cuda plugin.
#
# Runs a subset of zdtm from the CRIU source tree that contrib/install-deps.sh
# keeps and builds (/usr/local/src/criu-4.2.1, or CUINTERPOSE_CRIU_SRC) up to
# three times: "plugin" (criu with
# `-L DIR`, DIR holding only the freshly built cuinterpose_plugin.so, passed
# through a --criu-bin wrapper; no CUDA driver, as on a host without one: the
# plugin declines) and "driver" (as "plugin", with the fake CUDA driver as
# the plugin's libcuda (CUINTERPOSE_LIBCUDA) and a private fakecuda-devd, as
# on a GPU node: the plugin asks the driver about every task, finds no CUDA
# process and declines), then, only when a test did not pass in those,
# "plain" (criu as zdtm runs it: zdtm points CRIU_LIBS_DIR at its own
# emptied test/plugins, so no plugin loads) to tell this machine's failures
# from the plugin's. It fails when a test failed with the plugin but not
# without it (table printed), when a plugin run's dump.log or restore.log
# lacks the plugin's init line, when the driver run did not load the driver,
# or when the plain run shows the plugin. Called by `make check` (test/zdtm/Makefile.am); one zdtm run at a
# time per CRIU tree (flock on test/.cuinterpose-zdtm.lock: zdtm writes into
# the tree). Skips (77) only when zdtm cannot run at all: not root, a
# sanitizer build (criu cannot dlopen an instrumented plugin), no built CRIU
# tree, no Debian python3 with protobuf and yaml.
#
# The matrix (test x flavor) is what runs as root on this machine kind,
# measured 2026-12-01 on kernel 6.18 with CRIU 4.1.1, and passing as a whole
# with 4.2.1 on 2026-12-02 (see README):
# - h, ns: only the tests zdtm runs as root (desc flag "suid"). The others run
#   as uid 18943 and fail at "CRIU dump" in h and ns with "Can't get rlimit 0:
#   Operation not permitted" (root here lacks CAP_SYS_RESOURCE); in uns they
#   run as root of a user namespace and pass.
# - maps01 and cow00 run only in h and ns, different_creds only in h (their
#   .desc files).
set -u

START=$(date +%s)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

: "${top_builddir:?run through make check}"
B=$(cd "$top_builddir" && pwd)
PLUGIN=$B/plugin/.libs/cuinterpose_plugin.so
FAKELIB=$B/test/fakecuda/.libs/libcuda.so.1
FAKERUN=$B/test/fakecuda/fakecuda-run
SRC=${CUINTERPOSE_CRIU_SRC:-/usr/local/src/criu-4.2.1}
ZT=$SRC/test
PY=/usr/bin/python3
# Debian's python3 and tools first: zdtm re-executes itself through
# `#!/usr/bin/env python3`, and another python3 on PATH may lack protobuf.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin:/usr/local/sbin

[ "$(id -u)" = 0 ] || skip "needs root for criu"
[ "${SANITIZE:-no}" = yes ] && skip "sanitizer build: criu cannot load an instrumented plugin"
[ -f "$ZT/zdtm.py" ] || skip "no CRIU source tree at $SRC (contrib/install-deps.sh keeps one; or set CUINTERPOSE_CRIU_SRC)"
[ -x "$SRC/criu/criu" ] || skip "criu is not built in $SRC (run contrib/install-deps.sh)"
[ -f "$ZT/zdtm/lib/libzdtmtst.a" ] && [ -x "$ZT/zdtm_ct" ] ||
	skip "zdtm is not built in $SRC (run contrib/install-deps.sh)"
[ -x "$PY" ] && "$PY" -c 'import google.protobuf, yaml' 2>/dev/null ||
	skip "$PY lacks google.protobuf or yaml (python3-protobuf, python3-yaml)"
[ -f "$PLUGIN" ] || fail "plugin not built ($PLUGIN)"
[ -f "$FAKELIB" ] && [ -x "$FAKERUN" ] || fail "fake driver not built ($FAKELIB)"

# flavor: tests (zdtm/static/ unless a directory is given)
MATRIX=(
	"h:maps01 cow00 sockets00 fd01 cmdlinenv00 caps00 groups fifo_upon_unix_socket00 different_creds"
	"ns:maps01 cow00 sockets00 fd01 cmdlinenv00 caps00 groups fifo_upon_unix_socket00"
	"uns:env00 maps00 pipe00 unlink_fstat00 pthread00 sigpending transition/fork sockets00 fd01 cmdlinenv00 caps00 groups fifo_upon_unix_socket00"
)
tname() { case $1 in */*) echo "zdtm/$1" ;; *) echo "zdtm/static/$1" ;; esac; }
for row in "${MATRIX[@]}"; do
	for t in ${row#*:}; do
		n=$(tname "$t")
		[ -x "$ZT/$n" ] || fail "zdtm test $n is not built in $ZT (see /var/cache/cuinterpose-deps/zdtm-build.log)"
	done
done

T=$(mktemp -d /tmp/cuip-zdtm.XXXXXX)
export FAKECUDA_SOCKET=$T/devd.sock
# zdtm sets vm.nr_hugepages to 20 and puts the old value back only when all
# its tests pass.
HUGEPAGES=$(cat /proc/sys/vm/nr_hugepages)
# zdtm makes two named cgroup-v1 hierarchies (zdtmtst, zdtmtst.defaultroot),
# each held by an empty group, and at its end removes the group and unmounts.
# On Linux 6.18 a hierarchy whose last group was removed just before the
# unmount outlives it: still listed in /proc/self/cgroup, mounted nowhere,
# and no longer mountable by name alone (EINVAL, "No subsys list or none
# specified"), which is how criu mounts it to dump a process whose cgroups
# differ from its own: every later --freeze-cgroup or container dump on the
# machine fails. drop_zdtm_cgroups mounts each one again (none,name=...),
# removes what is left in it and unmounts it, until none is listed; a
# hierarchy that stays (a process still in one of its groups) is named.
drop_zdtm_cgroups() {
	local d names n i
	d=$(mktemp -d /tmp/cuip-zdtm-cg.XXXXXX)
	for ((i = 0; i < 20; i++)); do
		names=$(sed -n 's/^[0-9]*:name=\(zdtmtst[^:]*\):.*/\1/p' /proc/self/cgroup)
		[ -z "$names" ] && break
		for n in $names; do
			mount -t cgroup -o "none,name=$n" zdtm "$d" 2>/dev/null || continue
			find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
			umount "$d"
		done
		sleep 0.1
	done
	rmdir "$d"
	[ -z "$names" ] && return 0
	echo "zdtm's cgroup-v1 hierarchies are still there after 20 tries to remove them:" $names
	return 1
}
cleanup() {
	drop_zdtm_cgroups >/dev/null
	"$FAKERUN" --stop >/dev/null 2>&1
	echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
mkdir -p "$T/plugins"
cp "$PLUGIN" "$T/plugins/cuinterpose_plugin.so"
# Each criu call is bounded (contrib/bounded, 180 s): a hung criu is named
# and killed instead of holding zdtm until its own limit.
BOUNDED="$(cd "$(dirname "$0")/../.." && pwd)/contrib/bounded 180"
printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$BOUNDED" "$SRC/criu/criu" >"$T/criu-plain"
printf '#!/bin/sh\nexec %s "%s" "$@" -L "%s"\n' "$BOUNDED" "$SRC/criu/criu" "$T/plugins" >"$T/criu-plugin"
printf '#!/bin/sh\nCUINTERPOSE_LIBCUDA="%s" exec %s "%s" "$@" -L "%s"\n' "$FAKELIB" "$BOUNDED" "$SRC/criu/criu" \
	"$T/plugins" >"$T/criu-driver"
chmod +x "$T/criu-plain" "$T/criu-plugin" "$T/criu-driver"
# Started here, in the host's namespaces: one started from criu would live in
# zdtm's.
"$FAKERUN" --start || fail "fakecuda-devd did not start on $FAKECUDA_SOCKET"

exec 9>"$ZT/.cuinterpose-zdtm.lock"
flock -w 1200 9 || fail "another zdtm run holds $ZT/.cuinterpose-zdtm.lock"

# run_zdtm LABEL: every flavor of the matrix with $T/criu-LABEL; writes
# "test flavor result" lines to $T/LABEL.res and checks criu's logs.
run_zdtm() {
	local label=$1 row f args n t log res
	: >"$T/$label.res"
	for row in "${MATRIX[@]}"; do
		f=${row%%:*}
		args=()
		for t in ${row#*:}; do
			n=$(tname "$t")
			args+=(-t "$n")
			rm -rf "${ZT:?}/dump/$n"
		done
		log=$T/$label-$f.log
		(cd "$ZT" && timeout -k 10 600 nice "$PY" zdtm.py run "${args[@]}" -f "$f" -p 2 --keep-going \
			--keep-img always --ignore-taint --criu-bin "$T/criu-$label") >"$log" 2>&1 9>&-
		echo "--- $label, flavor $f: zdtm exited $? ($(($(date +%s) - START)) s)"
		for t in ${row#*:}; do
			n=$(tname "$t")
			if grep -q "Test $n PASS " "$log"; then
				res=PASS
			elif grep -q "Test $n FAIL at " "$log"; then
				res="FAIL($(sed -n "s|.*Test $n FAIL at \(.*[^ #]\) *#*$|\1|p" "$log" | head -n 1 | tr ' ' _))"
			elif grep -q "^Skipping $n " "$log"; then
				res=SKIP
			else
				res=NORESULT
			fi
			echo "$n $f $res" >>"$T/$label.res"
			check_logs "$label" "$n" "$f" "$res"
		done
		for t in ${row#*:}; do
			rm -rf "${ZT:?}/dump/$(tname "$t")"
		done
	done
}

# check_logs LABEL TEST FLAVOR RESULT: the plugin runs loaded the plugin in
# every criu they ran (dump; restore too when the test passed), the plain run
# in none. A problem is recorded in $T/problems; the table comes first.
problem() { echo "$*" >>"$T/problems"; }
check_logs() {
	local d dl rl
	d=$(ls -d "$ZT/dump/$2"/*/1 2>/dev/null | head -n 1)
	dl=$d/dump.log
	rl=$d/restore.log
	if [ -z "$d" ] || [ ! -f "$dl" ]; then
		[ "$4" = PASS ] && problem "$1 run: $2 passed in $3 but left no dump.log under $ZT/dump/$2"
		return
	fi
	if [ "$1" != plain ]; then
		grep -q "cuinterpose: initialized for stage 0" "$dl" ||
			problem "$1 run: $2 ($3): the plugin did not initialize in criu dump"
		if [ "$4" = PASS ]; then
			grep -q "cuinterpose: initialized for stage 2" "$rl" ||
				problem "$1 run: $2 ($3): the plugin did not initialize in criu restore"
		fi
		if [ "$1" = driver ] && grep -q "cuinterpose: cannot load the CUDA driver" "$dl"; then
			problem "$1 run: $2 ($3): the plugin did not load the fake driver $FAKELIB"
		fi
		cp "$dl" "$T/$(echo "$2" | tr / _)-$3-$1-dump.log"
	elif grep -qsE 'Plugin "cuinterpose"|cuinterpose: ' "$dl" "$rl"; then
		problem "$1 run: $2 ($3): criu loaded the plugin without -L"
	fi
}

run_zdtm plugin
run_zdtm driver
# Without the plugin only to tell this machine's failures from the plugin's:
# when every test passed with it, the plain run would show nothing more.
if grep -qv " PASS$" "$T/plugin.res" "$T/driver.res"; then
	run_zdtm plain
else
	echo "--- every test passed with the plugin and with the plugin and the driver: no run without it needed"
	sed 's/ PASS$/ (not-run)/' "$T/plugin.res" >"$T/plain.res"
fi
drop_zdtm_cgroups || problem "zdtm left cgroup hierarchies behind that criu cannot mount (above)"
flock -u 9

# The table, and the verdict.
printf '%-36s %-6s %-18s %-18s %-18s\n' TEST FLAVOR WITHOUT PLUGIN PLUGIN+DRIVER
diff=0 pass=0 rows=0
while read -r n f a && read -r n2 f2 b <&3 && read -r n3 f3 c <&4; do
	[ "$n $f" = "$n2 $f2" ] && [ "$n $f" = "$n3 $f3" ] || fail "result lists out of step ($n $f / $n2 $f2 / $n3 $f3)"
	mark=
	if [ "$a" = "(not-run)" ]; then
		[ "$b" = PASS ] && [ "$c" = PASS ] || { mark=" <-- failed"; diff=$((diff + 1)); }
		pass=$((pass + 1))
	else
		[ "$a" = "$b" ] && [ "$a" = "$c" ] || { mark=" <-- differs"; diff=$((diff + 1)); }
		[ "$a" = PASS ] && pass=$((pass + 1))
	fi
	rows=$((rows + 1))
	printf '%-36s %-6s %-18s %-18s %-18s%s\n' "$n" "$f" "$a" "$b" "$c" "$mark"
done <"$T/plain.res" 3<"$T/plugin.res" 4<"$T/driver.res"
if grep -q "(not-run)" "$T/plain.res"; then
	echo "$rows results, $((rows - diff)) passed in both runs with the plugin, $diff failed; $(($(date +%s) - START)) s"
else
	echo "$rows results, $pass passed without the plugin, $diff differ; $(($(date +%s) - START)) s"
fi

if [ "$pass" = 0 ]; then
	echo "plain run, flavor uns:"
	tail -n 20 "$T/plain-uns.log"
	skip "no zdtm test passed here even without the plugin (zdtm cannot run on this machine)"
fi
echo "the plugin's lines in the dump logs (count, line):"
grep -hs "cuinterpose:" "$T"/*-dump.log | sed 's/^([0-9. ]*) //; s/pid [0-9]*/pid N/' | sort | uniq -c | sort -rn | head -n 6
why=
if [ "$diff" != 0 ]; then
	for f in "$T"/plugin-*.log "$T"/driver-*.log; do
		echo "=== $f"
		grep -E "Error|FAIL|cuinterpose" "$f" | grep -v "Can.t setup RLIMIT_NOFILE for self" | tail -n 40
	done
	why="$diff zdtm results differ with the plugin loaded; "
fi
if [ -s "$T/problems" ]; then
	cat "$T/problems"
	why="$why$(wc -l <"$T/problems") problems in criu's logs (above); "
fi
grep -q NORESULT "$T/plain.res" && why="${why}some zdtm tests gave no result (see the table); "
[ -z "$why" ] || fail "${why%; }"
if grep -q "(not-run)" "$T/plain.res"; then
	echo "PASS: all $rows zdtm results pass with the plugin and with the plugin and the driver"
else
	echo "PASS: all $rows zdtm results are the same without the plugin, with it, and with it and the driver"
fi
