# A process of the dumped tree that holds an io_uring instance (a torchrun
# worker maps one through libuv; CRIU 4.2.1 cannot dump it and finds out
# only after the native checkpoint): the plugin refuses the dump at
# discovery, naming the process and what it holds, before anything changes.
# - the tree's root maps an io_uring ring: criu dump fails, dump.log says
#   "dump refused: pid P (e2e_uring) maps an io_uring ring at 0x..", no
#   participant was quiesced and no process was locked, the job answers with
#   its bytes and addresses, its descriptors and mappings unchanged;
# - the same with only the instance's descriptor ("as fd N");
# - once the root closes the instance, the same tree dumps and restores with
#   every byte and address intact (the refusal is about io_uring alone).
. "$srcdir/lib.sh"

N=2
URING=$B/test/e2e/e2e_uring
[ -x "$URING" ] || fail "e2e_uring not built ($URING)"

# start_uring [--fd-only]: the job under e2e_uring, JOBPID its root
start_uring() {
	rm -f "$T"/w/*
	setsid env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$FAKERUN" "$URING" "$T/w" "$@" "$WORKLOAD" "$T/w" $N \
		</dev/null >"$T/job.log" 2>&1 &
	JOB=$!
	waiting "e2e_uring to set up its io_uring instance"
	for _ in $(seq 200); do
		[ -s "$T/w/uring.ready" ] && break
		alive "$JOB" || break
		nap 0.05
	done
	waited
	if [ ! -s "$T/w/uring.ready" ]; then
		grep -q "^io_uring: " "$T/job.log" && skip "this kernel refuses io_uring_setup: $(grep -m1 '^io_uring: ' "$T/job.log")"
		fail "e2e_uring did not start: $(cat "$T/job.log")"
	fi
	wait_ready $N
	read -r _ ROOT _ UFD _ <"$T/w/uring.ready"
	JOBPID=$ROOT
}

# refused DIR WHAT: the dump is refused at discovery for WHAT, and nothing
# of the job changed
refused() {
	local d=$1 what=$2 comm

	census_keep 5
	note "dump, refused: $what"
	criu_dump "$d" && fail "criu dumped a tree that holds an io_uring instance"
	comm=$(cat /proc/$ROOT/comm)
	grep -qE "cuinterpose: dump refused: pid $ROOT \($comm\) $what, which criu cannot dump" "$d/dump.log" ||
		fail "no refusal naming pid $ROOT and /$what/ in dump.log"
	grep -q "nothing was changed, the job keeps running" "$d/dump.log" || fail "the refusal does not say nothing changed"
	grep -q "QUIESCE\|NATIVE Lock\|cuCheckpointProcessLock" "$d/dump.log" &&
		fail "the dump went on past discovery: $(grep -m3 "QUIESCE\|NATIVE Lock\|cuCheckpointProcessLock" "$d/dump.log")"
	alive "$ROOT" || fail "the tree's root died"
	cmd $N verify 1
	[ "$(answers $N)" = "$before" ] || fail "addresses changed after the refusal: $(answers $N) vs $before"
	census_back 5 "after the refused dump"
}

start_uring
cmd $N write 1 1
cmd $N verify 1
before=$(answers $N)
refused "$T/d1" "maps an io_uring ring at 0x[0-9a-f]+-0x[0-9a-f]+"
range=$(sed -n 's/.*maps an io_uring ring at 0x\([0-9a-f]*\)-0x\([0-9a-f]*\),.*/\1-\2/p' "$T/d1/dump.log" | head -n 1)
grep -q "^$range .*anon_inode:\[io_uring\]" /proc/$ROOT/maps ||
	fail "the refusal names $range, which is not an io_uring mapping of pid $ROOT: $(grep io_uring /proc/$ROOT/maps)"

note "the root closes its instance"
kill -USR1 "$ROOT"
wait_line "$T/w/uring.closed" closed
grep -q "anon_inode:\[io_uring\]" /proc/$ROOT/maps && fail "the ring is still mapped"
note "dump and restore without it"
pids="$ROOT $(job_pids)"
criu_dump "$T/d2" || fail "criu dump after the instance was closed"
wait_gone $pids || fail "dumped processes still alive"
criu_restore "$T/d2" || fail "criu restore"
cmd $N verify 1
[ "$(answers $N)" = "$before" ] || fail "addresses changed across the dump and restore"
cmd $N exit
kill -9 $pids 2>/dev/null

note "only the descriptor"
start_uring --fd-only
cmd $N write 1 1
cmd $N verify 1
before=$(answers $N)
refused "$T/d3" "holds an io_uring instance as fd $UFD"
cmd $N exit
note done
