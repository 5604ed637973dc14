# The Debian packages as a user builds and installs them (issue 29): from a
# copy of the tree (tracked and new files, as `git status` sees them),
# `dpkg-buildpackage -us -uc -b` with Debian's own tooling, lintian with no
# error, then both packages installed with dpkg into a clean root
# (debootstrap's minimal base that contrib/install-deps.sh keeps, holding
# nothing of cuinterpose; CRIU 4.2.1 copied in, as a user installs it),
# where the demo job runs against the installed files only: cuinterpose run,
# inspect and show, plain criu dump and restore through the plugin in
# /usr/lib/criu, on the fake driver of cuinterpose-fakecuda, every byte,
# address and pid compared. Then the packages are removed and nothing of
# them is left in the root. The root runs in a pid and mount namespace of
# its own; nothing is mounted on the host.
set -u
# skip, fail, note and the failure report of the other tests (lib.sh's
# first part: this test sets up its own $T)
LIB_REPORT_ONLY=1 . "${srcdir:-.}/../e2e/lib.sh"
top=$(cd "${srcdir:-.}/../.." && pwd)
[ "$(id -u)" = 0 ] || skip "needs root (chroot, mounts, dpkg in the root)"
# The package is built without sanitizers whatever this build is; the plain
# pass runs it.
[ "${SANITIZE:-}" = yes ] && skip "sanitizer build: the packages are built without sanitizers (the plain build runs this test)"
ROOT=${CUINTERPOSE_CLEAN_ROOT:-/var/cache/cuinterpose-deps/clean-root}
for t in dpkg-buildpackage lintian unshare chroot; do
	command -v $t >/dev/null || fail "$t not found: run contrib/install-deps.sh"
done
[ -f "$ROOT/.cuinterpose-root" ] || fail "no clean root in $ROOT: run contrib/install-deps.sh"
CRIU_BIN=${CRIU:-/usr/local/sbin/criu}
[ -x "$CRIU_BIN" ] || fail "no criu at $CRIU_BIN"
T=$(mktemp -d /tmp/cuip-deb.XXXXXX)
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi; }

note "dpkg-buildpackage -us -uc -b in a copy of the tree"
mkdir -p "$T/src"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
	(cd "$top" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$T/src") ||
		fail "copying the tree"
else
	cp -a "$top/." "$T/src/"
fi
[ -f "$T/src/debian/control" ] || fail "no debian/control in the tree"
(cd "$T/src" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" timeout 1200 dpkg-buildpackage -us -uc -b) \
	>"$T/build.log" 2>&1 || {
	tail -n 30 "$T/build.log"
	fail "dpkg-buildpackage failed (or took over 1200 s)"
}
deb=$T/cuinterpose_0.1.0_amd64.deb fake=$T/cuinterpose-fakecuda_0.1.0_amd64.deb
[ -f "$deb" ] && [ -f "$fake" ] || fail "packages not built: $(ls "$T")"
dpkg -c "$deb" >"$T/deb.list" && dpkg -c "$fake" >"$T/fake.list" || fail "dpkg -c cannot list the packages"
for f in usr/bin/cuinterpose usr/bin/cuinterpose-example usr/lib/libcuinterpose.so \
	usr/lib/criu/cuinterpose_plugin.so usr/share/man/man1/cuinterpose.1.gz; do
	grep -q " \./$f\$" "$T/deb.list" || fail "cuinterpose package lacks /$f"
done
grep -q " \./usr/lib/cuinterpose/fakecuda/fakecuda-run\$" "$T/fake.list" || fail "fake package lacks fakecuda-run"
grep -q "fakecuda" "$T/deb.list" && fail "the cuinterpose package holds the fake driver"
grep -E "\.la$|/usr/local/" "$T/deb.list" "$T/fake.list" && fail "libtool archives or /usr/local paths in the packages"

note "lintian"
timeout 600 lintian --fail-on error "$T"/cuinterpose_0.1.0_amd64.changes >"$T/lintian.log" 2>&1 || {
	cat "$T/lintian.log"
	fail "lintian reports errors (or took over 600 s)"
}
grep "^W:" "$T/lintian.log" | sed 's/^/  /'

note "install into a clean root"
R=$T/root
cp -a "$ROOT" "$R" || fail "copying the clean root"
[ -e "$R/usr/bin/cuinterpose" ] || [ -e "$R/usr/lib/criu/cuinterpose_plugin.so" ] && fail "the clean root holds cuinterpose"
install -D -m 755 "$CRIU_BIN" "$R/usr/local/sbin/criu"
install -D -m 755 "$top/contrib/demo-job.sh" "$R/opt/demo/demo-job.sh"
install -D -m 755 "$top/contrib/bounded" "$R/opt/demo/bounded"
install -D -m 644 "$top/test/e2e/procstate.sh" "$R/opt/demo/procstate.sh"
install -D -m 755 "${top_builddir:?}/test/e2e/e2e_reaper" "$R/opt/demo/e2e_reaper"
cp "$deb" "$fake" "$R/tmp/"
# in the root, in a pid and mount namespace of its own: the root bound on
# itself (criu finds the parent of every mount under it), /proc of that
# namespace, the host's /dev and /sys (its /tmp is the root's own); no
# descriptor of the harness's (criu cannot dump a file on a mount outside)
inroot() {
	timeout -k 5 "$1" unshare --pid --mount --fork --propagation private /bin/bash -c '
		r=$1; shift
		for f in /proc/self/fd/*; do n=${f##*/}; [ "$n" -gt 2 ] && eval "exec $n>&-"; done 2>/dev/null
		mount --bind "$r" "$r" && mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" &&
			mount -t sysfs sys "$r/sys" && exec chroot "$r" "$@"' bash "$R" "${@:2}"
}
inroot 300 dpkg -i /tmp/cuinterpose_0.1.0_amd64.deb /tmp/cuinterpose-fakecuda_0.1.0_amd64.deb >"$T/dpkg.log" 2>&1 || {
	cat "$T/dpkg.log"
	fail "dpkg -i in the clean root failed (or took over 300 s)"
}
inroot 30 dpkg -s cuinterpose cuinterpose-fakecuda 2>&1 | grep -c "^Status: install ok installed" | grep -qx 2 ||
	fail "the packages are not installed: $(inroot 30 dpkg -s cuinterpose cuinterpose-fakecuda 2>&1 | grep Status)"
inroot 30 cuinterpose --help >/dev/null 2>&1 || fail "cuinterpose --help in the root"
inroot 30 man -w cuinterpose >/dev/null 2>&1 || [ -f "$R/usr/share/man/man1/cuinterpose.1.gz" ] || fail "no manual page"

note "the demo job against the installed files"
inroot 600 /opt/demo/e2e_reaper /bin/bash /opt/demo/demo-job.sh /nonexistent >"$T/demo.log" 2>&1
rc=$?
sed 's/^/  /' "$T/demo.log" | tail -n 25
[ $rc = 0 ] || fail "the demo in the clean root failed (exit $rc)"
grep -q "no NVIDIA GPU: running on the fake CUDA driver" "$T/demo.log" || fail "the demo did not use the installed fake driver"
grep -q "^demo: 4 processes sharing GPU memory checkpointed and restored: same pids, addresses and bytes; no socket left$" \
	"$T/demo.log" || fail "the demo's verdict is missing"
grep -q "cuinterpose: SAVE: " "$R/tmp/cuinterpose-demo/img/dump.log" || fail "no SAVE line: the plugin in /usr/lib/criu did not run"

note "dpkg --purge: nothing of the packages is left"
inroot 120 dpkg --purge cuinterpose cuinterpose-fakecuda >"$T/purge.log" 2>&1 || {
	cat "$T/purge.log"
	fail "dpkg --purge failed"
}
for f in usr/bin/cuinterpose usr/bin/cuinterpose-example usr/lib/libcuinterpose.so usr/lib/criu/cuinterpose_plugin.so \
	usr/lib/cuinterpose usr/share/doc/cuinterpose; do
	[ -e "$R/$f" ] && fail "/$f left after purge"
done
note done
