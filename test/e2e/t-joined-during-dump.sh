# A process that joins the tree while the plugin prepares it (after its
# discovery, before CRIU freezes it): with the interposer and without CUDA
# it is an ordinary process (it could not begin CUDA: the start gate is
# held) and the dump passes; a new CUDA process without the interposer is
# refused, naming it, and the job is rolled back and keeps running. The
# moment is made by holding rank 3 inside cuInit: the plugin waits for it.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

# spawn_during_dump KIND DIR [criu args]; criu's exit status in $CRC
spawn_during_dump() {
	local kind=$1 d=$2 s cpid

	shift 2
	rm -f "$T/w/hold" "$T/w/hold.held"
	post cuda 3 0
	s=$SEQ
	for r in 0 1 2; do answered $r $s; done
	wait_file "$T/w/hold.held"
	criu_dump "$d" "$@" &
	cpid=$!
	wait_line "$d/dump.log" "pid $(rank_pid 3) \(e2e_proc\) is starting CUDA: waiting"
	post spawn "$kind"
	answered 0
	wait_file "$T/w/spawned$kind.ready"
	SPAWNED=$(awk '{print $2}' "$T/w/spawned$kind.ready")
	touch "$T/w/hold"
	CRC=0
	wait $cpid || CRC=$?
	answered 3 $s
}

note "a preloaded child without CUDA joins during the dump"
start_proc 4 --held
spawn_during_dump 0 "$T/d1" --leave-running
[ $CRC = 0 ] || fail "criu dump with a preloaded child joining during it"
has_line "$T/d1/dump.log" "pid $SPAWNED \([^)]*\) joined the tree after discovery; it maps the interposer but has not initialized CUDA: an ordinary process" \
	"the joining child is not named"
alive $SPAWNED || fail "the joining child died"
cmd 4 verify 0
cmd 4 exit
wait_gone $(job_pids)

note "a CUDA process without the interposer joins during the dump"
SEQ=0
start_proc 4 --held
spawn_during_dump 1 "$T/d2"
[ $CRC = 0 ] && fail "criu dump passed with a CUDA process joining during it"
has_line "$T/d2/dump.log" "pid $SPAWNED \([^)]*\) joined the tree after cuinterpose prepared it and uses CUDA; checkpoint again" \
	"the refusal does not name the joining process"
has_line "$T/d2/dump.log" "in-place restore complete" "the job was not rolled back"
for p in $(job_pids) $SPAWNED; do alive $p || fail "pid $p died"; done
cmd 4 write 0 3
cmd 4 verify 3
cmd 4 exit
note done
