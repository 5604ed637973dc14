# Memory a job reserved but never wrote (E2E_RESERVED_MB: a 48 MiB
# cuMemAlloc per process, as a framework's cache keeps) costs no disk: its
# bytes in the carrier images are holes, each process's carrier file is
# stored in at least 48 MiB fewer bytes than its size, and the interposer
# counts them ("zero bytes left as holes"). The restore reads them back as
# zeros (the job checks every reserved byte) and every written byte and
# address is back. A second cycle dumps into the same directory over the
# first images: their old bytes never show through the holes.
. "$srcdir/lib.sh"

RESV=48
need_holes

export E2E_RESERVED_MB=$RESV
CUINTERPOSE_LOG=2 start_job 2 --private
cmd 2 verify 0
before=$(answers 2)

# apparent FILE: its size (stored FILE, lib.sh: the bytes it takes)
apparent() { stat -c %s "$1"; }
check_holes() { # DIR CYCLE
	local n=0 f a s
	for f in "$1"/cuinterpose-carrier-*.img; do
		[ -f "$f" ] || continue
		n=$((n + 1))
		a=$(apparent "$f") s=$(stored "$f")
		[ $((a - s)) -ge $((RESV << 20)) ] ||
			fail "cycle $2: $(basename "$f"): $a bytes, $s stored: the $RESV MiB never written were written"
	done
	[ $n = 2 ] || fail "cycle $2: $n carrier files, not 2"
}

for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	criu_dump "$T/d" || fail "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	check_holes "$T/d" $cycle
	note "cycle $cycle: restore"
	criu_restore "$T/d" || fail "criu restore (cycle $cycle)"
	cmd 2 verify 0
	[ "$(answers 2)" = "$before" ] || fail "cycle $cycle: answers differ: $(answers 2) vs $before"
done
holes=$(grep -ho "[0-9]* zero bytes left as holes" "$T/job.log" | awk '$1 >= '$((RESV << 20))' {n++} END {print n + 0}')
[ "$holes" -ge 2 ] || fail "no SAVE line counts the $RESV MiB of holes: $(grep -h 'left as holes' "$T/job.log" | head -n 2)"
cmd 2 exit
note done
