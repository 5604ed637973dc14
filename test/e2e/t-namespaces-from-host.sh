# The container case without a container runtime: the job runs in its own
# pid, mount and net namespaces (unshare), with its control sockets in a
# tmpfs mounted only inside (the host sees an empty directory), and CRIU on
# the host dumps the namespace's init by its host pid and restores it
# (--root / for the mount namespace, --network-lock skip: no iptables
# here). The plugin must find the sockets through sock_diag and
# /proc/PID/root; `cuinterpose inspect` and `cuinterpose show` work from the
# host; bytes and addresses are verified after the restore.
. "$srcdir/lib.sh"
command -v unshare >/dev/null || skip "unshare not found"
CLI=$B/cli/cuinterpose
NSINIT=
cleanup() {
	[ -n "$NSINIT" ] && kill -9 "$NSINIT" 2>/dev/null
	"$FAKERUN" --stop >/dev/null 2>&1
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
mkdir -p "$T/nssock"
export CUINTERPOSE_SOCKET_DIR=$T/nssock
"$FAKERUN" --start || fail "fake driver"
# Inside: a /proc of the namespace's own (LeakSanitizer reads
# /proc/<its pid>: through the /proc of an outer pid namespace that is
# another process), no descriptor from the host's mount namespace may stay
# open (CRIU cannot name its mount), a private tmpfs for the sockets, then
# the job as the namespace's init and session leader.
cat >"$T/init.sh" <<IN
exec </dev/null >"$T/job.log" 2>&1
for f in /proc/self/fd/*; do n=\${f##*/}; [ "\$n" -gt 2 ] && eval "exec \$n>&-"; done
mount -t tmpfs -o mode=1777 cuip-sock "$T/nssock" || exit 1
exec env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$FAKERUN" "$WORKLOAD" "$T/w" 2
IN
host_init() { # the host pid of the namespace's init: unshare's child
	i=0
	while [ -z "$(cat /proc/$1/task/$1/children 2>/dev/null)" ] && [ $i -lt 100 ]; do
		nap 0.05
		i=$((i + 1))
	done
	echo $(cat /proc/$1/task/$1/children)
}
setsid unshare --pid --mount --net --fork --mount-proc setsid bash "$T/init.sh" </dev/null >/dev/null 2>&1 &
NSINIT=$(host_init $!)
[ -n "$NSINIT" ] || fail "no namespace init"
wait_ready 2
[ "$JOBPID" = 1 ] || fail "the job's root sees itself as pid $JOBPID, not 1: no pid namespace"
[ -z "$(ls "$T/nssock")" ] || fail "the sockets are visible on the host: $(ls "$T/nssock")"
[ "$(readlink /proc/$NSINIT/ns/net)" != "$(readlink /proc/self/ns/net)" ] || fail "same net namespace"
"$CLI" inspect "$NSINIT" >"$T/inspect.txt" || fail "inspect from the host: $(cat "$T/inspect.txt")"
grep -q "^process 1 .*phase ACTIVE" "$T/inspect.txt" || fail "inspect: $(head -3 "$T/inspect.txt")"
cmd 2 verify 0
before=$(answers 2)

note dump
JOBPID=$NSINIT
criu_dump "$T/d1" --network-lock skip || fail "criu dump of the namespaces"
# Both carry (private memory too, by default): 18 + 6 MiB and 6 MiB.
grep -q "cuinterpose: SAVE: 2 participants, 7 records, 31457280 bytes" "$T/d1/dump.log" ||
	fail "no SAVE line (2 participants, 7 records, 31457280 bytes) in dump.log"
wait_gone "$NSINIT" || fail "the dumped namespace is still alive"
NSINIT=
"$CLI" show "$T/d1" >"$T/show.txt" || fail "cuinterpose show: $(tail -5 "$T/show.txt")"
grep -q "2 participants" "$T/show.txt" || fail "show: participants"
grep -q "^OK: every image decodes" "$T/show.txt" || fail "show: verdict"

# criu killed inside its restore, before RESUME_DEVICES_LATE, with the
# tree in a new pid namespace (its pids there are the images', not ours):
# the guardian knows that namespace's init as criu's child (or, when criu
# dies first, finds it by its namespace) and kills it, and with it the
# namespace; nothing of it is left.
glog=$T/d1/cuinterpose-guardian.log
# other_pidns: every process in a pid namespace other than ours (pid,
# NSpid, state, comm), for a failure: whether a restored tree was left
other_pidns() {
	local p me

	me=$(readlink /proc/self/ns/pid)
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/ns/pid" 2>/dev/null)" = "$me" ] && continue
		echo "${p#/proc/} [$(awk '/^NSpid/ {$1 = ""; print}' "$p/status" 2>/dev/null)] $(stat_state "${p#/proc/}") $(cat "$p/comm" 2>/dev/null);"
	done
}
killed_in_pidns() { # WHAT LOG [child]
	local g x
	g=$(sed -n 's/.*guardian pid \([0-9]*\) watches this restore.*/\1/p' "$T/d1/$2" | head -n1)
	[ -n "$g" ] || fail "$1: no guardian: $(grep "cuinterpose: \|Error" "$T/d1/$2" | tail -n 5)"
	for _ in $(seq 1200); do
		live "$g" || break
		nap 0.05
	done
	grep -q "restored tree killed [0-9.]* s after criu was lost" "$glog" || fail "$1: no verdict: $(cat "$glog" 2>&1)"
	x=$(sed -n 's/.*the restored tree is the pid namespace of pid \([0-9]*\) (pid 1 there[,)].*/\1/p' "$glog")
	[ -n "$x" ] || fail "$1: the guardian did not find the namespace's init: $(cat "$glog")
processes in other pid namespaces now: $(other_pidns)"
	# criu's child since the forking stage: known as such, whatever else
	# the namespace holds
	[ "${3:-}" != child ] || grep -q "of pid $x (pid 1 there, criu's child)" "$glog" ||
		fail "$1: the init was not known as criu's child: $(cat "$glog")"
	grep -q "killed pid $x " "$glog" || fail "$1: pid $x not killed: $(cat "$glog")"
	live "$x" &&
		fail "$1: the namespace's init $x still runs after the verdict"
	echo "$1: $(grep -h "the restored tree is\|restored tree killed" "$glog" | sed 's/.*(criu [0-9]*): //' | tr '\n' ' ')"
	rm -f "$glog"
}
note "restore killed at post-forking, in a new pid namespace"
CUINTERPOSE_TEST_FAULT=kill@post-forking criu_restore "$T/d1" --root / --network-lock skip -o restore-k1.log \
	>"$T/rk1.out" 2>&1 && fail "kill@post-forking: criu restore succeeded"
killed_in_pidns kill@post-forking restore-k1.log
note "restore killed with the tasks in CRIU's restorer, in a new pid namespace"
criu_restore "$T/d1" --root / --network-lock skip -o restore-k2.log >"$T/rk2.out" 2>&1 &
restorer=$!
wait_line "$T/d1/restore-k2.log" "Restore via sigreturn"
c=$(criu_main "$T/d1" restore) && kill -9 "$c"
wait $restorer && fail "killed in the restorer: criu restore succeeded"
killed_in_pidns "killed in the restorer" restore-k2.log child

note restore
criu_restore "$T/d1" --root / --network-lock skip --pidfile "$T/init.pid" || fail "criu restore of the namespaces"
NSINIT=$(cat "$T/init.pid")
grep -q "RESUME_DEVICES_LATE done: 2 participants rebuilt" "$T/d1/restore.log" || fail "no completion line"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "addresses changed: $(answers 2) vs $before"
cmd 2 write 1 1
cmd 2 verify 1
cmd 2 exit
note done
