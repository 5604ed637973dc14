# The container case without a container runtime (as t-namespaces-from-
# host.sh): the job runs in its own pid, mount and net namespaces with its
# control sockets in a tmpfs only it sees; CRIU and the plugin run on the
# host. An importer outside the dumped tree is found by the creator's own
# record, wherever its socket is ($T/othersock here), in two places:
#  1. on the host, entering only the job's mount namespace (to reach the
#     creator's socket): the creator cannot see its pid (SO_PEERCRED gives
#     0), the plugin finds it by what it told of itself;
#  2. inside the job's pid namespace but not a descendant of its init
#     (nsenter --pid, like `podman exec`): the creator's pid for it is
#     mapped to the host's through NSpid.
# Each refusal names the creator's and the importer's host pids; the job
# keeps running; once the importers exit the dump and restore go through.
. "$srcdir/lib.sh"
command -v unshare >/dev/null || skip "unshare not found"
command -v nsenter >/dev/null || skip "nsenter not found"
THIEF=$B/test/e2e/e2e_thief
[ -x "$THIEF" ] || skip "e2e_thief not built"
NSINIT=
HOLDER=
cleanup() {
	[ -n "$HOLDER" ] && kill -9 $HOLDER 2>/dev/null
	[ -n "$NSINIT" ] && kill -9 "$NSINIT" 2>/dev/null
	"$FAKERUN" --stop >/dev/null 2>&1
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
mkdir -p "$T/nssock" "$T/othersock"
export CUINTERPOSE_SOCKET_DIR=$T/nssock
"$FAKERUN" --start || fail "fake driver"
# Inside (as t-namespaces-from-host.sh): a /proc of the namespace's own, no
# inherited descriptor, a private tmpfs for the sockets.
cat >"$T/init.sh" <<IN
exec </dev/null >"$T/job.log" 2>&1
for f in /proc/self/fd/*; do n=\${f##*/}; [ "\$n" -gt 2 ] && eval "exec \$n>&-"; done
mount -t tmpfs -o mode=1777 cuip-sock "$T/nssock" || exit 1
exec env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$FAKERUN" "$WORKLOAD" "$T/w" 2
IN
children() { # PID: its children, waiting for the first
	i=0
	while [ -z "$(cat /proc/$1/task/$1/children 2>/dev/null)" ] && [ $i -lt 200 ]; do
		nap 0.05
		i=$((i + 1))
	done
	echo $(cat /proc/$1/task/$1/children 2>/dev/null)
}
host_pid() { # NSPID: the host pid of the job's process known inside as NSPID
	for p in /proc/[0-9]*; do
		[ "$(readlink $p/ns/pid 2>/dev/null)" = "$(readlink /proc/$NSINIT/ns/pid)" ] || continue
		[ "$(awk '/^NSpid/ {print $NF}' $p/status 2>/dev/null)" = "$1" ] && echo ${p#/proc/} && return
	done
}
setsid unshare --pid --mount --net --fork --mount-proc setsid bash "$T/init.sh" </dev/null >/dev/null 2>&1 &
NSINIT=$(children $!)
[ -n "$NSINIT" ] || fail "no namespace init"
wait_ready 2
[ "$JOBPID" = 1 ] || fail "the job's root sees itself as pid $JOBPID, not 1: no pid namespace"
r1=$(host_pid "$(awk '{print $2}' "$T/w/r1.ready")")
[ -n "$r1" ] || fail "no host pid for rank 1"
cmd 2 verify 0
before=$(answers 2)
tfd=$(ls -l /proc/"$r1"/fd | awk '/memfd:cuinterpose-ticket/ {print $9; exit}')
[ -n "$tfd" ] || fail "rank 1 (host pid $r1) holds no ticket"
cat /proc/"$r1"/fd/"$tfd" >"$T/ticket"
JOBPID=$NSINIT

hold() { # OUT NSENTER-ARGS...: start an outside importer; HOLDER: its host pid
	out=$1
	shift
	setsid nsenter -t "$NSINIT" "$@" -- env CUINTERPOSE_SOCKET_DIR=$T/othersock LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" \
		"$THIEF" hold "$T/ticket" </dev/null >"$out" 2>"$out.log" &
	HOLDER=$!
	i=0
	while ! grep -qs "^import: " "$out" && [ $i -lt 400 ]; do
		nap 0.05
		i=$((i + 1))
	done
	grep -q "^import: CUDA_SUCCESS pid " "$out" || fail "the outside importer ($*): $(cat "$out" "$out.log")"
}

refused() { # CASE IMPORTER-HOST-PID
	criu_dump "$T/$1" --network-lock skip && fail "$1: criu dump succeeded while host pid $2 imports the memory"
	grep -Eq "cuinterpose: .*pid $NSINIT allocation [0-9a-f]+:[0-9]+ is imported by pid $2 \(identity [0-9a-f]{16}\), a live process outside the dumped tree" \
		"$T/$1/dump.log" || fail "$1: the refusal does not name the creator $NSINIT and the importer $2: $(grep cuinterpose "$T/$1/dump.log" | tail -5)"
	for p in $NSINIT $r1; do alive $p || fail "$1: pid $p died"; done
	cmd 2 verify 0
	[ "$(answers 2)" = "$before" ] || fail "$1: addresses changed: $(answers 2) vs $before"
}

note "1. importer on the host, only in the job's mount namespace"
hold "$T/host.out" --mount
[ "$(readlink /proc/$HOLDER/ns/pid)" = "$(readlink /proc/self/ns/pid)" ] || fail "the host importer is not in the host's pid namespace"
ls "$T/othersock" | grep -q "^$HOLDER-" || fail "the host importer's socket is not in $T/othersock: $(ls "$T/othersock")"
refused d1 $HOLDER
kill $HOLDER
HOLDER=

note "2. importer in the job's pid namespace, not in the dumped tree"
hold "$T/ns.out" --mount --pid
in=$(children $HOLDER)
[ -n "$in" ] || fail "no importer under nsenter"
[ "$(readlink /proc/$in/ns/pid)" = "$(readlink /proc/$NSINIT/ns/pid)" ] || fail "the importer is not in the job's pid namespace"
refused d2 "$in"
kill $in
wait $HOLDER 2>/dev/null
HOLDER=
wait_gone $in || fail "the importer $in did not exit"

note "the importers exited: dump and restore"
criu_dump "$T/d3" --network-lock skip || fail "criu dump after the importers exited: $(grep cuinterpose "$T/d3/dump.log" | tail -5)"
wait_gone "$NSINIT" || fail "the dumped namespace is still alive"
NSINIT=
criu_restore "$T/d3" --root / --network-lock skip --pidfile "$T/init.pid" || fail "criu restore of the namespaces"
NSINIT=$(cat "$T/init.pid")
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "addresses changed: $(answers 2) vs $before"
cmd 2 write 1 1
cmd 2 verify 1
cmd 2 exit
note done
